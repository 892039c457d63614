"""Patches folded into one marker per run.

The first `workflow.patched(id)` call of a run records a marker and, through sdk-core, upserts the
`TemporalChangeVersion` search attribute: two events and a visibility write on the server for every patch a run
meets. A Slave met seven in every batch, 0.7 of each per story at batch_size 10, and on the dev server those
upserts cost more CPU than any other event of the batch. A rollup folds the patches named before it: a run whose
first workflow task recorded the rollup takes every folded patch as applied and records nothing more for them; a
run recorded before the rollup existed (no such marker in its first task) asks each patch as it did.

A later rollup folds the earlier one's patches and its own, and names the earlier one as `previous`: a new run
records only the latest marker; a run recorded with an earlier rollup keeps that one's patches, and no more.
"""

from __future__ import annotations

from dataclasses import dataclass

from temporalio import workflow


@dataclass(frozen=True)
class PatchRollup:
    id: str
    folded: frozenset[str]
    previous: PatchRollup | None = None

    def decide(self) -> None:
        """Called in the run's first workflow task: the SDK keeps the answer for the run, so a run that started
        before the rollup existed never takes it up half-way (its later tasks would skip patches its earlier
        ones had found missing)."""
        self._recorded()

    def _recorded(self) -> PatchRollup | None:
        """The latest rollup the run recorded: this one, or (a run recorded before it) an earlier one; asked
        newest first, so a new run records this one only."""
        if workflow.patched(self.id):
            return self
        return self.previous._recorded() if self.previous is not None else None

    def patched(self, patch_id: str) -> bool:
        """`workflow.patched(patch_id)`, true without a marker of its own where the run has a rollup folding it."""
        rollup = self._recorded()
        return (rollup is not None and patch_id in rollup.folded) or workflow.patched(patch_id)
