"""Parallel, dependency-aware batches on the time-skipping server: a story waits for its dependencies in
other batches, is skipped when one fails, stories touching the same files are not batched together
(P29), parallel Slaves never lose a status-file update, and the makespan against the critical path."""

from __future__ import annotations

from pathlib import Path

from bso.constants import slave_workflow_id
from bso.dependencies import critical_path
from bso.models import DEFAULT_STATUS_FILE, StoryMeta
from bso.states import SprintPhase, SprintStatus
from tests.conftest import bso_worker
from workflows.sprint_master import SprintMasterWorkflow
from workflows.sprint_slave import SprintSlaveWorkflow
from tests.workflow.helpers import (
    ledger,
    make_project,
    poll_until,
    run_sprint,
    sprint_input,
    sprint_result,
    start_sprint,
    status_values,
    wait_status,
)

K1, K2, K3, K4 = "1-1-login-form", "1-2-logout", "1-3-profile-page", "1-4-settings"


def story_doc(num: str, title: str, depends_on: str = "", files: str = "", status: str = "ready-for-dev") -> str:
    lines = [f"# Story 1.{num}: {title}", "", f"Status: {status}", ""]
    if depends_on:
        lines.append(f"Depends on: {depends_on}")
    if files:
        lines.append(f"Files: {files}")
    return "\n".join(lines) + "\n"


def story_of(dispatch_id: str) -> str:
    return dispatch_id.split("/")[-2]  # `<session>/batch-N/<short key>/<n>`


def events(root: Path) -> list[tuple[str, str]]:
    return [(story_of(e["dispatch_id"]), e["event"]) for e in ledger(root)]


async def test_dependant_in_a_parallel_batch_waits_for_its_dependency(ts_env, tmp_path: Path):
    make_project(
        tmp_path,
        {K1: "ready-for-dev", K2: "ready-for-dev", K3: "ready-for-dev"},
        {K2: story_doc("2", "Logout", depends_on="1-1")},
    )
    overrides = {"batch_size": 2, "max_concurrent_slaves": 2}
    simulation = {"default": {"duration_ms": 300}}
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client, queue, sprint_input(tmp_path, config_overrides=overrides, simulation=simulation)
        )
    assert [b.stories for b in report.batch_plan.batches] == [[K1, K3], [K2]]  # by levels: K3 not behind K2
    assert report.status is SprintStatus.COMPLETE
    assert all(status_values(tmp_path)[k] == "done" for k in (K1, K2, K3))
    log = events(tmp_path)
    last_of_1 = max(i for i, (story, event) in enumerate(log) if story == "1-1" and event == "finished")
    first_of_2 = min(i for i, (story, event) in enumerate(log) if story == "1-2")
    assert first_of_2 > last_of_1, log  # 1-2 never started before 1-1 was done


async def test_bmad_dotted_dependencies_are_honoured_and_an_unknown_one_is_said(ts_env, tmp_path: Path):
    """`Depends on: Story 1.1` / `1.1` (BMAD's numbering, as in `# Story 1.2: ...`) were ignored with a warning in
    the worker's log only, and the dependant ran beside its dependency. A reference naming no story of the file is
    still ignored, but the sprint's errors say so."""
    make_project(
        tmp_path,
        {K1: "ready-for-dev", K2: "ready-for-dev", K3: "ready-for-dev"},
        {K2: story_doc("2", "Logout", depends_on="Story 1.1"), K3: story_doc("3", "Profile", depends_on="1.2, 9.9")},
    )
    overrides = {"batch_size": 1, "max_concurrent_slaves": 3}
    simulation = {"default": {"duration_ms": 300}}
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client, queue, sprint_input(tmp_path, config_overrides=overrides, simulation=simulation)
        )
    assert [b.stories for b in report.batch_plan.batches] == [[K1], [K2], [K3]]
    assert report.status is SprintStatus.COMPLETE
    log = events(tmp_path)
    for dependency, dependant in (("1-1", "1-2"), ("1-2", "1-3")):
        last = max(i for i, (story, event) in enumerate(log) if story == dependency and event == "finished")
        assert min(i for i, (story, _) in enumerate(log) if story == dependant) > last, log
    assert report.errors == [f"{K3}.md: Depends on '9-9' ignored: unknown story key '9-9'"]


async def test_dependants_of_a_failed_story_are_skipped(ts_env, tmp_path: Path):
    make_project(
        tmp_path,
        {K1: "ready-for-dev", K2: "ready-for-dev", K3: "ready-for-dev", K4: "ready-for-dev"},
        {K2: story_doc("2", "Logout", depends_on="1-1"), K4: story_doc("4", "Settings", depends_on="1-2")},
    )
    overrides = {"batch_size": 1, "max_concurrent_slaves": 3}
    simulation = {"stories": {"1-1": {"fail": {"dev": "error"}, "duration_ms": 200}}}
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(
            ts_env.client, queue, sprint_input(tmp_path, config_overrides=overrides, simulation=simulation)
        )
    assert report.status is SprintStatus.PARTIAL
    assert report.stories == {K1: "needs-intervention", K2: "skipped", K3: "done", K4: "skipped"}
    values = status_values(tmp_path)
    assert (values[K1], values[K2], values[K3], values[K4]) == ("needs-intervention", "skipped", "done", "skipped")
    errors = {r.story_key: r.error for b in report.batches for r in b.results.story_results}
    assert errors[K2] == f"dependency {K1} ended needs-intervention: story skipped"
    assert errors[K4] == f"dependency {K2} ended skipped: story skipped"
    assert not [e for e in ledger(tmp_path) if story_of(e["dispatch_id"]) in ("1-2", "1-4")]


async def test_stories_touching_the_same_files_go_to_different_batches(ts_env, tmp_path: Path):
    make_project(
        tmp_path,
        {K1: "review", K2: "review", K3: "review"},
        {
            K1: story_doc("1", "Login form", files="src/auth.py"),
            K2: story_doc("2", "Logout", files="src/auth.py, src/session.py"),
            K3: story_doc("3", "Profile page", files="src/profile.py"),
        },
    )
    async with bso_worker(ts_env.client) as queue:
        report = await run_sprint(ts_env.client, queue, sprint_input(tmp_path, config_overrides={"batch_size": 3}))
    assert [b.stories for b in report.batch_plan.batches] == [[K1], [K2, K3]]
    assert report.status is SprintStatus.COMPLETE


async def test_a_batch_waits_while_a_running_one_works_on_a_file_it_touches(ts_env, tmp_path: Path):
    """K1 and K2 touch src/auth.py, in batches 1 and 2 of two Slaves at once: batch 2 waits until K1 is done
    (the status says why), batch 3 (K3, another file) goes ahead of it, and K2's agent starts after K1's
    finished. Before, K1's and K2's agents worked on the file at once."""
    make_project(
        tmp_path,
        {K1: "ready-for-dev", K2: "review", K3: "review"},
        {
            K1: story_doc("1", "Login form", files="src/auth.py"),
            K2: story_doc("2", "Logout", files="src/session.py, src/auth.py"),
            K3: story_doc("3", "Profile page", files="src/profile.py"),
        },
    )
    overrides = {"batch_size": 1, "max_concurrent_slaves": 2}
    simulation = {"stories": {"1-1": {"duration_ms": 1400}, "1-3": {"duration_ms": 700}}}
    inp = sprint_input(tmp_path, config_overrides=overrides, simulation=simulation)
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, inp)
        # Both slots taken (batches 1 and 3): batch 2 still says why it waits (the status said nothing then).
        held = await wait_status(
            handle, lambda s: s.running_batches == [1, 3] and s.batch_held is not None, "batch 2 held, batch 3 running"
        )
        report = await sprint_result(handle)
    assert held.batch_held == "batch 2 waits: 1-2-logout touches src/auth.py, as 1-1-login-form of running batch 1 does"
    assert [b.stories for b in report.batch_plan.batches] == [[K1], [K2], [K3]]
    assert report.status is SprintStatus.COMPLETE
    log = events(tmp_path)
    k1_done = max(i for i, (story, event) in enumerate(log) if story == "1-1" and event == "finished")
    assert min(i for i, (story, _) in enumerate(log) if story == "1-2") > k1_done, log
    assert min(i for i, (story, _) in enumerate(log) if story == "1-3") < k1_done, log  # batch 3 went ahead


async def test_a_story_set_done_by_hand_while_it_waits_for_a_dependency_runs_no_agent(ts_env, tmp_path: Path):
    """K2 (batch 2) waits for K1 (batch 1, running at once); while it waits, K2 is set done by hand. No write of
    batch 2 happens between the edit and K2's turn: the Slave dispatched K2's dev-runner all the same and set its
    answer aside. It now reads the file again before a story's first agent when time has passed since its last
    read."""
    make_project(
        tmp_path,
        {K1: "review", K2: "ready-for-dev"},
        {K2: story_doc("2", "Logout", depends_on="1-1")},
    )
    overrides = {"batch_size": 1, "max_concurrent_slaves": 2}
    simulation = {"stories": {"1-1": {"duration_ms": 4000}}}  # the edit lands well before K1's own write
    inp = sprint_input(tmp_path, session_id="dep-wait", config_overrides=overrides, simulation=simulation)
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, inp)
        await wait_status(
            handle,
            lambda s: s.stories[K1].agent_in_flight == "review-runner" and 2 in [v.batch_id for v in s.stories.values()]
            and s.current_batch == 1 and s.batches_total == 2,
            "K1's review in flight",
        )
        second = ts_env.client.get_workflow_handle(slave_workflow_id("dep-wait", 2))

        async def second_waits() -> bool:
            try:
                status = await second.query(SprintSlaveWorkflow.status)
            except Exception:  # noqa: BLE001 - not started yet
                return False
            return status.stories[K2].agent_in_flight is None and status.stories[K2].state == "ready-for-dev"

        await poll_until(second_waits, "batch 2's Slave started, K2 waiting for K1")
        status_file = tmp_path / DEFAULT_STATUS_FILE
        text = status_file.read_text(encoding="utf-8")
        status_file.write_text(text.replace(f"{K2}: ready-for-dev", f"{K2}: done"), encoding="utf-8")
        report = await sprint_result(handle)
        view = await handle.query(SprintMasterWorkflow.status)
    assert report.stories == {K1: "done", K2: "done"}, report.stories
    started = [e["dispatch_id"] for e in ledger(tmp_path) if e["event"] == "started"]
    assert view.stories[K2].agents_dispatched == 0, (started, view.stories[K2])


async def test_makespan_against_the_critical_path(ts_env, tmp_path: Path):
    """1-1 -> 1-3 -> 1-4 is the critical path (3 stories of 2 agents); 1-2 runs beside it."""
    make_project(
        tmp_path,
        {K1: "ready-for-dev", K2: "ready-for-dev", K3: "ready-for-dev", K4: "ready-for-dev"},
        {K3: story_doc("3", "Profile page", depends_on="1-1"), K4: story_doc("4", "Settings", depends_on="1-3")},
    )
    agent_s = 0.4
    overrides = {"batch_size": 2, "max_concurrent_slaves": 2}
    simulation = {"default": {"duration_ms": int(agent_s * 1000)}}
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(
            ts_env.client, queue, sprint_input(tmp_path, config_overrides=overrides, simulation=simulation)
        )
        report = await sprint_result(handle)
        history = await handle.fetch_history()
    assert report.status is SprintStatus.COMPLETE
    assert all(v == "done" for v in report.stories.values())
    stories = [
        StoryMeta(key=k, epic="epic-1", short_key=k[:3], state="ready-for-dev", story_path="", depends_on=d)
        for k, d in ((K1, []), (K2, []), (K3, [K1]), (K4, [K3]))
    ]
    length, path = critical_path(stories, {k: 2 * agent_s for k in (K1, K2, K3, K4)})
    assert path == [K1, K3, K4]
    first, last = history.events[0].event_time.ToDatetime(), history.events[-1].event_time.ToDatetime()
    makespan = (last - first).total_seconds()
    serial = 4 * 2 * agent_s
    print(
        f"\nmakespan {makespan:.2f}s, critical path {length:.2f}s ({' -> '.join(path)}), serial {serial:.2f}s: "
        f"makespan / critical path = {makespan / length:.2f}"
    )
    assert makespan > 0


X, C, B, S, T = "1-1-x", "1-2-c", "1-3-b", "1-4-s", "1-5-t"


def _doc(n: str, depends_on: str = "", files: str = "") -> str:
    return story_doc(n, f"S{n}", depends_on, files, status="review")


async def test_a_budget_requeue_then_a_course_correction_does_not_deadlock_the_hold(ts_env, tmp_path: Path):
    """Plan (levels, 2 at once): batch 1 [x, c], batch 2 [b (depends on c), s (src/f.py)], batch 3 [t (src/f.py)],
    held while s is unfinished. x's review exhausts the budget: batch 1 ends, c never started is queued again in
    front (batch 4) and the sprint pauses, batch 2's b waiting for c (since the sprint-wide budget, batch 2 is
    told to start no story too, and may end first). A course correction re-plans the queue [c],
    [t] into one batch [c, t]; on resume that batch waited for s (src/f.py), s behind b, b for c: a deadlock
    until the Slave's timeout. A running batch waiting for a queued story now turns the hold off."""
    make_project(
        tmp_path,
        {X: "review", C: "review", B: "review", S: "review", T: "review"},
        {B: _doc("3", depends_on="1-2"), S: _doc("4", depends_on="1-1", files="src/f.py"),
         T: _doc("5", depends_on="1-1", files="src/f.py")},
    )
    overrides = {"batch_size": 2, "max_concurrent_slaves": 2, "token_budget.limit": 1000}
    inp = sprint_input(tmp_path, session_id="hold-deadlock", config_overrides=overrides)
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, inp)
        # (Past the sprint's budget batch 2 is told to start no story either: its end may come first.)
        paused = await wait_status(handle, lambda s: s.phase is SprintPhase.PAUSED and s.batches_done >= 1, "budget pause")
        assert paused.stories[C].batch_id >= 4 and paused.stories[B].state == "review", paused
        await handle.execute_update(SprintMasterWorkflow.course_correct, {"reason": "user_request"})
        await handle.signal(SprintMasterWorkflow.resume, {"token_limit": 100_000})
        try:
            await wait_status(handle, lambda s: s.phase is SprintPhase.COMPLETED, "sprint completed", timeout=15)
        except AssertionError:
            view = await handle.query(SprintMasterWorkflow.status)
            raise AssertionError(
                f"stuck: {view.phase} {view.pause_reason} batch_held={view.batch_held!r}, states={ {k: v.state for k, v in view.stories.items()} }, "
                f"batches={ {k: v.batch_id for k, v in view.stories.items()} }"
            ) from None
        report = await sprint_result(handle)
    assert report.status is SprintStatus.COMPLETE, report.stories


async def test_one_batch_at_a_time_shows_no_batch_held(ts_env, tmp_path: Path):
    """max_concurrent_slaves 1 (the default): batch 2 waits for batch 1 to end whatever files they touch, so
    nothing is held for a file (the status said `batch 2 waits: 1-2-logout touches src/auth.py, ...`)."""
    make_project(
        tmp_path,
        {K1: "ready-for-dev", K2: "review"},
        {K1: story_doc("1", "Login form", files="src/auth.py"), K2: story_doc("2", "Logout", files="src/auth.py")},
    )
    simulation = {"stories": {"1-1": {"duration_ms": 700}}}
    inp = sprint_input(tmp_path, session_id="one-at-a-time", config_overrides={"batch_size": 1}, simulation=simulation)
    async with bso_worker(ts_env.client) as queue:
        handle = await start_sprint(ts_env.client, queue, inp)
        running = await wait_status(handle, lambda s: s.stories[K1].agent_in_flight is not None, "K1 in flight")
        report = await sprint_result(handle)
    assert report.status is SprintStatus.COMPLETE
    assert running.batch_held is None, running.batch_held
