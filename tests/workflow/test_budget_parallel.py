"""`token_budget.limit` is the tokens of the whole sprint. With `max_concurrent_slaves` > 1 each Slave compared
only its own tokens (and those of the batches ended before it started) with the limit, and the Master checked
only when a batch ended: parallel batches ran on long past the sprint's budget (all their stories). The Master
now adds up the running batches' tokens too: past the limit they finish the story in hand and start no other."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import bso_worker
from tests.workflow.helpers import make_project, sprint_input, start_sprint, sprint_result
from workflows.sprint_master import SprintMasterWorkflow

KEYS = [f"1-{n}-story-{n}" for n in range(1, 13)]


async def test_parallel_batches_keep_to_the_sprint_token_budget(ts_env, tmp_path: Path):
    make_project(tmp_path, {k: "ready-for-dev" for k in KEYS})
    inp = sprint_input(
        tmp_path,
        session_id="budget-parallel",
        config_overrides={
            # Two batches of 6 stories at once, 12,000 tokens each: under the limit alone, far past it together.
            "batch_size": 6,
            "max_concurrent_slaves": 2,
            "token_budget.limit": 13_000,
            "token_budget.action": "stop",
        },
        simulation={"default": {"tokens": 1000, "duration_ms": 1000}},  # a dev and a review: 2,000 a story, 2 s
    )
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, inp)
        report = await sprint_result(handle)
        status = await handle.query(SprintMasterWorkflow.status)
    done = [k for k, v in report.stories.items() if v == "done"]
    # 13,000 tokens are spent 3.25 stories into each batch: with the story in hand, 8 (10 on a slow machine).
    assert len(done) <= 10, f"{len(done)} stories ran on a 13,000 budget: {report.tokens_used} tokens used"
    assert any("token budget exhausted" in e for e in status.errors), status.errors


async def test_no_batch_starts_once_the_masters_count_is_exhausted(ts_env, tmp_path: Path):
    """The first running batch to end left the ended batches' tokens under the limit: the Master neither paused
    nor stopped, and started the next queued batch, a story past the budget it had counted."""
    make_project(tmp_path, {"1-1-a": "ready-for-dev", "1-2-b": "ready-for-dev", "1-3-c": "ready-for-dev"})
    inp = sprint_input(
        tmp_path,
        session_id="budget-new-batch",
        config_overrides={
            "batch_size": 1,
            "max_concurrent_slaves": 2,
            "token_budget.limit": 2500,
            "token_budget.action": "stop",
        },
        simulation={
            "default": {"tokens": 100, "duration_ms": 500},
            "stories": {
                # batch 1: dev at 1.5 s, review at 3 s: 1,000 in all (alone under the limit)
                "1-1-a": {"tokens": 500, "duration_ms": 1500},
                # batch 2: dev, review (HIGH), fix, review: 800 a call each second: 2,400 at 3 s, 3,200 at 4 s
                "1-2-b": {"tokens": 800, "duration_ms": 1000, "review": ["HIGH", "none"]},
            },
        },
    )
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, inp)
        report = await sprint_result(handle)
    # batch 3 (1-3-c) was queued when the Master's count passed 2,500 (2,600 at 1-1-a's review): it must not start.
    assert report.stories["1-3-c"] != "done", (
        f"1-3-c ran after the Master's count passed the budget: {report.stories}, {report.tokens_used} tokens, "
        f"{report.errors}"
    )
