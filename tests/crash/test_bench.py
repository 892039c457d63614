"""The benchmark's machinery (bench/run.py), run small: the figures it prints come from real runs of BSO,
the baseline and the skeleton on the dev server, and every column of its table is filled. It checks no
speed: `make bench` measures that."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.run import markdown, run

pytestmark = pytest.mark.e2e


async def test_a_small_benchmark_measures_every_figure(tmp_path: Path):
    result = await run([12], 2, tmp_path, repeat=2, workers=2, batch_size=5, profile=True)
    (row,) = result["rows"]
    bso = row["bso"]
    assert bso["dispatches"] == 12  # one review per story, each story done
    assert bso["batches"] == 3  # 12 stories in batches of 5
    # Every dispatch measured: a batch's first story is ready when the Slave's status load is done.
    assert bso["answer_to_state_written_ms"]["n"] == 12 and bso["ready_to_agent_started_ms"]["n"] == 12
    # The write is done in the worker before its marker reaches history, with the workflow task's end.
    assert bso["answer_to_state_recorded_ms"]["n"] == 12
    assert bso["answer_to_state_written_ms"]["p50"] < bso["answer_to_state_recorded_ms"]["p50"]
    assert bso["times_from_history"] == 0  # every write and load timed by its own clock reading
    assert bso["slave_workflow_tasks_per_story"] >= 1  # at least one Slave workflow task per dispatch
    assert row["baseline_parallel"]["step_ms"]["n"] > 0 and row["baseline_sequential"]["step_ms"]["n"] == 11
    skeleton = row["skeleton"]
    assert skeleton["step_ms"]["n"] == 12 - 2  # a step between consecutive stories of each of the 2 lanes
    assert skeleton["workflow_tasks_per_story"] >= 1  # one per story: the activity's result, then the write
    assert len(row["ratios"]) == 2 and row["ratio"] in row["ratios"]
    assert row["skeleton_ratio"] == round(bso["dispatches_per_second"] / skeleton["stories_per_second"], 3)
    table = markdown(result)
    assert "batch_size 5," in table.splitlines()[0]
    header, rule, line = table.splitlines()[2:5]
    assert header.count("|") == rule.count("|") == line.count("|")
    assert "None" not in line
    # Two worker processes each for BSO and for the baseline: the CPU of each is measured.
    measured = {"server", "worker-1", "worker-2"}
    assert set(bso["cpu_seconds"]) == set(row["baseline_parallel"]["cpu_seconds"]) == measured
    assert "2 worker process(es)" in table
    # Failed workflow tasks are listed with their causes, apart from signals racing a workflow's end.
    failures, races = bso["workflow_task_failures"], bso["unhandled_command_races"]
    assert isinstance(failures, list) and isinstance(races, int)
    assert f"N = 12: {len(failures)} failed workflow task(s), {races} signal(s) racing" in table
    # --profile: one sprint more, its worker sampled by py-spy; the table says where its CPU went.
    profile = result["profile"]
    assert profile["n"] == 12 and profile["samples"] > 0, profile
    assert any("workers/main.py" in h["function"] for h in profile["hotspots"]), profile["hotspots"]
    assert profile["running_itself"] and "The functions that ran most themselves:" in table
    assert f"Where the BSO worker's CPU goes (py-spy, the thread holding the GIL; N = 12, {profile['samples']} samples" in table
