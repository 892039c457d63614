"""Child processes in their own process group: started with create_subprocess_exec (never a shell),
killed as a whole group (SIGTERM, then SIGKILL) so no grandchild outlives a timeout or a cancellation; a
grandchild that left the group (`setsid`) is found by the mark in its environment (agent_launcher.GROUP_MARK)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from temporalio import activity

from activities.agent_launcher import GROUP_MARK, marked_pids, signal_marked


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


def _signal_group(pgid: int, mark: str | None, sig: int) -> bool:
    """`sig` to the group and to what carries its mark; False when neither has a process left."""
    try:
        os.killpg(pgid, sig)
        alive = True
    except ProcessLookupError:
        alive = False
    return (signal_marked(mark, sig) if mark is not None else False) or alive


async def kill_group(pgid: int, grace_seconds: float = 5.0, mark: str | None = None) -> None:
    """SIGTERM the group, wait up to `grace_seconds`, then SIGKILL what is left. With a mark (GROUP_MARK in the
    environment the group was started with), what left the group (`setsid`) goes too."""
    if not _signal_group(pgid, mark, signal.SIGTERM):
        return
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline:
        if not group_alive(pgid) and not (mark is not None and marked_pids(mark)):
            return
        await asyncio.sleep(0.1)
    _signal_group(pgid, mark, signal.SIGKILL)


def kill_group_now(pgid: int, mark: str | None = None) -> None:
    """Synchronous last resort (cancellation cleanup, a previous attempt's orphan)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not _signal_group(pgid, mark, sig):
            return
        time.sleep(0.2)


def processes_using(dirs: list[Path], file: Path, *, named: str = "") -> list[int] | None:
    """The live processes (by procfs) working in one of `dirs` (their working directory in it) or holding `file`
    open, this one aside; None where nothing tells (no procfs: macOS). `named`: only a process whose command's
    name starts so counts as working in `dirs` ("git": a shell or an editor in the user's checkout holds no ref
    lock). Another user's process shows its name, not its directory: with `named`, one of theirs so named may
    work in `dirs` (the user's checkout), so one running makes it None too; without, `dirs` are BSO's own
    (their other processes are never ours to wait for, as agent_launcher.marked_pids)."""
    if not has_procfs():
        return None
    roots = [os.path.realpath(d) for d in dirs]
    target = os.path.realpath(file)
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        command = _command_name(name)
        try:
            cwd = os.readlink(f"/proc/{name}/cwd")
        except PermissionError:  # another user's
            if named and command.startswith(named):  # (without `named`: dirs no other user works in)
                return None
            continue
        except OSError:  # gone, or a zombie (it holds nothing)
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            fds = []
        holds = any(_link(f"/proc/{name}/fd/{fd}") == target for fd in fds)  # (one closed meanwhile: None)
        if holds or (command.startswith(named) and any(cwd == root or cwd.startswith(root + os.sep) for root in roots)):
            found.append(int(name))
    return found


def has_procfs() -> bool:
    """Whether procfs tells what processes run (Linux: yes; macOS: no)."""
    return Path("/proc/self").exists()


def _command_name(pid: str) -> str:
    """The process's command name (procfs' `comm`: readable for every user's process), "" if it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text(errors="replace").strip()
    except OSError:
        return ""


def _link(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


@dataclass
class Finished:
    returncode: int | None
    output: str
    timed_out: bool


# How long output is read after the command exited: a child it left running (a test server, a watcher) keeps its
# output open, and waiting for the end of it held a verification for its whole timeout.
OUTPUT_AFTER_EXIT_SECONDS = 2.0


async def run_command(
    argv: list[str], cwd: str, env: dict[str, str] | None = None, timeout: float = 900, grace: float = 5.0,
    mark: str | None = None,
) -> Finished:
    """Run a short command (git, a verification command) in its own group, output merged. It is done when the
    command exits; children it left holding the output open are killed after OUTPUT_AFTER_EXIT_SECONDS. A
    command out of time is killed, group and all, and what it printed is kept. What it starts in a session of
    its own is killed with it, found by `mark` (GROUP_MARK in its environment; one of its own if not given)."""
    mark = mark or f"command:{uuid.uuid4().hex}"
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env={**(os.environ if env is None else env), GROUP_MARK: mark},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    chunks: list[bytes] = []

    async def read() -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(1 << 16):
            chunks.append(chunk)

    reader = asyncio.create_task(read())
    deadline = time.monotonic() + timeout
    timed_out = False
    try:
        # Until the command exited and its output ended. asyncio's wait() also waits for the end of the output,
        # which a child the command left running holds open: the exit is read from the return code.
        while not (reader.done() and proc.returncode is not None):
            if proc.returncode is not None:  # exited (in time), its output held open by what it left running
                await asyncio.wait({reader}, timeout=OUTPUT_AFTER_EXIT_SECONDS)
                if not reader.done():
                    await kill_group(proc.pid, grace, mark)
                break
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                await kill_group(proc.pid, grace, mark)
                break
            if reader.done():  # the output closed, the command runs on: its exit (the output is no more)
                exited = asyncio.ensure_future(proc.wait())
                await asyncio.wait({exited}, timeout=left)
                exited.cancel()
            else:
                await asyncio.wait({reader}, timeout=min(0.25, left))
        await asyncio.wait({reader}, timeout=2)
        reader.cancel()  # (ended already, unless what holds the output is another user's)
    except asyncio.CancelledError:
        kill_group_now(proc.pid, mark)
        reader.cancel()
        raise
    output = b"".join(chunks).decode(errors="replace")
    return Finished(None if timed_out else proc.returncode, output, timed_out)


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
