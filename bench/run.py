"""The benchmark: BSO against raw Temporal on one local dev server, with instant simulated agents.

    make bench                                   # = .venv/bin/python -m bench.run
    .venv/bin/python -m bench.run --sizes 50 200 --lanes 4

For each N: a BSO sprint of N stories in `review` (one agent dispatch each; batch_size 10, P Slaves at
once), then the baseline workflow running N no-op activities sequentially and in P lanes. Reports
wall time, dispatches per second, BSO's orchestration overhead per dispatch from history timestamps
(story ready -> agent activity started; AGENT_COMPLETE received -> new state written), events per
story, and the ratio BSO / baseline (P lanes). Writes bench/results/bench-<time>.json and .md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType as E
from temporalio.client import Client

from bench.baseline import TASK_QUEUE as BASELINE_QUEUE
from bench.baseline import BaselineWorkflow
from bench.infra import REPO, DevServer, WorkerProcess, make_project, many_stories, percentile
from bso.constants import SPRINT_TASK_QUEUE
from bso.models import SprintInput
from workflows.sprint_master import SprintMasterWorkflow

RESULTS = REPO / "bench" / "results"


def _ms(a, b) -> float:
    return (b.ToDatetime() - a.ToDatetime()).total_seconds() * 1000


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "n": 0}
    return {"p50": round(statistics.median(values), 1), "p95": round(percentile(values, 95), 1), "n": len(values)}


async def _histories(client: Client, query: str) -> list[Any]:
    out = []
    async for wf in client.list_workflows(query):
        out.append((wf.workflow_type, await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()))
    return out


def slave_overheads(history) -> tuple[list[float], list[float], dict[str, int]]:
    """(ready -> agent started, agent answer -> state written) in ms, and counts of what happened."""
    scheduled: dict[int, str] = {}
    ready_ms, written_ms = [], []
    last_ready = None  # time the previous step (status load or U4 write) completed
    answer_at = None
    counts = {"agent_activities": 0, "write_activities": 0, "signals": 0, "workflow_tasks": 0}
    for e in history.events:
        t = e.event_type
        if t == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = e.activity_task_scheduled_event_attributes.activity_type.name
            scheduled[e.event_id] = name
            counts["agent_activities" if name == "run_agent" else "write_activities"] += name != "load_sprint_status"
        elif t == E.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            if scheduled.get(e.activity_task_started_event_attributes.scheduled_event_id) == "run_agent" and last_ready:
                ready_ms.append(_ms(last_ready, e.event_time))
                last_ready = None
        elif t == E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            name = scheduled.get(e.activity_task_completed_event_attributes.scheduled_event_id)
            if name in ("load_sprint_status", "write_story_status"):
                last_ready = e.event_time
                if name == "write_story_status" and answer_at is not None:
                    written_ms.append(_ms(answer_at, e.event_time))
                    answer_at = None
        elif t == E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            counts["signals"] += 1
            if e.workflow_execution_signaled_event_attributes.signal_name == "agent_complete":
                answer_at = e.event_time
        elif t == E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            counts["workflow_tasks"] += 1
    return ready_ms, written_ms, counts


def baseline_overheads(history, lanes: int) -> list[float]:
    """Raw Temporal's step cost: an activity completed -> the next one of its lane started (ms)."""
    index: dict[int, int] = {}  # scheduled event id -> activity input i (lane = i % lanes)
    done_at: dict[int, Any] = {}  # lane -> time its last activity completed
    out = []
    for e in history.events:
        if e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            index[e.event_id] = int(json.loads(e.activity_task_scheduled_event_attributes.input.payloads[0].data))
        elif e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            lane = index[e.activity_task_started_event_attributes.scheduled_event_id] % lanes
            if lane in done_at:
                out.append(_ms(done_at.pop(lane), e.event_time))
        elif e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            lane = index[e.activity_task_completed_event_attributes.scheduled_event_id] % lanes
            done_at[lane] = e.event_time
    return out


async def bench_bso(client: Client, workdir: Path, n: int, lanes: int) -> dict[str, Any]:
    root = workdir / f"project-{n}"
    make_project(root, many_stories(n, "review"))
    session = f"bench-{n}-{uuid.uuid4().hex[:6]}"
    began = time.monotonic()
    report = await client.execute_workflow(
        SprintMasterWorkflow.run,
        SprintInput(project_root=str(root), session_id=session,
                    config_overrides={"batch_size": 10, "max_concurrent_slaves": lanes}),
        id=session,
        task_queue=SPRINT_TASK_QUEUE,
    )
    wall = time.monotonic() - began
    assert all(v == "done" for v in report.stories.values()) and len(report.stories) == n
    histories = await _histories(client, f'BsoSessionId = "{session}"')
    ready, written = [], []
    totals = {"agent_activities": 0, "write_activities": 0, "signals": 0, "workflow_tasks": 0}
    events = {"SprintMasterWorkflow": 0, "SprintSlaveWorkflow": 0}
    by_type: dict[str, int] = {}
    for wf_type, history in histories:
        events[wf_type] = events.get(wf_type, 0) + len(history.events)
        for e in history.events:
            name = f"{wf_type.removeprefix('Sprint').removesuffix('Workflow')}:{E.Name(e.event_type).removeprefix('EVENT_TYPE_')}"
            by_type[name] = by_type.get(name, 0) + 1
        if wf_type == "SprintSlaveWorkflow":
            r, w, c = slave_overheads(history)
            ready += r
            written += w
            for k, v in c.items():
                totals[k] += v
    dispatches = sum(r.agents_dispatched for b in report.batches for r in b.results.story_results)
    return {
        "n": n,
        "wall_seconds": round(wall, 2),
        "dispatches": dispatches,
        "dispatches_per_second": round(dispatches / wall, 2),
        "ready_to_agent_started_ms": _stats(ready),
        "answer_to_state_written_ms": _stats(written),
        "events_per_story": round(sum(events.values()) / n, 1),
        "master_events_per_story": round(events["SprintMasterWorkflow"] / n, 1),
        "slave_events_per_story": round(events["SprintSlaveWorkflow"] / n, 1),
        "slave_workflow_tasks_per_story": round(totals["workflow_tasks"] / n, 2),
        "slave_signals_per_story": round(totals["signals"] / n, 2),
        "activities_per_story": round((totals["agent_activities"] + totals["write_activities"]) / n, 2),
        "events_per_story_by_type": {k: round(v / n, 2) for k, v in sorted(by_type.items(), key=lambda kv: -kv[1])},
        "master_runs": len([h for t, h in histories if t == "SprintMasterWorkflow"]),
    }


async def bench_baseline(client: Client, n: int, lanes: int) -> dict[str, Any]:
    wid = f"baseline-{n}-{lanes}-{uuid.uuid4().hex[:6]}"
    began = time.monotonic()
    await client.execute_workflow(BaselineWorkflow.run, args=[n, lanes], id=wid, task_queue=BASELINE_QUEUE)
    wall = time.monotonic() - began
    history = await client.get_workflow_handle(wid).fetch_history()
    return {
        "n": n,
        "lanes": lanes,
        "wall_seconds": round(wall, 2),
        "activities_per_second": round(n / wall, 2),
        "step_ms": _stats(baseline_overheads(history, lanes)),
        "events_per_activity": round(len(history.events) / n, 1),
    }


async def run(sizes: list[int], lanes: int, workdir: Path) -> dict[str, Any]:
    server = DevServer(workdir / "temporal.db", workdir / "server.log")
    server.start()
    bso_worker = WorkerProcess(server.address, workdir / "worker.log", ["--max-concurrent-agents", "16"])
    base_worker = WorkerProcess(server.address, workdir / "baseline.log")
    base_worker.extra_args = []
    rows = []
    try:
        client = await server.wait_ready()
        bso_worker.start()
        # The baseline's worker: its own process, same SDK defaults.
        import subprocess
        import sys

        log = open(workdir / "baseline.log", "ab")
        base = subprocess.Popen([sys.executable, "-m", "bench.baseline", "--worker"], cwd=REPO, stdout=log,
                                stderr=subprocess.STDOUT, env={**os.environ, "TEMPORAL_ADDRESS": server.address})
        base_worker.proc = base
        await bench_baseline(client, 10, 1)  # warm-up
        for n in sizes:
            print(f"N={n}: BSO sprint ...", flush=True)
            bso = await bench_bso(client, workdir, n, lanes)
            print(f"N={n}: baseline ...", flush=True)
            seq = await bench_baseline(client, n, 1)
            par = await bench_baseline(client, n, lanes)
            rows.append({"n": n, "bso": bso, "baseline_sequential": seq, "baseline_parallel": par,
                         "ratio": round(bso["dispatches_per_second"] / par["activities_per_second"], 3)})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        bso_worker.stop()
        base_worker.stop()
        server.stop()
    return {
        "when": datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, "
                   f"Python {platform.python_version()}",
        "lanes": lanes,
        "rows": rows,
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Machine: {result['machine']}; {result['when']}; P = {result['lanes']} parallel lanes "
        "(BSO: batch_size 10, max_concurrent_slaves P; baseline: P lanes of sequential no-op activities).",
        "",
        "| N | BSO wall s | BSO dispatches/s | baseline seq act/s | baseline P act/s | ratio BSO/baseline P "
        "| ready->agent started p50/p95 ms | answer->state written p50/p95 ms | baseline step p50/p95 ms "
        "| events/story | activities/story | signals/story (Slave) | Master runs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        b, s, p = r["bso"], r["baseline_sequential"], r["baseline_parallel"]
        lines.append(
            f"| {r['n']} | {b['wall_seconds']} | {b['dispatches_per_second']} | {s['activities_per_second']} | "
            f"{p['activities_per_second']} | {r['ratio']} | {b['ready_to_agent_started_ms']['p50']}/"
            f"{b['ready_to_agent_started_ms']['p95']} | {b['answer_to_state_written_ms']['p50']}/"
            f"{b['answer_to_state_written_ms']['p95']} | {p['step_ms']['p50']}/{p['step_ms']['p95']} | "
            f"{b['events_per_story']} | {b['activities_per_story']} | {b['slave_signals_per_story']} | {b['master_runs']} |"
        )
    last = result["rows"][-1]["bso"] if result["rows"] else None
    if last:
        lines += ["", f"Where the events go (N = {last['n']}, per story):", "",
                  "| workflow: event | per story |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in last["events_per_story_by_type"].items() if v >= 0.05]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 200, 1000])
    parser.add_argument("--lanes", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bso-bench-") as tmp:
        result = asyncio.run(run(args.sizes, args.lanes, Path(tmp)))
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    (RESULTS / f"bench-{stamp}.json").write_text(json.dumps(result, indent=2))
    table = markdown(result)
    (RESULTS / f"bench-{stamp}.md").write_text(table)
    print(table)
    print(f"written: bench/results/bench-{stamp}.json and .md")


if __name__ == "__main__":
    main()
