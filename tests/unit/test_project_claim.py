"""One sprint at a time on a project: the claim the Master's first status load makes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from activities.session_files import ProjectBusyError, claim_project, recorded_running_sprint


def running(*sprint_ids: str):
    async def is_running(sprint_id: str, first_run_id: str | None = None) -> bool:
        await asyncio.sleep(0.01)  # a server round trip: the other claim gets its chance to interleave
        return sprint_id in sprint_ids

    return is_running


async def test_a_free_project_is_claimed_and_recorded(tmp_path: Path):
    await claim_project(str(tmp_path), "sprint-a", "run-1", running())
    assert recorded_running_sprint(str(tmp_path)) == "sprint-a"
    record = json.loads((tmp_path / ".sprint-session/running-sprint.json").read_text())
    assert record["run_id"] == "run-1"


async def test_a_running_sprints_claim_is_refused_and_kept(tmp_path: Path):
    await claim_project(str(tmp_path), "sprint-a", "run-1", running())
    with pytest.raises(ProjectBusyError, match=f"sprint sprint-a is already running on {tmp_path}"):
        await claim_project(str(tmp_path), "sprint-b", "run-2", running("sprint-a"))
    assert recorded_running_sprint(str(tmp_path)) == "sprint-a"


async def test_an_ended_sprints_claim_is_taken_over_and_the_same_sprint_claims_again(tmp_path: Path):
    await claim_project(str(tmp_path), "sprint-a", "run-1", running())
    await claim_project(str(tmp_path), "sprint-b", "run-2", running())  # sprint-a has ended
    assert recorded_running_sprint(str(tmp_path)) == "sprint-b"
    await claim_project(str(tmp_path), "sprint-b", "run-3", running("sprint-b"))  # a retry, or its id used again
    assert recorded_running_sprint(str(tmp_path)) == "sprint-b"


async def test_of_claims_at_once_exactly_one_wins(tmp_path: Path):
    """Each claim asks the server whether the recorded sprint (one that has ended) still runs: without the lock
    they would all read it, all hear "no" and all claim."""
    await claim_project(str(tmp_path), "sprint-ended", "run-0", running())
    claimed: list[str] = []

    async def is_running(sprint_id: str, first_run_id: str | None = None) -> bool:
        await asyncio.sleep(0.01)
        return sprint_id in claimed

    async def claim(sprint_id: str) -> str:
        try:
            await claim_project(str(tmp_path), sprint_id, "run", is_running)
        except ProjectBusyError:
            return "refused"
        claimed.append(sprint_id)
        return "claimed"

    outcomes = await asyncio.gather(*(claim(f"sprint-{n}") for n in range(5)))
    assert sorted(outcomes) == ["claimed"] + ["refused"] * 4
    assert recorded_running_sprint(str(tmp_path)) == claimed[0]


@pytest.mark.parametrize("content", ["", "{not json", "[]", '{"sprint_id": 7}', "\xff"])
def test_an_unreadable_record_names_no_sprint(tmp_path: Path, content: str):
    (tmp_path / ".sprint-session").mkdir()
    (tmp_path / ".sprint-session/running-sprint.json").write_text(content, encoding="latin-1")
    assert recorded_running_sprint(str(tmp_path)) is None


async def test_of_claims_at_once_on_one_status_file_through_two_roots_exactly_one_wins(tmp_path: Path):
    """The project, and a folder of it with the status file below it: each root has its own claim and lock. Of two
    sprints started in the same instant through both, each read the other root's claim of an ended sprint, asked
    the server about it meanwhile the other wrote its own, and both ran every story."""
    inner = tmp_path / "docs"
    inner.mkdir()
    status = inner / "sprint-status.yaml"
    status.write_text("development_status: {}\n")
    claimed: list[str] = []
    delays: list[float] = []

    async def is_running(sprint_id: str, first_run_id: str | None = None) -> bool:
        await asyncio.sleep(delays.pop(0) if delays else 0.001)  # the server answers one slower than the other
        return sprint_id in claimed

    async def claim(root: Path, sprint_id: str) -> str:
        await asyncio.sleep(0)
        try:
            await claim_project(str(root), sprint_id, "run", is_running, status_real=str(status.resolve()))
        except ProjectBusyError as err:
            return f"refused: {err}"
        claimed.append(sprint_id)
        return "claimed"

    for rounds in range(4):  # (each order of the two, each answer the slower)
        delays[:] = [0.02, 0.001] if rounds // 2 else [0.001, 0.02]
        for root in (tmp_path, inner):
            (root / ".sprint-session" / "running-sprint.json").unlink(missing_ok=True)
        claimed.clear()
        first, second = (tmp_path, inner) if rounds % 2 else (inner, tmp_path)
        await claim_project(str(second), "sprint-ended", "run-0", running(), status_real=str(status.resolve()))
        outcomes = await asyncio.gather(claim(first, f"sprint-a{rounds}"), claim(second, f"sprint-b{rounds}"))
        assert sorted(o.split(":")[0] for o in outcomes) == ["claimed", "refused"], outcomes
        assert f"on {status.resolve()}" in next(o for o in outcomes if o != "claimed")
