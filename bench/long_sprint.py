"""A long sprint on the local dev server: N simulated stories with instant agents, the Master
continuing as new on the way, pause/resume signals sent all along (some land around a hand-over),
the status query polled throughout.

    .venv/bin/python -m bench.long_sprint --stories 1000        # the 1,000-story proof (a few minutes)
    .venv/bin/python -m bench.long_sprint --stories 200 --continue-after 500
    .venv/bin/python -m bench.long_sprint --stories 40 --agent-ms 2000 --no-operator   # events with slow agents

Prints the largest history (events, bytes) of each workflow type; they must stay under Temporal's
warning line (10,240 events, 10 MB), and every single payload well under 2 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from bench.histories import history_sizes
from bench.infra import DevServer, WorkerProcess, make_project, many_stories, status_values
from bso.constants import SPRINT_TASK_QUEUE
from bso.models import SprintInput
from workflows.sprint_master import SprintMasterWorkflow

EVENT_LIMIT = 10_240
BYTES_LIMIT = 10 * 1024 * 1024
PAYLOAD_LIMIT = 2 * 1024 * 1024


async def _wait_phase(handle, paused: bool, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = await handle.query(SprintMasterWorkflow.status)
        if (status.phase == "paused") == paused or status.phase == "completed":
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{'pause' if paused else 'resume'} signal lost: phase never changed")


async def _operator(
    client: Client, session: str, done: asyncio.Event, log: dict[str, Any], pause_every: float
) -> None:
    """Pause and resume again and again while the sprint runs; each must take effect."""
    handle = client.get_workflow_handle(session)
    try:
        await _pause_resume_cycles(handle, done, log, pause_every)
    except RPCError:
        # Only acceptable when the whole sprint (the latest run) has ended meanwhile.
        if (await handle.describe()).status != WorkflowExecutionStatus.COMPLETED:
            raise


async def _pause_resume_cycles(
    handle, done: asyncio.Event, log: dict[str, Any], pause_every: float = 0.7
) -> None:
    while not done.is_set():
        await asyncio.sleep(pause_every)
        if done.is_set():
            return
        before = (await handle.query(SprintMasterWorkflow.status)).runs
        await handle.signal("pause", "operator check")
        await _wait_phase(handle, paused=True)
        await asyncio.sleep(random.uniform(0.2, 1.0))
        await handle.signal("resume")
        await _wait_phase(handle, paused=False)
        after = (await handle.query(SprintMasterWorkflow.status)).runs
        log["pause_resume_cycles"] += 1
        log["cycles_across_handover"] += after != before


async def _watch(client: Client, session: str, done: asyncio.Event, log: dict[str, Any]) -> None:
    handle = client.get_workflow_handle(session)
    while not done.is_set():
        status = await handle.query(SprintMasterWorkflow.status)
        log["queries"] += 1
        log["runs_seen"] = sorted(set(log["runs_seen"]) | {status.runs})
        log["max_query_bytes"] = max(log["max_query_bytes"], len(status.model_dump_json()))
        await asyncio.sleep(0.25)


async def run_long_sprint(
    stories: int, workdir: Path, batch_size: int = 10, slaves: int = 4, continue_after: int | None = None,
    operator: bool = True, pause_every: float = 0.7, resident_continue_after: int | None = None,
    agent_ms: int = 0,
) -> dict[str, Any]:
    server = DevServer(workdir / "temporal.db", workdir / "server.log")
    server.start()
    worker = WorkerProcess(server.address, workdir / "worker.log", ["--max-concurrent-agents", "16"])
    try:
        client = await server.wait_ready()
        worker.start()
        root = workdir / "project"
        keys = many_stories(stories, "review")
        make_project(root, keys)
        session = f"long-{stories}-{uuid.uuid4().hex[:6]}"
        overrides: dict[str, Any] = {"batch_size": batch_size, "max_concurrent_slaves": slaves}
        if continue_after:
            overrides["continue_as_new_after_events"] = continue_after
        if resident_continue_after:
            overrides["resident_continue_as_new_after_events"] = resident_continue_after
        began = time.monotonic()
        handle = await client.start_workflow(
            SprintMasterWorkflow.run,
            SprintInput(
                project_root=str(root), session_id=session, config_overrides=overrides,
                simulation={"default": {"duration_ms": agent_ms}} if agent_ms else {},
            ),
            id=session,
            task_queue=SPRINT_TASK_QUEUE,
        )
        log: dict[str, Any] = {"queries": 0, "runs_seen": [], "max_query_bytes": 0,
                               "pause_resume_cycles": 0, "cycles_across_handover": 0}
        done = asyncio.Event()
        helpers = [asyncio.create_task(_watch(client, session, done, log))]
        if operator:
            helpers.append(asyncio.create_task(_operator(client, session, done, log, pause_every)))
        result = asyncio.ensure_future(handle.result())
        try:
            # An operator or watcher that fails (a lost pause, a failed query) fails the run at once, instead
            # of leaving it waiting for a sprint that nobody will resume.
            pending: set[asyncio.Future] = {result, *helpers}
            while not result.done():
                finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                failed = [f for f in finished if f is not result and f.exception() is not None]
                if failed:
                    result.cancel()
                    raise failed[0].exception()
            report = result.result()
        finally:
            done.set()
        await asyncio.gather(*helpers)
        wall = time.monotonic() - began
        final = await handle.query(SprintMasterWorkflow.status)
        sizes = await history_sizes(client)
        values = status_values(root)
    finally:
        worker.stop()
        server.stop()
    return {
        "stories": stories,
        "wall_seconds": round(wall, 1),
        "report_status": report.status.value,
        "all_done": report.stories == {k: "done" for k in keys} and all(values[k] == "done" for k in keys),
        "query_stories_done": sum(v.state == "done" and v.agents_dispatched == 1 for v in final.stories.values()),
        "runs": final.runs,
        "agent_ms": agent_ms,
        "report_bytes": len(report.model_dump_json()),
        "histories": sizes,
        **log,
    }


def check(result: dict[str, Any]) -> list[str]:
    problems = []
    if not result["all_done"]:
        problems.append("not every story is done in the report and the status file")
    if result["query_stories_done"] != result["stories"]:
        problems.append(f"status query shows {result['query_stories_done']}/{result['stories']} stories done")
    for wf_type, row in result["histories"].items():
        if row["max_events"] >= EVENT_LIMIT or row["max_bytes"] >= BYTES_LIMIT:
            problems.append(f"{wf_type}: history {row['max_events']} events / {row['max_bytes']} bytes")
        if row["max_event_bytes"] >= PAYLOAD_LIMIT // 2:
            problems.append(f"{wf_type}: an event of {row['max_event_bytes']} bytes")
        if row["task_failures"]:
            causes = "; ".join(row.get("task_failure_causes", []))
            problems.append(f"{wf_type}: {row['task_failures']} WorkflowTaskFailed events ({causes})")
    if result["report_bytes"] >= PAYLOAD_LIMIT // 2:
        problems.append(f"report of {result['report_bytes']} bytes")
    return problems


def describe(result: dict[str, Any]) -> str:
    lines = [
        f"{result['stories']} stories: {result['report_status']} in {result['wall_seconds']}s, "
        f"Master runs {result['runs']} (seen by the query: {result['runs_seen']}), {result['queries']} queries, "
        f"{result['pause_resume_cycles']} pause/resume cycles ({result['cycles_across_handover']} across a hand-over), "
        f"report {result['report_bytes']} bytes, largest query answer {result['max_query_bytes']} bytes",
        f"agents take {result['agent_ms']} ms each",
        "| workflow type | runs | events per story (all runs) | largest history (events) | largest history (bytes) | largest event (bytes) | WorkflowTaskFailed | UnhandledCommand (a signal raced a hand-over or the end; retried) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for wf_type, row in sorted(result["histories"].items()):
        per_story = row.get("total_events", 0) / result["stories"]
        lines.append(f"| {wf_type} | {row['runs']} | {per_story:.1f} | {row['max_events']} | {row['max_bytes']} | {row['max_event_bytes']} | {row['task_failures']} | {row.get('signal_races', 0)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.long_sprint", description=__doc__.splitlines()[0])
    parser.add_argument("--stories", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--slaves", type=int, default=4)
    parser.add_argument("--continue-after", type=int, default=None,
                        help="continue_as_new_after_events (default: when Temporal suggests it)")
    parser.add_argument("--resident-continue-after", type=int, default=None,
                        help="resident_continue_as_new_after_events (default: --continue-after, else when suggested)")
    parser.add_argument("--agent-ms", type=int, default=0, help="how long each simulated agent takes (default: instant)")
    parser.add_argument("--no-operator", action="store_true", help="no pause/resume signals during the sprint")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bso-long-") as tmp:
        result = asyncio.run(run_long_sprint(
            args.stories, Path(tmp), args.batch_size, args.slaves, args.continue_after,
            resident_continue_after=args.resident_continue_after, agent_ms=args.agent_ms, operator=not args.no_operator,
        ))
    print(describe(result))
    problems = check(result)
    print(json.dumps({k: v for k, v in result.items() if k != "histories"}))
    for p in problems:
        print("PROBLEM:", p)
    raise SystemExit(1 if problems else 0)


if __name__ == "__main__":
    main()
