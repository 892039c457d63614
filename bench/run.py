"""The benchmark: BSO against raw Temporal on one local dev server, with instant simulated agents.

    make bench                                   # = .venv/bin/python -m bench.run
    .venv/bin/python -m bench.run --sizes 50 200 --lanes 4 --repeat 3 --workers 2
    .venv/bin/python -m bench.run --sizes 1000 --repeat 1 --profile   # and where the worker's CPU goes

For each N, `--repeat` times: a BSO sprint of N stories in `review` (one agent dispatch each; batch_size
10 unless `--batch-size` says otherwise, P Slaves at once), the baseline workflow running N no-op
activities in P lanes, and the skeleton (P workflows, each story an activity then a local activity: the
Slave's shape in raw Temporal); once, the
baseline running them sequentially. The row shown is the repetition with the median ratio (each ratio
is taken between runs of the same minute: this machine's speed drifts), with the ratios' range. Reports
wall time, dispatches per second, BSO's orchestration overhead per dispatch from history timestamps
(story ready -> agent activity started; AGENT_COMPLETE received -> new state written; the whole cycle
agent answer -> next agent started, to set against the baseline's activity completed -> next started),
events and workflow tasks per story, CPU time of the server and worker processes per story (less
sensitive to a shared machine's load than wall time), and the ratio BSO / baseline (P lanes). BSO gets
`--workers` worker processes, and the baseline and the skeleton as many. Writes
bench/results/bench-<time>.json and .md.
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
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp
from temporalio.api.enums.v1 import EventType as E
from temporalio.client import Client

from bench.baseline import TASK_QUEUE as BASELINE_QUEUE
from bench.baseline import BaselineWorkflow, SkeletonWorkflow
from bench.histories import signal_races
from bench.histories import task_failures as bench_task_failures
from bench.infra import REPO, DevServer, WorkerProcess, make_project, many_stories, percentile
from bench.profile import Profile, hotspots
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


def _payload_json(payloads) -> dict[str, Any]:
    return json.loads(payloads.payloads[0].data) if payloads.payloads else {}


def _clock_reading(result: dict[str, Any], key: str) -> Timestamp | None:
    """A time the activity put in its result (`done_at` of a U4 write, `read_at` of a status load)."""
    if not result.get(key):
        return None
    at = Timestamp()
    at.FromDatetime(datetime.fromisoformat(result[key]))
    return at


def _local_activity(e) -> tuple[str | None, dict[str, Any]]:
    """A local activity's marker: its activity type and its result."""
    attrs = e.marker_recorded_event_attributes
    if attrs.marker_name != "core_local_activity" or "data" not in attrs.details:
        return None, {}
    result = _payload_json(attrs.details["result"]) if "result" in attrs.details else {}
    return _payload_json(attrs.details["data"]).get("activity_type"), result


def slave_overheads(history) -> dict[str, Any]:
    """A Slave's per-dispatch overheads in ms, from its history, and counts of what happened:
    - ready: the story's state is in the status file (the previous U4 write, or for a batch's first story
      the status load, is done) -> its agent activity started;
    - written: the agent's answer -> the new state is in the status file (the U4 write done);
    - recorded: the agent's answer -> the U4 write is in history (run as a local activity, its marker is
      recorded when the workflow task that ran it ends, having dispatched the next agent);
    - cycle: the agent's answer -> the next agent started (= written + ready).
    The answer is the AGENT_COMPLETE signal or, for agents answering in-process, the agent activity's
    completion. A write or a load is done at the time it put in its result (`done_at`, `read_at`: the worker's
    clock once the file was fsynced and read back; the benchmark runs server and workers on one machine), or,
    in results recorded before those fields, at its completion in history (counted: `times_from_history`)."""
    scheduled: dict[int, str] = {}
    out: dict[str, list[float]] = {"ready": [], "written": [], "recorded": [], "cycle": []}
    last_ready = None  # time the previous step (status load or U4 write) was done
    answer_at = None  # the last agent answer not yet written
    cycle_from = None  # the last agent answer, until the next agent starts
    counts = dict.fromkeys(("agent_activities", "write_activities", "signals", "times_from_history"), 0)

    def done(result: dict[str, Any], key: str, in_history) -> Timestamp:
        at = _clock_reading(result, key)
        counts["times_from_history"] += at is None
        return at or in_history

    def loaded(result: dict[str, Any], in_history) -> None:
        nonlocal last_ready
        last_ready = done(result, "read_at", in_history)

    def wrote(result: dict[str, Any], in_history) -> None:
        nonlocal last_ready, answer_at
        counts["write_activities"] += 1
        if result.get("outcome") not in ("written", "already-applied"):
            return  # cas-mismatch: nothing written, the story stops
        last_ready = done(result, "done_at", in_history)
        if answer_at is not None:
            out["written"].append(_ms(answer_at, last_ready))
            out["recorded"].append(_ms(answer_at, in_history))
            answer_at = None

    def answered(at) -> None:
        nonlocal answer_at, cycle_from
        answer_at = cycle_from = at

    for e in history.events:
        t = e.event_type
        if t == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = e.activity_task_scheduled_event_attributes.activity_type.name
            scheduled[e.event_id] = name
            counts["agent_activities"] += name == "run_agent"
        elif t == E.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            if scheduled.get(e.activity_task_started_event_attributes.scheduled_event_id) == "run_agent":
                if last_ready:
                    out["ready"].append(_ms(last_ready, e.event_time))
                    last_ready = None
                if cycle_from is not None:
                    out["cycle"].append(_ms(cycle_from, e.event_time))
                    cycle_from = None
                answer_at = None  # an answer that changed no state is not timed against a later write
        elif t == E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            attrs = e.activity_task_completed_event_attributes
            name = scheduled.get(attrs.scheduled_event_id)
            if name == "load_sprint_status":
                loaded(_payload_json(attrs.result), e.event_time)
            elif name == "write_story_status":
                wrote(_payload_json(attrs.result), e.event_time)
            elif name == "run_agent" and _payload_json(attrs.result).get("answer"):
                answered(e.event_time)
        elif t == E.EVENT_TYPE_MARKER_RECORDED:
            local, result = _local_activity(e)
            if local == "load_sprint_status":
                loaded(result, e.event_time)
            elif local == "write_story_status":
                wrote(result, e.event_time)
        elif t == E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            counts["signals"] += 1
            if e.workflow_execution_signaled_event_attributes.signal_name == "agent_complete":
                answered(e.event_time)
    return {**out, "counts": counts}


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


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds the given processes use between start() and stop()."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.at: dict[str, float] = {}

    def start(self) -> None:
        self.at = {k: cpu_seconds(p) for k, p in self.pids.items()}

    def stop(self) -> dict[str, float]:
        return {k: round(cpu_seconds(p) - self.at[k], 2) for k, p in self.pids.items()}


async def bench_bso(
    client: Client, workdir: Path, n: int, lanes: int, cpu: CpuMeter, batch_size: int = 10
) -> dict[str, Any]:
    root = workdir / f"project-{n}"
    make_project(root, many_stories(n, "review"))
    session = f"bench-{n}-{uuid.uuid4().hex[:6]}"
    cpu.start()
    began = time.monotonic()
    report = await client.execute_workflow(
        SprintMasterWorkflow.run,
        SprintInput(project_root=str(root), session_id=session,
                    config_overrides={"batch_size": batch_size, "max_concurrent_slaves": lanes}),
        id=session,
        task_queue=SPRINT_TASK_QUEUE,
    )
    wall = time.monotonic() - began
    used = cpu.stop()
    assert all(v == "done" for v in report.stories.values()) and len(report.stories) == n
    histories = await _histories(client, f'BsoSessionId = "{session}"')
    overheads: dict[str, list[float]] = {"ready": [], "written": [], "recorded": [], "cycle": []}
    totals: dict[str, int] = {}
    events = {"SprintMasterWorkflow": 0, "SprintSlaveWorkflow": 0, "ResidentWorkflow": 0}
    tasks: dict[str, int] = {}
    by_type: dict[str, int] = {}
    task_failures: list[str] = []  # a code failure, not a signal racing a workflow's end (bench.histories)
    races = 0
    for wf_type, history in histories:
        events[wf_type] = events.get(wf_type, 0) + len(history.events)
        task_failures += [f"{history.workflow_id} {failure}" for failure in bench_task_failures(history)]
        races += signal_races(history)
        short_type = wf_type.removeprefix("Sprint").removesuffix("Workflow")
        for e in history.events:
            name = f"{short_type}:{E.Name(e.event_type).removeprefix('EVENT_TYPE_')}"
            by_type[name] = by_type.get(name, 0) + 1
            tasks[wf_type] = tasks.get(wf_type, 0) + (e.event_type == E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)
        if wf_type == "SprintSlaveWorkflow":
            slave = slave_overheads(history)
            for k in overheads:
                overheads[k] += slave[k]
            for k, v in slave["counts"].items():
                totals[k] = totals.get(k, 0) + v
    dispatches = sum(r.agents_dispatched for b in report.batches for r in b.results.story_results)
    return {
        "n": n,
        "wall_seconds": round(wall, 2),
        "dispatches": dispatches,
        "batches": len(report.batches),
        "dispatches_per_second": round(dispatches / wall, 2),
        "ready_to_agent_started_ms": _stats(overheads["ready"]),
        "answer_to_state_written_ms": _stats(overheads["written"]),
        "answer_to_state_recorded_ms": _stats(overheads["recorded"]),
        "answer_to_next_agent_started_ms": _stats(overheads["cycle"]),
        "events_per_story": round(sum(events.values()) / n, 1),
        "master_events_per_story": round(events["SprintMasterWorkflow"] / n, 1),
        "slave_events_per_story": round(events["SprintSlaveWorkflow"] / n, 1),
        "resident_events_per_story": round(events["ResidentWorkflow"] / n, 1),
        "workflow_tasks_per_story": {k: round(v / n, 2) for k, v in sorted(tasks.items())},
        "slave_workflow_tasks_per_story": round(tasks.get("SprintSlaveWorkflow", 0) / n, 2),
        "cpu_seconds": used,
        "cpu_ms_per_story": round(sum(used.values()) * 1000 / n, 1),
        "slave_signals_per_story": round(totals["signals"] / n, 2),
        # Writes and loads without their own time, timed at their completion in history instead (0 expected).
        "times_from_history": totals["times_from_history"],
        "activities_per_story": round((totals["agent_activities"] + totals["write_activities"]) / n, 2),
        "events_per_story_by_type": {k: round(v / n, 2) for k, v in sorted(by_type.items(), key=lambda kv: -kv[1])},
        "master_runs": len([h for t, h in histories if t == "SprintMasterWorkflow"]),
        "workflow_task_failures": task_failures,
        "unhandled_command_races": races,
    }


async def bench_baseline(client: Client, n: int, lanes: int, cpu: CpuMeter) -> dict[str, Any]:
    wid = f"baseline-{n}-{lanes}-{uuid.uuid4().hex[:6]}"
    cpu.start()
    began = time.monotonic()
    await client.execute_workflow(BaselineWorkflow.run, args=[n, lanes], id=wid, task_queue=BASELINE_QUEUE)
    wall = time.monotonic() - began
    used = cpu.stop()
    history = await client.get_workflow_handle(wid).fetch_history()
    return {
        "n": n,
        "lanes": lanes,
        "wall_seconds": round(wall, 2),
        "activities_per_second": round(n / wall, 2),
        "step_ms": _stats(baseline_overheads(history, lanes)),
        "events_per_activity": round(len(history.events) / n, 1),
        "cpu_seconds": used,
        "cpu_ms_per_activity": round(sum(used.values()) * 1000 / n, 1),
    }


async def bench_skeleton(client: Client, n: int, lanes: int, cpu: CpuMeter) -> dict[str, Any]:
    """P SkeletonWorkflows at once, N stories between them."""
    prefix = f"skeleton-{n}-{lanes}-{uuid.uuid4().hex[:6]}"
    cpu.start()
    began = time.monotonic()
    await asyncio.gather(*(
        client.execute_workflow(SkeletonWorkflow.run, args=[k, n, lanes], id=f"{prefix}-{k}", task_queue=BASELINE_QUEUE)
        for k in range(lanes)
    ))
    wall = time.monotonic() - began
    used = cpu.stop()
    histories = [await client.get_workflow_handle(f"{prefix}-{k}").fetch_history() for k in range(lanes)]
    events = sum(len(h.events) for h in histories)
    tasks = sum(e.event_type == E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED for h in histories for e in h.events)
    return {
        "n": n,
        "lanes": lanes,
        "wall_seconds": round(wall, 2),
        "stories_per_second": round(n / wall, 2),
        "step_ms": _stats([ms for h in histories for ms in baseline_overheads(h, 1)]),
        "events_per_story": round(events / n, 1),
        "workflow_tasks_per_story": round(tasks / n, 2),
        "cpu_seconds": used,
        "cpu_ms_per_story": round(sum(used.values()) * 1000 / n, 1),
    }


async def run(
    sizes: list[int], lanes: int, workdir: Path, repeat: int = 1, workers: int = 1, batch_size: int = 10,
    profile: bool = False,
) -> dict[str, Any]:
    server = DevServer(workdir / "temporal.db", workdir / "server.log")
    server.start()
    # `workers` processes for BSO and as many for the baseline and the skeleton (same SDK defaults).
    bso_workers = [
        WorkerProcess(server.address, workdir / f"worker-{k}.log", ["--max-concurrent-agents", "16"])
        for k in range(workers)
    ]
    base_workers = [
        WorkerProcess(server.address, workdir / f"baseline-{k}.log", ["--worker"], module="bench.baseline")
        for k in range(workers)
    ]
    rows = []
    profiled: dict[str, Any] | None = None
    try:
        client = await server.wait_ready()
        for worker in (*bso_workers, *base_workers):
            worker.start()
        bso_cpu = CpuMeter({"server": _pid(server.proc), **_worker_pids(bso_workers)})
        base_cpu = CpuMeter({"server": _pid(server.proc), **_worker_pids(base_workers)})
        # Warm-ups: every worker process has started and imported its workflows before anything is measured.
        await bench_bso(client, workdir / "warm-up", 2 * lanes, lanes, bso_cpu)
        await bench_baseline(client, 10, 1, base_cpu)
        for n in sizes:
            runs = []
            for r in range(1, repeat + 1):
                load_before = os.getloadavg()
                print(f"N={n} ({r}/{repeat}): BSO sprint, baseline, skeleton ...", flush=True)
                bso = await bench_bso(client, workdir / f"run-{r}", n, lanes, bso_cpu, batch_size)
                par = await bench_baseline(client, n, lanes, base_cpu)
                skeleton = await bench_skeleton(client, n, lanes, base_cpu)
                runs.append({"bso": bso, "baseline_parallel": par, "skeleton": skeleton,
                             "ratio": round(bso["dispatches_per_second"] / par["activities_per_second"], 3),
                             "skeleton_ratio": round(bso["dispatches_per_second"] / skeleton["stories_per_second"], 3),
                             "cpu_ratio": round(par["cpu_ms_per_activity"] / bso["cpu_ms_per_story"], 3),
                             "load_average": [round(x, 2) for x in (*load_before, *os.getloadavg())]})
            print(f"N={n}: baseline, sequential ...", flush=True)
            seq = await bench_baseline(client, n, 1, base_cpu)
            median = sorted(runs, key=lambda run: run["ratio"])[len(runs) // 2]
            rows.append({"n": n, **median, "baseline_sequential": seq, "repeat": repeat,
                         "ratios": [run["ratio"] for run in runs],
                         "skeleton_ratios": [run["skeleton_ratio"] for run in runs],
                         "ready_to_agent_started_p50s": _p50s(runs, "ready_to_agent_started_ms"),
                         "answer_to_state_written_p50s": _p50s(runs, "answer_to_state_written_ms")})
            print(json.dumps(rows[-1]), flush=True)
        if profile and sizes:  # one sprint more, of the largest N, measured by nothing but the profiler
            n = max(sizes)
            print(f"N={n}: BSO sprint, its worker profiled ...", flush=True)
            recording = Profile(_pid(bso_workers[0].proc), workdir / "profile.txt")
            await bench_bso(client, workdir / "profiled", n, lanes, bso_cpu, batch_size)
            raw = recording.stop()
            samples, on_stack = hotspots(raw, limit=40)  # the first ~20 are the event loop and the SDK
            _, running = hotspots(raw, limit=15, by="own")
            profiled = {"n": n, "samples": samples, "hotspots": [asdict(h) for h in on_stack],
                        "running_itself": [asdict(h) for h in running]}
    finally:
        for worker in (*bso_workers, *base_workers):
            worker.stop()
        server.stop()
    return {
        "when": datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, "
                   f"Python {platform.python_version()}",
        "lanes": lanes,
        "batch_size": batch_size,
        "workers": workers,
        "repeat": repeat,
        "rows": rows,
        "profile": profiled,
    }


def _p50s(runs: list[dict[str, Any]], figure: str) -> list[float]:
    """One BSO figure's p50 in each repetition."""
    return [run["bso"][figure]["p50"] for run in runs]


def _pid(proc: Any) -> int:
    assert proc is not None, "the process was not started"
    return proc.pid


def _worker_pids(workers: list[WorkerProcess]) -> dict[str, int]:
    """CPU meter keys: "worker-1", "worker-2"..."""
    return {f"worker-{k}": _pid(w.proc) for k, w in enumerate(workers, 1)}


def _span(values: list[float]) -> str:
    return f"{min(values)}-{max(values)}" if len(values) > 1 else f"{values[0]}"


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Machine: {result['machine']}; {result['when']}; P = {result['lanes']} parallel lanes "
        f"(BSO: batch_size {result.get('batch_size', 10)}, max_concurrent_slaves P; "
        "baseline: P lanes of sequential no-op activities; "
        "skeleton: P workflows, each story an activity then a local activity); "
        f"{result.get('workers', 1)} worker process(es) for BSO and as many for the baseline; "
        f"each row the median of {result.get('repeat', 1)} run(s), ranges over the runs.",
        "",
        "| N | BSO wall s | BSO dispatches/s | baseline seq act/s | baseline P act/s | ratio BSO/baseline P "
        "(range) | skeleton P stories/s | ratio BSO/skeleton (range) | ready->agent started p50 range ms "
        "| answer->state written p50 range ms | ready->agent started p50/p95 ms | answer->state written "
        "p50/p95 ms | answer->state recorded in history p50/p95 ms | answer->next agent started p50/p95 ms "
        "| baseline step p50/p95 ms | skeleton step p50/p95 ms | events/story (Master/Slave/residents) "
        "| workflow tasks/story | CPU ms/story BSO | CPU ms/activity baseline P | Master runs "
        "| load avg (1 min, before/after) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        b, s, p = r["bso"], r["baseline_sequential"], r["baseline_parallel"]
        lines.append(
            f"| {r['n']} | {b['wall_seconds']} | {b['dispatches_per_second']} | {s['activities_per_second']} | "
            f"{p['activities_per_second']} | {r['ratio']} ({_span(r['ratios'])}) | "
            f"{r['skeleton']['stories_per_second']} | {r['skeleton_ratio']} ({_span(r['skeleton_ratios'])}) | "
            f"{_span(r['ready_to_agent_started_p50s'])} | {_span(r['answer_to_state_written_p50s'])} | "
            f"{b['ready_to_agent_started_ms']['p50']}/{b['ready_to_agent_started_ms']['p95']} | "
            f"{b['answer_to_state_written_ms']['p50']}/{b['answer_to_state_written_ms']['p95']} | "
            f"{b['answer_to_state_recorded_ms']['p50']}/{b['answer_to_state_recorded_ms']['p95']} | "
            f"{b['answer_to_next_agent_started_ms']['p50']}/"
            f"{b['answer_to_next_agent_started_ms']['p95']} | {p['step_ms']['p50']}/{p['step_ms']['p95']} | "
            f"{r['skeleton']['step_ms']['p50']}/{r['skeleton']['step_ms']['p95']} | "
            f"{b['events_per_story']} ({b['master_events_per_story']}/{b['slave_events_per_story']}/"
            f"{b['resident_events_per_story']}) | {sum(b['workflow_tasks_per_story'].values()):.2f} | "
            f"{b['cpu_ms_per_story']} | {p['cpu_ms_per_activity']} | {b['master_runs']} | "
            f"{r['load_average'][0]}/{r['load_average'][3]} |"
        )
    last = result["rows"][-1]["bso"] if result["rows"] else None
    if last:
        lines += ["", f"Where the events go (N = {last['n']}, per story):", "",
                  "| workflow: event | per story |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in last["events_per_story_by_type"].items() if v >= 0.05]
    if result.get("profile"):
        prof = result["profile"]
        lines += ["", f"Where the BSO worker's CPU goes (py-spy, the thread holding the GIL; N = {prof['n']}, "
                  f"{prof['samples']} samples, a sprint of its own):", "",
                  "| function | on the stack | running itself |", "|---|---|---|"]
        lines += [f"| {h['function']} | {h['inclusive']:.1%} | {h['own']:.1%} |" for h in prof["hotspots"]]
        lines += ["", "The functions that ran most themselves:", "", "| function | running itself | on the stack |",
                  "|---|---|---|"]
        lines += [f"| {h['function']} | {h['own']:.1%} | {h['inclusive']:.1%} |" for h in prof["running_itself"]]
    for row in result["rows"]:
        b = row["bso"]
        failures = b.get("workflow_task_failures", [])
        lines += ["", f"N = {b['n']}: {len(failures)} failed workflow task(s), "
                  f"{b.get('unhandled_command_races', 0)} signal(s) racing a workflow's end (UnhandledCommand, retried)"]
        lines += [f"- {failure}" for failure in failures]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 200, 1000])
    parser.add_argument("--lanes", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3, help="runs per N (the row shows the median ratio)")
    parser.add_argument("--workers", type=int, default=1,
                        help="worker processes for BSO, and as many for the baseline and the skeleton")
    parser.add_argument("--batch-size", type=int, default=10,
                        help="BSO's batch_size (stories per Slave): each batch costs a child workflow and a few "
                        "workflow tasks of the Master, shared by its stories")
    parser.add_argument("--profile", action="store_true",
                        help="then one more BSO sprint of the largest N, its worker profiled with py-spy")
    args = parser.parse_args()
    # The worker processes (BSO's and the baseline's) cache bytecode, as on a default Python install: with
    # PYTHONDONTWRITEBYTECODE set (some CI images and containers do), the workflow sandbox compiles each
    # workflow module from source for every new workflow (a Slave per batch), a cost of the machine's setup.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    with tempfile.TemporaryDirectory(prefix="bso-bench-") as tmp:
        result = asyncio.run(
            run(args.sizes, args.lanes, Path(tmp), args.repeat, args.workers, args.batch_size, args.profile)
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    (RESULTS / f"bench-{stamp}.json").write_text(json.dumps(result, indent=2))
    table = markdown(result)
    (RESULTS / f"bench-{stamp}.md").write_text(table)
    print(table)
    print(f"written: bench/results/bench-{stamp}.json and .md")


if __name__ == "__main__":
    main()
