"""Crash and restart trials: a sprint survives `kill -9` of the worker and of the server, and a closed laptop.

    .venv/bin/python -m bench.crash_trials       # long form: 10 worker kills, 3 server kills, 4 suspensions
    .venv/bin/python -m bench.crash_trials --worker-kills 3 --server-kills 1 --suspensions 2 --seed 7

One local dev server (SQLite file) and the real worker process (`python -m workers.main`), both owned
by this script and stopped by pid. A sprint of simulated agents taking ~200 ms each (12 stories, copied
onto more epics until the interruptions asked for fit into it: 36 stories for the long form) runs once
uninterrupted (the reference), then once with the worker killed (-9) at random moments and restarted,
once with the server killed (-9) and restarted on its database file, and once with a closed laptop: the
worker suspended (SIGSTOP) for 3-8 s, longer than the agents' heartbeat timeout, then continued, every
other time together with the server. Each interrupted run must end with the reference's story states,
report (its deterministic parts) and status-file values, and no dispatch may have finished twice in the
simulated agents' ledger (answers delivered once are re-delivered from `.sprint-session/dispatches/`,
never recomputed; a retry that finds its predecessor still running waits for it). The time from each
restart (or resumption) to the sprint's next story-state transition is measured and printed (median, p95).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.client import Client, WorkflowExecutionStatus

from bench.infra import DevServer, WorkerProcess, make_project, percentile, status_values
from bso.constants import CHILD_WORKFLOW_TASK_TIMEOUT, SPRINT_TASK_QUEUE
from bso.models import SprintInput, SprintReport
from workers.main import STICKY_SCHEDULE_TO_START
from workflows.sprint_master import SprintMasterWorkflow

# 12 stories on every path the engine has: creation, story review loops, dev, review-fix loops.
STORIES = {
    "1-1-sign-up": "backlog",
    "1-2-log-in": "ready-for-dev",
    "1-3-log-out": "review",
    "1-4-reset-password": "needs-fix",
    "2-1-list-items": "ready-for-dev",
    "2-2-add-item": "backlog",
    "2-3-edit-item": "review",
    "2-4-delete-item": "in-progress",
    "3-1-search": "story-doc-review",
    "3-2-filters": "ready-for-dev",
    "3-3-export": "review",
    "3-4-import": "ready-for-dev",
}
SIMULATION = {
    "default": {"duration_ms": 200, "tokens": 1000},
    "stories": {
        "1-1": {"story_review": ["needs-improve", "passed"], "review": ["HIGH", "none"]},
        "1-2": {"review": ["MEDIUM", "LOW"]},
        "2-2": {"review": ["CRITICAL", "HIGH", "none"]},
        "3-2": {"fail": {"review": "error"}},
        "3-4": {"review": ["HIGH"], "tokens": 2500},
    },
}
CONFIG = {
    "batch_size": 3,
    "max_concurrent_slaves": 2,
    # A killed worker's agent attempt is noticed after 2 s without heartbeat, and retried 0.5 s later.
    "agent_retry": {"heartbeat_timeout_seconds": 2, "initial_interval_seconds": 0.5, "maximum_attempts": 20},
}
EPICS = 3  # STORIES span epics 1-3
# Worker kills that fit, with room, into one run of the 12 stories: each kill waits 0.3-2 s and its
# recovery ~3.5 s (the heartbeat timeout, the retry, the worker's start), while the sprint runs ~7 s.
KILLS_PER_SET = 4


def _shifted(key: str, copy: int) -> str:
    """A story key of epic E as epic E + EPICS * copy ("1-2-log-in", 1 -> "4-2-log-in")."""
    epic, rest = key.split("-", 1)
    return f"{int(epic) + EPICS * copy}-{rest}"


def sprint_stories(sets: int) -> dict[str, str]:
    """The 12 stories `sets` times over (epics 1-3, 4-6, ...): the same paths, a longer sprint."""
    return {_shifted(key, c): state for c in range(sets) for key, state in STORIES.items()}


def sprint_simulation(sets: int) -> dict[str, Any]:
    """SIMULATION with each story's script repeated for its copies."""
    scripts = {_shifted(key, c): script for c in range(sets) for key, script in SIMULATION["stories"].items()}
    return {**SIMULATION, "stories": scripts}


def sets_for(worker_kills: int, server_kills: int, suspensions: int = 0) -> int:
    """How many copies of the 12 stories the sprint needs so that the interruptions asked for all land in it
    (the sprint stands still while suspended, so a suspension takes no more of it than a kill)."""
    return max(1, math.ceil(max(worker_kills, server_kills, suspensions) / KILLS_PER_SET))


# The trials' interruptions: kill -9 of the worker or of the server (then started again), or a suspension.
INTERRUPTIONS = {"worker": "kill", "server": "kill", "suspend": "suspension"}
RESTARTS = {"worker": "restart", "server": "restart", "suspend": "resumption"}
TRIAL_NAMES = {"worker": "worker kills", "server": "server kills", "suspend": "suspensions"}


@dataclass
class TrialResult:
    kind: str
    interruptions_done: int  # fewer than asked when the sprint finished first
    report: dict[str, Any]
    values: dict[str, str]
    ledger: list[dict[str, Any]]
    recoveries: list[float] = field(default_factory=list)  # seconds, restart -> next state transition
    wall_seconds: float = 0.0
    # WORKFLOW_TASK_TIMED_OUT events: timeout type (see TIMEOUT_MEANINGS) -> workflow type -> count.
    task_timeouts: dict[str, dict[str, int]] = field(default_factory=dict)
    answers_redelivered: int = 0  # by a retried attempt, from the answer its predecessor recorded

    def finished_twice(self) -> list[str]:
        counts = Counter(r["dispatch_id"] for r in self.ledger if r["event"] == "finished")
        return sorted(d for d, n in counts.items() if n > 1)

    def reruns(self) -> int:
        """Attempts started again after an interruption (allowed: at-least-once for unfinished work)."""
        counts = Counter(r["dispatch_id"] for r in self.ledger if r["event"] == "started")
        return sum(n - 1 for n in counts.values())


def deterministic_report(report: SprintReport) -> dict[str, Any]:
    """The parts of a report that do not depend on timing: stories, statuses, rounds, dispatches, tokens."""
    return {
        "status": report.status.value,
        "stories": dict(sorted(report.stories.items())),
        "tokens_used": report.tokens_used,
        "batch_plan": [b.stories for b in report.batch_plan.batches] if report.batch_plan else [],
        "batches": [
            {
                "batch_id": b.batch_id,
                "status": b.status.value,
                "tokens_used": b.tokens_used,
                "review_fix_rounds": dict(sorted(b.results.review_fix_rounds.items())),
                "agents_dispatched": {r.story_key: r.agents_dispatched for r in b.results.story_results},
                "final_states": {r.story_key: r.final_state for r in b.results.story_results},
                "agents_created": b.results.total_agents_created,
                "agents_destroyed": b.results.total_agents_destroyed,
            }
            for b in report.batches
        ],
    }


def read_ledger(root: Path) -> list[dict[str, Any]]:
    path = root / ".sprint-session" / "simulated-agent-ledger.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def story_states(root: Path) -> dict[str, str]:
    try:
        return {k: v for k, v in status_values(root).items() if not k.startswith("epic-")}
    except (OSError, IndexError):
        return {}


async def _closed(client: Client, workflow_id: str) -> bool:
    try:
        desc = await client.get_workflow_handle(workflow_id).describe()
    except Exception:  # the server may be restarting
        return False
    return desc.status is not None and desc.status != WorkflowExecutionStatus.RUNNING


async def _next_transition(root: Path, before: dict[str, str], client_of, workflow_id: str, limit: float) -> float | None:
    """Seconds until a story value in the status file differs from `before` (None: the sprint ended first)."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if story_states(root) != before:
            return time.monotonic() - start
        if await _closed(client_of(), workflow_id):
            return None if story_states(root) == before else time.monotonic() - start
        await asyncio.sleep(0.05)
    raise TimeoutError(f"no state transition within {limit}s of a restart")


# What a workflow task timeout in a trial means: where the killed (or suspended) worker left the task.
TIMEOUT_MEANINGS = {
    "schedule_to_start": f"on the lost worker's sticky queue (after {STICKY_SCHEDULE_TO_START.total_seconds():g} s)",
    "start_to_close": f"held by the lost worker (after the task timeout: "
    f"{CHILD_WORKFLOW_TASK_TIMEOUT.total_seconds():g} s for Slaves and residents, 10 s for the Master)",
}


async def _history_facts(client: Client, session: str) -> tuple[dict[str, dict[str, int]], int]:
    """From the sprint's histories (every run): WORKFLOW_TASK_TIMED_OUT events (timeout type -> workflow type
    -> count), and the agent answers a retried attempt re-delivered from the record instead of working again."""
    counts: dict[str, Counter[str]] = {}
    redelivered = 0
    async for wf in client.list_workflows(f'BsoSessionId = "{session}"'):
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        for e in history.events:
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
                how = TimeoutType.Name(e.workflow_task_timed_out_event_attributes.timeout_type)
                counts.setdefault(how.removeprefix("TIMEOUT_TYPE_").lower(), Counter())[wf.workflow_type] += 1
            elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                payloads = e.activity_task_completed_event_attributes.result.payloads
                result = json.loads(payloads[0].data) if payloads else None
                redelivered += isinstance(result, dict) and result.get("replayed_from_ledger") is True
    return {how: dict(sorted(by_type.items())) for how, by_type in sorted(counts.items())}, redelivered


async def _diagnose(client: Client, session: str, workdir: Path) -> str:
    """What a stuck sprint was waiting for: pending activities and children, and the logs' tails."""
    lines = []
    try:
        async for wf in client.list_workflows(f'BsoSessionId = "{session}" AND ExecutionStatus = "Running"'):
            desc = await client.get_workflow_handle(wf.id, run_id=wf.run_id).describe()
            pending = [
                f"{a.activity_type.name} attempt {a.attempt} state {a.state} last failure {a.last_failure.message!r}"
                for a in desc.raw_description.pending_activities
            ]
            lines.append(f"{wf.id}: history {desc.history_length}, pending {pending}, "
                         f"pending workflow task {desc.raw_description.pending_workflow_task}")
    except Exception as err:  # noqa: BLE001 - diagnostics only
        lines.append(f"(describe failed: {err})")
    for name in ("worker.log", "server.log"):
        path = workdir / name
        if path.exists():
            lines.append(f"--- tail of {name}:\n" + "\n".join(path.read_text(errors="replace").splitlines()[-25:]))
    return "\n".join(lines)


async def run_trial(
    workdir: Path, server: DevServer, client: Client, kind: str, interruptions: int, rng: random.Random, log=print,
    sets: int = 1,
) -> TrialResult:
    """One sprint of `sets` copies of the 12 stories on a fresh project; `kind` is none, worker, server or
    suspend."""
    root = workdir / f"project-{kind}-{uuid.uuid4().hex[:6]}"
    make_project(root, sprint_stories(sets))
    worker = WorkerProcess(server.address, workdir / "worker.log")
    worker.start()
    clients = {"client": client}
    session = f"crash-{kind}-{uuid.uuid4().hex[:6]}"
    recoveries: list[float] = []
    began = time.monotonic()
    done = 0
    try:
        await client.start_workflow(
            SprintMasterWorkflow.run,
            SprintInput(
                project_root=str(root), session_id=session, simulation=sprint_simulation(sets), config_overrides=CONFIG
            ),
            id=session,
            task_queue=SPRINT_TASK_QUEUE,
        )
        for n in range(interruptions):
            await asyncio.sleep(rng.uniform(0.3, 2.0))
            label = f"{kind} {INTERRUPTIONS[kind]} {n + 1}"
            if await _closed(clients["client"], session):
                log(f"  {label}: sprint already finished")
                break
            before = story_states(root)
            done += 1
            if kind == "worker":
                worker.kill9()
                await asyncio.sleep(rng.uniform(0.0, 0.5))
                worker.start()
                restarted = time.monotonic()
            elif kind == "server":
                server.kill9()
                await asyncio.sleep(rng.uniform(0.0, 0.5))
                server.start()
                restarted = time.monotonic()  # the server's own start-up counts, as the worker's does
                clients["client"] = await server.wait_ready()
            else:
                # A closed laptop: the worker stands still (SIGSTOP) longer than the agents' heartbeat timeout and
                # the sticky queue's, sometimes longer than a workflow task's; every other time the dev server on
                # the same laptop stands still with it, else the server (elsewhere) runs on and times them out.
                with_server = n % 2 == 1
                held = [worker, server] if with_server else [worker]
                for proc in held:
                    proc.suspend()
                await asyncio.sleep(rng.uniform(3.0, 8.0))
                for proc in reversed(held):
                    proc.resume()
                restarted = time.monotonic()
                label += " (worker and server)" if with_server else " (worker)"
            try:
                seconds = await _next_transition(root, before, lambda: clients["client"], session, limit=180)
            except TimeoutError as err:
                raise TimeoutError(f"{err}\n{await _diagnose(clients['client'], session, workdir)}") from None
            if seconds is not None:  # (counted from the restart, not from when the wait began)
                recoveries.append(time.monotonic() - restarted)
                log(f"  {label}: next state transition {recoveries[-1]:.2f}s after the {RESTARTS[kind]}")
            else:
                log(f"  {label}: sprint finished without a further transition")
        client = clients["client"]
        deadline = time.monotonic() + 300
        while not await _closed(client, session):
            if time.monotonic() > deadline:
                raise TimeoutError(f"sprint {session} did not finish\n{await _diagnose(client, session, workdir)}")
            await asyncio.sleep(0.2)
        report = await client.get_workflow_handle_for(SprintMasterWorkflow.run, session).result()
        task_timeouts, redelivered = await _history_facts(client, session)
    finally:
        worker.stop()
    return TrialResult(
        kind=kind,
        interruptions_done=done,
        report=deterministic_report(report),
        values=status_values(root),
        ledger=read_ledger(root),
        recoveries=recoveries,
        wall_seconds=time.monotonic() - began,
        task_timeouts=task_timeouts,
        answers_redelivered=redelivered,
    )


def compare(reference: TrialResult, trial: TrialResult) -> list[str]:
    """Every way `trial` differs from the uninterrupted reference (empty: identical)."""
    problems = []
    if trial.report != reference.report:
        problems.append(f"{trial.kind}: report differs:\n  {trial.report}\n  vs reference\n  {reference.report}")
    if trial.values != reference.values:
        diff = {k: (reference.values.get(k), trial.values.get(k)) for k in reference.values.keys() | trial.values.keys()
                if reference.values.get(k) != trial.values.get(k)}
        problems.append(f"{trial.kind}: status file differs (reference, trial): {diff}")
    if twice := trial.finished_twice():
        problems.append(f"{trial.kind}: completed agent work redone for {twice}")
    return problems


async def run_trials(
    worker_kills: int, server_kills: int, seed: int, workdir: Path, log=print, suspensions: int = 0
) -> dict[str, Any]:
    rng = random.Random(seed)
    sets = sets_for(worker_kills, server_kills, suspensions)
    asked = {"worker": worker_kills, "server": server_kills, "suspend": suspensions}
    log(f"seed {seed} (rerun: python -m bench.crash_trials --worker-kills {worker_kills} "
        f"--server-kills {server_kills} --suspensions {suspensions} --seed {seed})")
    server = DevServer(workdir / "temporal.db", workdir / "server.log")
    server.start()
    try:
        client = await server.wait_ready()
        log("reference run (no kills)")
        reference = await run_trial(workdir, server, client, "none", 0, rng, log, sets)
        runs = len(reference.ledger) // 2
        log(f"  {len(sprint_stories(sets))} stories, {reference.wall_seconds:.1f}s, {runs} agent runs")
        trials = []
        if worker_kills:
            log(f"worker trial: {worker_kills} x kill -9 of the worker")
            trials.append(await run_trial(workdir, server, client, "worker", worker_kills, rng, log, sets))
        if server_kills:
            log(f"server trial: {server_kills} x kill -9 of the server")
            trials.append(await run_trial(workdir, server, client, "server", server_kills, rng, log, sets))
        if suspensions:
            log(f"suspend trial: {suspensions} x a closed laptop (SIGSTOP for 3-8 s, then SIGCONT): the worker, "
                "every other time with the server")
            trials.append(await run_trial(workdir, server, client, "suspend", suspensions, rng, log, sets))
    finally:
        server.stop()
    problems = [p for t in trials for p in compare(reference, t)]
    if twice := reference.finished_twice():
        problems.append(f"reference: work finished twice for {twice}")
    summary: dict[str, Any] = {"seed": seed, "reference_seconds": round(reference.wall_seconds, 2), "trials": []}
    for t in trials:
        summary["trials"].append(
            {
                "kind": t.kind,
                "interruptions_done": t.interruptions_done,
                "interruptions_asked": asked[t.kind],
                "wall_seconds": round(t.wall_seconds, 2),
                "interrupted_attempts_rerun": t.reruns(),
                "recovery_seconds": [round(r, 2) for r in t.recoveries],
                "recovery_median": round(statistics.median(t.recoveries), 2) if t.recoveries else None,
                "recovery_p95": round(percentile(t.recoveries, 95), 2) if t.recoveries else None,
                "workflow_task_timeouts": t.task_timeouts,
                "answers_redelivered": t.answers_redelivered,
            }
        )
    all_recoveries = [r for t in trials for r in t.recoveries]
    summary["recovery_median"] = round(statistics.median(all_recoveries), 2) if all_recoveries else None
    summary["recovery_p95"] = round(percentile(all_recoveries, 95), 2) if all_recoveries else None
    summary["problems"] = problems
    return summary


def print_summary(summary: dict[str, Any], log=print) -> None:
    for t in summary["trials"]:
        finished_first = t["interruptions_done"] < t["interruptions_asked"]
        log(
            f"{TRIAL_NAMES[t['kind']]}: {t['interruptions_done']} of {t['interruptions_asked']}"
            f"{' (the sprint finished first)' if finished_first else ''}, wall {t['wall_seconds']}s, "
            f"interrupted attempts rerun {t['interrupted_attempts_rerun']}, "
            f"answers re-delivered from the record {t['answers_redelivered']}, "
            f"{RESTARTS[t['kind']]} -> next transition: median {t['recovery_median']}s, p95 {t['recovery_p95']}s"
        )
        for how, by_type in t["workflow_task_timeouts"].items():
            caught = ", ".join(f"{n} {wf_type}" for wf_type, n in by_type.items())
            log(f"{'':>6} workflow tasks timed out {TIMEOUT_MEANINGS.get(how, how)}: {caught}")
    log(f"all interruptions: median {summary['recovery_median']}s, p95 {summary['recovery_p95']}s")
    log("identical to the uninterrupted run, no finished work redone" if not summary["problems"] else "PROBLEMS:")
    for p in summary["problems"]:
        log("  " + p)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.crash_trials", description=__doc__.splitlines()[0])
    parser.add_argument("--worker-kills", type=int, default=10)
    parser.add_argument("--server-kills", type=int, default=3)
    parser.add_argument("--suspensions", type=int, default=4,
                        help="closed-laptop trial: SIGSTOP/SIGCONT of the worker, every other time with the server")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    with tempfile.TemporaryDirectory(prefix="bso-crash-") as tmp:
        summary = asyncio.run(
            run_trials(args.worker_kills, args.server_kills, seed, Path(tmp), suspensions=args.suspensions)
        )
    print_summary(summary)
    raise SystemExit(1 if summary["problems"] else 0)


if __name__ == "__main__":
    main()
