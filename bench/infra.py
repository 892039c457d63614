"""Processes the proofs and the benchmark own: a local Temporal dev server on a SQLite file and BSO
worker processes (`python -m workers.main`). Each is started by pid and stopped by that pid only."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from temporalio.client import Client

from bso.dev_server import dev_server_args
from bso.models import DEFAULT_STATUS_FILE
from bso.temporal_client import connect

REPO = Path(__file__).resolve().parent.parent


def binary(name: str) -> str:
    candidate = Path(sys.executable).parent / name
    if not candidate.exists():
        raise RuntimeError(f"{candidate} not found: run `make venv`")
    return str(candidate)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _kill(proc: subprocess.Popen[Any] | None, sig: int) -> None:
    """Signal a process this module started and wait for it; one that ignores SIGTERM for 30 s gets SIGKILL.
    A suspended process is continued first (a stopped process acts on SIGTERM only once it runs)."""
    if proc is not None and proc.poll() is None:
        os.kill(proc.pid, sig)
        os.kill(proc.pid, signal.SIGCONT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def _suspend(proc: subprocess.Popen[Any] | None) -> None:
    """SIGSTOP a process this module started: it stands still, as on a closed laptop, until resumed."""
    if proc is not None and proc.poll() is None:
        os.kill(proc.pid, signal.SIGSTOP)


def _resume(proc: subprocess.Popen[Any] | None) -> None:
    if proc is not None and proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)


class DevServer:
    """`temporal server start-dev --headless` on a SQLite file; restartable on the same file and port."""

    def __init__(self, db_file: Path, log_file: Path, port: int | None = None) -> None:
        self.db_file = db_file
        self.log_file = log_file
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            binary("temporal"), "server", "start-dev", "--headless",
            "--db-filename", str(self.db_file),
            "--ip", "127.0.0.1", "--port", str(self.port),
            "--log-level", "error",
            *dev_server_args(),
        ]

    def start(self) -> None:
        log = open(self.log_file, "ab")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    async def wait_ready(self, timeout: float = 60) -> Client:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"dev server exited with {self.proc.returncode}; see {self.log_file}")
            try:
                client = await connect(self.address, "default")
                await client.count_workflows()
                return client
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    def kill9(self) -> None:
        _kill(self.proc, signal.SIGKILL)

    def suspend(self) -> None:
        _suspend(self.proc)

    def resume(self) -> None:
        _resume(self.proc)

    def stop(self) -> None:
        _kill(self.proc, signal.SIGTERM)


class WorkerProcess:
    """A worker process pointed at one server: BSO's (`workers.main`) unless another module is given."""

    def __init__(
        self, address: str, log_file: Path, extra_args: list[str] | None = None, module: str = "workers.main"
    ) -> None:
        self.address = address
        self.log_file = log_file
        self.extra_args = extra_args or []
        self.module = module
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "TEMPORAL_ADDRESS": self.address, "TEMPORAL_NAMESPACE": "default"}
        log = open(self.log_file, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module, *self.extra_args],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        log.close()

    def kill9(self) -> None:
        _kill(self.proc, signal.SIGKILL)

    def suspend(self) -> None:
        _suspend(self.proc)

    def resume(self) -> None:
        _resume(self.proc)

    def stop(self) -> None:
        _kill(self.proc, signal.SIGTERM)


HEADER = """# generated: 2026-01-05
# project: Bench
# story_location: _bmad-output/implementation-artifacts

generated: 2026-01-05
last_updated: 2026-01-05
project: Bench
project_key: BENCH
tracking_system: file-system
story_location: _bmad-output/implementation-artifacts

development_status:
"""


def make_project(root: Path, stories: dict[str, str]) -> Path:
    """A BMAD project whose status file lists `stories` (full key -> value), grouped by epic."""
    lines = [HEADER.rstrip("\n")]
    epics: dict[str, list[str]] = {}
    for key in stories:
        epics.setdefault(key.split("-")[0], []).append(key)
    for epic, keys in epics.items():
        lines.append(f"  epic-{epic}: backlog")
        lines.extend(f"  {key}: {stories[key]}" for key in keys)
        lines.append(f"  epic-{epic}-retrospective: optional")
    status = root / DEFAULT_STATUS_FILE
    status.parent.mkdir(parents=True, exist_ok=True)
    status.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return status


def many_stories(n: int, state: str = "review", per_epic: int = 50) -> dict[str, str]:
    return {f"{i // per_epic + 1}-{i % per_epic + 1}-story-{i + 1}": state for i in range(n)}


def status_values(root: Path) -> dict[str, str]:
    """Every `key: value` under development_status (story, epic and retrospective values)."""
    text = (root / DEFAULT_STATUS_FILE).read_text(encoding="utf-8")
    values = {}
    for line in text.split("development_status:", 1)[1].splitlines():
        line = line.split("#", 1)[0].strip()
        if ":" in line:
            key, value = line.split(":", 1)
            values[key.strip()] = value.strip()
    return values


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]
