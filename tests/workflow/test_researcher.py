"""The knowledge researcher resident on the time-skipping server: answers, cache hits that cost no call,
the per-story call budget, LRU eviction, and a cache that survives into the next sprint."""

from __future__ import annotations

from pathlib import Path

from bso.roster import resident_workflow_id
from bso.states import SprintPhase
from tests.conftest import bso_worker
from tests.workflow.helpers import make_project, sprint_input, sprint_result, start_sprint
from tests.workflow.helpers import wait_status
from workflows.residents import ResidentWorkflow
from workflows.sprint_master import SprintMasterWorkflow

K1 = "1-1-login-form"


async def held_sprint(client, queue, root: Path, session: str, overrides: dict | None = None):
    """A sprint paused at its first-story checkpoint: its residents stay up while the test talks to them."""
    handle = await start_sprint(
        client, queue,
        sprint_input(root, session_id=session, config_overrides={"first_story_checkpoint": "pause", **(overrides or {})}),
    )
    await wait_status(handle, lambda s: s.phase is SprintPhase.PAUSED, "checkpoint")
    return handle, client.get_workflow_handle(resident_workflow_id(session, "knowledge-researcher"))


def ask(story: str, query: str, n: int = 1) -> dict:
    return {"msg_type": "RESEARCH_REQUEST", "request_id": f"R-{n}", "story_key": story, "query": query}


async def test_research_cache_budget_and_restart(ts_env, tmp_path: Path):
    make_project(tmp_path, {K1: "review"})
    async with bso_worker(ts_env.client) as queue:
        handle, kr = await held_sprint(ts_env.client, queue, tmp_path, "kr-1", {"knowledge_research.max_cache_entries": 3})
        first = await kr.execute_update(ResidentWorkflow.research, ask("1-1", "How do I hash passwords?"))
        assert (first.status, first.calls_used, first.calls_left) == ("answered", 1, 2)
        assert "hash passwords" in first.answer
        again = await kr.execute_update(ResidentWorkflow.research, ask("1-1", "how do I  hash passwords?", 2))
        assert (again.status, again.cached, again.answer, again.calls_used) == ("cached", True, first.answer, 1)
        for n, query in enumerate(("JWT expiry?", "CSRF tokens?"), 3):
            assert (await kr.execute_update(ResidentWorkflow.research, ask("1-1", query, n))).status == "answered"
        over = await kr.execute_update(ResidentWorkflow.research, ask("1-1", "One more question", 9))
        assert over.status == "budget_exhausted" and "3 research calls" in over.error
        # The full key is the same story (one budget), and what is not a story key has none to draw on.
        full = await kr.execute_update(ResidentWorkflow.research, ask(K1, "Yet another question", 90))
        assert full.status == "budget_exhausted", full
        made_up = await kr.execute_update(ResidentWorkflow.research, ask("anything-goes", "Free calls?", 91))
        assert made_up.status == "error" and "not a story key" in made_up.error, made_up
        other = await kr.execute_update(ResidentWorkflow.research, ask("1-2", "Session cookies?", 10))
        assert other.status == "answered"  # the budget is per story
        # 4 answers, at most 3 entries: the least recently used (passwords, last used before JWT was asked) is gone.
        index = (tmp_path / ".sprint-session/knowledge-cache/index.yaml").read_text()
        assert "How do I hash passwords?" not in index and "JWT expiry?" in index and "Session cookies?" in index
        await handle.signal(SprintMasterWorkflow.resume, {})
        await sprint_result(handle)

        # A new sprint (new resident workflow) finds the cache and the budget where they were.
        make_project(tmp_path, {K1: "review"})  # the status file again; .sprint-session/ stays
        handle, kr = await held_sprint(ts_env.client, queue, tmp_path, "kr-2")
        hit = await kr.execute_update(ResidentWorkflow.research, ask("1-1", "JWT expiry?", 11))
        assert hit.status == "cached" and hit.calls_used == 3
        await handle.signal(SprintMasterWorkflow.resume, {})
        await sprint_result(handle)


async def test_the_modules_research_timeout_bounds_each_call(ts_env, tmp_path: Path):
    """`agent_timeout_seconds.knowledge_research` was accepted and ignored: only
    `knowledge_research.call_timeout_seconds` held a call. The lower of the two holds now."""
    import json

    make_project(tmp_path, {K1: "review"})
    async with bso_worker(ts_env.client) as queue:
        handle, kr = await held_sprint(
            ts_env.client, queue, tmp_path, "kr-timeout", {"agent_timeout_seconds.knowledge_research": 120}
        )
        started = (await kr.fetch_history()).events[0].workflow_execution_started_event_attributes
        await handle.signal(SprintMasterWorkflow.resume, {})
        await sprint_result(handle)
    resident_input = json.loads(started.input.payloads[0].data)
    assert resident_input["knowledge_research"]["call_timeout_seconds"] == 120
