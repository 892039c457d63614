"""Patches folded into one marker per run.

The first `workflow.patched(id)` call of a run records a marker and, through sdk-core, upserts the
`TemporalChangeVersion` search attribute: two events and a visibility write on the server for every patch a run
meets. A Slave met seven in every batch, 0.7 of each per story at batch_size 10, and on the dev server those
upserts cost more CPU than any other event of the batch. A rollup folds the patches named before it: a run whose
first workflow task recorded the rollup takes every folded patch as applied and records nothing more for them; a
run recorded before the rollup existed (no such marker in its first task) asks each patch as it did.
"""

from __future__ import annotations

from dataclasses import dataclass

from temporalio import workflow


@dataclass(frozen=True)
class PatchRollup:
    id: str
    folded: frozenset[str]

    def decide(self) -> None:
        """Called in the run's first workflow task: the SDK keeps the answer for the run, so a run that started
        before the rollup existed never takes it up half-way (its later tasks would skip patches its earlier
        ones had found missing)."""
        workflow.patched(self.id)

    def patched(self, patch_id: str) -> bool:
        """`workflow.patched(patch_id)`, true without a marker of its own where the run has the rollup."""
        return (patch_id in self.folded and workflow.patched(self.id)) or workflow.patched(patch_id)
