"""Child processes in their own process group: started with create_subprocess_exec (never a shell),
killed as a whole group (SIGTERM, then SIGKILL) so no grandchild outlives a timeout or a cancellation."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from temporalio import activity


def machine_id() -> str:
    """This host and boot: a process group id recorded elsewhere or before a reboot names another process."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:  # no procfs (macOS): the host name alone
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


async def kill_group(pgid: int, grace_seconds: float = 5.0) -> None:
    """SIGTERM the group, wait up to `grace_seconds`, then SIGKILL what is left."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return
        await asyncio.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def kill_group_now(pgid: int) -> None:
    """Synchronous last resort (cancellation cleanup, a previous attempt's orphan)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        time.sleep(0.2)


@dataclass
class Finished:
    returncode: int | None
    output: str
    timed_out: bool


async def run_command(
    argv: list[str], cwd: str, env: dict[str, str] | None = None, timeout: float = 900, grace: float = 5.0
) -> Finished:
    """Run a short command (git, a verification command) in its own group, output merged."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=timeout)
    except asyncio.TimeoutError:
        await kill_group(proc.pid, grace)
        out = b""
        if proc.stdout is not None:
            try:
                out = await asyncio.wait_for(proc.stdout.read(), timeout=2)
            except (asyncio.TimeoutError, ValueError):
                pass
        await proc.wait()
        return Finished(None, out.decode(errors="replace"), True)
    except asyncio.CancelledError:
        kill_group_now(proc.pid)
        raise
    return Finished(proc.returncode, out.decode(errors="replace"), False)


@asynccontextmanager
async def heartbeating(detail: Callable[[], object], every: float) -> AsyncIterator[None]:
    """Heartbeat `detail()` every `every` seconds while the block runs (work that may outlast the activity's
    heartbeat timeout); nothing outside an activity (a direct call) or in a local one (it has no heartbeat)."""
    if not activity.in_activity() or activity.info().is_local:
        yield
        return

    async def beat() -> None:
        while True:
            activity.heartbeat(detail())
            await asyncio.sleep(every)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
