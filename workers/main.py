"""The BSO worker process: `python -m workers.main`.

Serves both task queues by default: `bso-sprint` (the workflows, and the cheap status-file
activities they call) and `bso-agents` (the agent activities, one slot per agent this host can run).
Reads TEMPORAL_ADDRESS (default localhost:7233) and TEMPORAL_NAMESPACE (default default).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import contextlib
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import NoReturn

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from activities.agents import run_agent
from activities.backends.command import stop_sprint_agents
from activities.browser import browse
from activities.deadlines import deadline_lateness
from activities.debugger import analyze_failure
from activities.git_ops import finish_story_git
from activities.improvements import add_improvement_stories, propose_improvements
from activities.po_gates import load_story_scope, record_gate
from activities.researcher import research
from activities.status_file import load_sprint_status, wait_for_status_file, write_story_status
from activities.summary import write_execution_summary
from bso.constants import AGENTS_TASK_QUEUE, SPRINT_TASK_QUEUE, agents_task_queue_for
from bso.temporal_client import connect, connect_config, connect_failure_reason, ensure_search_attributes
from workers.sandbox import workflow_runner
from workers.telemetry import TelemetryInterceptor, configure_logging, worker_runtime
from workflows.inbound_guard import InboundGuard
from workflows.residents import ResidentWorkflow
from workflows.sprint_master import SprintMasterWorkflow
from workflows.sprint_slave import SprintSlaveWorkflow

WORKFLOWS = [SprintMasterWorkflow, SprintSlaveWorkflow, ResidentWorkflow]
SPRINT_ACTIVITIES = [
    load_sprint_status,
    write_story_status,
    wait_for_status_file,
    write_execution_summary,
    propose_improvements,
    add_improvement_stories,
    load_story_scope,
    record_gate,
    deadline_lateness,
]
AGENT_ACTIVITIES = [run_agent, finish_story_git, analyze_failure, research, browse, stop_sprint_agents]

log = logging.getLogger("bso.worker")

# A workflow task handed to a worker that died (kill -9, a closed laptop) waits this long on that worker's
# sticky queue before any worker may take it (the SDK's default is 10 s, which every crash recovery paid).
# Shorter only costs a full history replay when a busy live worker leaves a task waiting that long.
STICKY_SCHEDULE_TO_START = timedelta(seconds=3)
# An activity hears of its cancellation (a cancelled sprint's TERMINATE_DIRECTIVE) only when its heartbeat
# reaches the server, which the SDK holds back up to 0.8 x the heartbeat timeout (48 s for an agent's 60 s):
# the agent worked on that long after the cancel. Sent at least this often, it hears within a few seconds.
HEARTBEAT_THROTTLE = timedelta(seconds=2)
# Every worker (and replayer) of BSO workflows: the metrics, and the guard the workflows' signals rely on.
WORKFLOW_INTERCEPTORS = [TelemetryInterceptor(), InboundGuard()]


def build_workers(
    client: Client,
    queues: Sequence[str] = (SPRINT_TASK_QUEUE, AGENTS_TASK_QUEUE),
    *,
    queue_prefix: str = "",
    max_concurrent_agents: int = 8,
) -> list[Worker]:
    """The workers for the given queues; tests give each run its own `queue_prefix`."""
    sprint_task_queue = queue_prefix + SPRINT_TASK_QUEUE
    agents_task_queue = agents_task_queue_for(sprint_task_queue)
    workers = []
    if SPRINT_TASK_QUEUE in queues:
        workers.append(
            Worker(
                client,
                task_queue=sprint_task_queue,
                workflows=WORKFLOWS,
                # run_agent too: simulated agents run on the sprint queue (bso.constants.agent_task_queue).
                activities=[*SPRINT_ACTIVITIES, run_agent],
                interceptors=WORKFLOW_INTERCEPTORS,
                workflow_runner=workflow_runner(),
                sticky_queue_schedule_to_start_timeout=STICKY_SCHEDULE_TO_START,
                max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
            )
        )
    if AGENTS_TASK_QUEUE in queues:
        workers.append(
            Worker(
                client,
                task_queue=agents_task_queue,
                activities=AGENT_ACTIVITIES,
                max_concurrent_activities=max_concurrent_agents,
                interceptors=[TelemetryInterceptor()],
                max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
            )
        )
    return workers


CONNECT_PATIENCE_SECONDS = float(os.environ.get("BSO_WORKER_CONNECT_SECONDS", "120"))


# What a server that is (re)starting answers: the worker waits for it.
_NOT_UP_YET = {RPCStatusCode.UNAVAILABLE, RPCStatusCode.UNKNOWN, RPCStatusCode.DEADLINE_EXCEEDED}


class ServerUnreachable(Exception):
    """No Temporal server answered within CONNECT_PATIENCE_SECONDS: said in one line, not a traceback."""


def exit_unreachable(message: str) -> NoReturn:
    """Say it and end the process at once. The SDK runtime's log-forwarding thread may still call into Python:
    an interpreter finalizing under it aborted now and then (SIGABRT, `PyGILState_Release`) instead of exiting 1."""
    print(message, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)


async def _connect_patiently(runtime) -> tuple[Client, list[str]]:
    """A client, with BSO's search attributes registered (those it added): a worker started while the server is
    (re)starting waits for it instead of dying, at the connect or at its first call (a crash trial's server
    killed there: `RPCError: transport error`)."""
    deadline = asyncio.get_running_loop().time() + CONNECT_PATIENCE_SECONDS
    delay = 0.5
    while True:
        try:
            client = await connect(runtime=runtime)
            return client, await ensure_search_attributes(client)
        except (RuntimeError, RPCError) as err:  # RuntimeError: the SDK's "Failed client connect"
            if isinstance(err, RPCError) and err.status not in _NOT_UP_YET:
                raise
            if asyncio.get_running_loop().time() + delay > deadline:
                used = connect_config()  # what connect() used: the environment's, or a profile file's
                last = " ".join(str(err).split())[:300]
                raise ServerUnreachable(
                    f"cannot reach the Temporal server at {used['target_host']} (namespace {used['namespace']}) "
                    f"after {CONNECT_PATIENCE_SECONDS:g} s (last: {last}): start it (`make server`, `bso server`), "
                    "or point the worker at it (TEMPORAL_ADDRESS, a Temporal profile)"
                ) from None
            log.warning(
                "Temporal server not reachable at %s yet (%s); retrying",
                connect_config()["target_host"], connect_failure_reason(err),
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


async def run(
    queues: Sequence[str], max_concurrent_agents: int, metrics_address: str | None = None, queue_prefix: str = ""
) -> None:
    """Serve `queues` until SIGINT/SIGTERM; Prometheus metrics on `metrics_address` (host:port) if given."""
    configure_logging()
    runtime = worker_runtime(metrics_address)
    client, added = await _connect_patiently(runtime)
    if metrics_address:
        log.info("Prometheus metrics on http://%s/metrics", metrics_address)
    if added:
        log.info("registered search attributes: %s", ", ".join(added))
    workers = build_workers(client, queues, queue_prefix=queue_prefix, max_concurrent_agents=max_concurrent_agents)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "worker polling %s on %s (namespace %s)",
        ", ".join(w.task_queue for w in workers),  # the queues' real names, with their --queue-prefix
        client.service_client.config.target_host,
        client.namespace,
    )
    async with contextlib.AsyncExitStack() as stack:
        for worker in workers:
            await stack.enter_async_context(worker)
        await stop.wait()
    log.info("worker stopped")


def _int_within(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer from `low` (to `high`), refused in one line as `bso worker` refuses it (a
    negative --max-concurrent-agents failed the worker with a traceback once the server answered)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low or (high is not None and value > high):
            within = f"from {low} to {high}" if high is not None else f"{low} or more"
            raise argparse.ArgumentTypeError(f"{value} is not {within}")
        return value

    return parse


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m workers.main", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--queue",
        choices=[SPRINT_TASK_QUEUE, AGENTS_TASK_QUEUE],
        action="append",
        help="serve only this task queue (repeatable; default: both)",
    )
    parser.add_argument("--max-concurrent-agents", type=_int_within(1), default=8)
    parser.add_argument("--metrics-port", type=_int_within(1, 65535), help="serve Prometheus metrics on this port (e.g. 9464)")
    parser.add_argument("--metrics-host", default="127.0.0.1", help="address of the metrics endpoint")
    parser.add_argument(
        "--queue-prefix", default="", help="prefix of both task queue names (tests: a worker of its own)"
    )
    args = parser.parse_args(argv)
    metrics = f"{args.metrics_host}:{args.metrics_port}" if args.metrics_port else None
    queues = args.queue or [SPRINT_TASK_QUEUE, AGENTS_TASK_QUEUE]
    try:
        asyncio.run(run(queues, args.max_concurrent_agents, metrics, args.queue_prefix))
    except ServerUnreachable as err:
        exit_unreachable(f"worker: error: {err}")
    except KeyboardInterrupt:  # while it still waited for the server (then SIGINT stops it gracefully)
        sys.exit(130)


if __name__ == "__main__":
    main()
