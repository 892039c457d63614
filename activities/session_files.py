"""Where a sprint keeps its scratch files in the project: `.sprint-session/` (never in history)."""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import re
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from temporalio.exceptions import ApplicationError

# One atomic JSON write, defined in the launcher: it runs standalone (stdlib only, isolated mode).
from activities.agent_launcher import write_json_atomic
from bso.dispatch import written_by_this_run

SESSION_DIR = ".sprint-session"


def safe_name(identifier: str) -> str:
    """A filesystem-safe, collision-free name for an id such as `sprint-1/batch-2/1-3/4`."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", identifier).strip("._")[:80]
    digest = hashlib.sha1(identifier.encode()).hexdigest()[:8]
    return f"{readable}-{digest}"


def session_path(project_root: str, *parts: str) -> Path:
    path = Path(project_root, SESSION_DIR, *parts)
    try:
        # Never the project's folder itself: one moved away mid-sprint was made again, empty, and the sprint's
        # files went there (moved back, the project landed inside it).
        Path(project_root, SESSION_DIR).mkdir(exist_ok=True)
        # Checked at each write, not only at the start: a folder linked out of the project mid-sprint was
        # written through. A link is rare: one lstat, the whole check only then.
        if os.path.islink(Path(project_root, SESSION_DIR)) and (linked := session_dir_problem(project_root)):
            raise _session_dir_error(linked)
        path.parent.mkdir(parents=True, exist_ok=True)
    except FileNotFoundError:  # retried: put back, the sprint goes on
        raise ApplicationError(
            f"the project directory {project_root} is gone (moved or deleted?): put it back for the sprint to go on",
            type="ProjectRootMissing",
        ) from None
    except (FileExistsError, NotADirectoryError):  # a file where a folder must be: no retry mends that
        raise _session_dir_error(
            session_dir_problem(project_root) or f"cannot make {path.parent}: a file is in the way"
        ) from None
    return path


def _session_dir_error(message: str) -> ApplicationError:
    return ApplicationError(message, type="SessionDirError", non_retryable=True)


def session_dir_problem(project_root: str | Path) -> str | None:
    """What in the project stands where BSO keeps a sprint's scratch files, if anything (checked by `bso sprint
    start` before a sprint starts; a sprint started otherwise fails on it at once, naming it)."""
    directory = Path(project_root, SESSION_DIR)
    if directory.is_symlink() and not directory.resolve().is_relative_to(Path(project_root).resolve()):
        # Agents' prompts and outputs, the claim and the journal would be written wherever the link points.
        return (
            f"{directory} is a link out of the project (to {directory.resolve()}): BSO writes a sprint's scratch "
            "files there and keeps them in the project (remove the link)"
        )
    if directory.exists() and not directory.is_dir():
        return f"{directory} is not a directory: BSO keeps a sprint's scratch files there (move it away)"
    claim = directory / RUNNING_SPRINT_FILE
    if claim.exists() and not claim.is_file():
        return f"{claim} is not a file: BSO records the sprint running on the project there (remove it)"
    return None


LOCK_POLL_SECONDS = 0.05


@asynccontextmanager
async def polled_lock(path: Path, poll_seconds: float = LOCK_POLL_SECONDS) -> AsyncIterator[None]:
    """An exclusive flock on `path`, polled so that a cancelled activity stops waiting (and so that two
    coroutines of one worker never block its event loop on each other); the kernel releases it if the
    worker dies."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(poll_seconds)
        yield
    finally:
        os.close(fd)  # releases the lock


RUNNING_SPRINT_FILE = "running-sprint.json"


class ProjectBusyError(Exception):
    def __init__(self, holder: str, project_root: str, status_file: str | None = None) -> None:
        self.holder = holder
        where = f"{project_root}, on {status_file}" if status_file else project_root
        super().__init__(
            f"sprint {holder} is already running on {where}: two sprints would drive the same stories and "
            f"status file (wait for it, or `bso sprint shutdown {holder}` first)"
        )


def _recorded_claim(project_root: str | Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(project_root, SESSION_DIR, RUNNING_SPRINT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def recorded_claim(project_root: str | Path) -> tuple[str, str | None] | None:
    """(sprint id, its first run's id) of the sprint that last claimed the project (it may have ended since, or
    its id been used again: ask the server with both)."""
    claim = _recorded_claim(project_root)
    holder = _text(claim.get("sprint_id"))
    return (holder, _text(claim.get("run_id"))) if holder else None


def recorded_running_sprint(project_root: str) -> str | None:
    """The sprint that last claimed the project (it may have ended since: ask the server)."""
    claim = recorded_claim(project_root)
    return claim[0] if claim else None


def claims_on_status_file(status_real: str, besides: str | Path) -> list[tuple[str, str | None, Path]]:
    """(sprint, its first run's id, project root) of the claims recorded on this status file under any other root
    than `besides`: a project root holds its status file, so only the file's folders can be one. Two sprints
    started on one file through different roots (the project, and a folder of it with --status-file) would each
    claim their own root and both run every story. Claims recorded before they named their status file are not
    seen."""
    found = []
    for folder in Path(status_real).parents:
        if folder == Path(besides):
            continue
        claim = _recorded_claim(folder)
        holder = _text(claim.get("sprint_id"))
        if holder and claim.get("status_file") == status_real:
            found.append((holder, _text(claim.get("run_id")), folder))
    return found


async def claim_project(
    project_root: str,
    sprint_id: str,
    run_id: str,
    is_running: Callable[[str, str | None], Awaitable[bool]],
    status_real: str | None = None,
) -> None:
    """Record `sprint_id` as the project's sprint, unless another sprint that claimed it is still running
    (ProjectBusyError), or one that claimed its status file (`status_real`) through another root. Under the
    project's lock, so that of two sprints started at once on it exactly one gets it; unlike a search of the
    server's visibility store, which lags, this sees a sprint started a moment ago. Idempotent: the same sprint
    (a retry, or its id used again after it failed) claims it again."""
    path = session_path(project_root, RUNNING_SPRINT_FILE)
    if (in_the_way := session_dir_problem(project_root)) is not None:  # a folder where the claim goes
        raise _session_dir_error(in_the_way)
    record = {"sprint_id": sprint_id, "run_id": run_id, "claimed_at": datetime.now(UTC).isoformat()}
    async with polled_lock(path.with_suffix(".lock")):
        claim = recorded_claim(project_root)
        if claim is not None and claim[0] != sprint_id and await is_running(*claim):
            raise ProjectBusyError(claim[0], project_root)
        if status_real is None:
            write_json_atomic(path, record)
            return
        await _claim_status_file(project_root, record | {"status_file": status_real}, status_real, is_running)


async def _claim_status_file(
    project_root: str, record: dict[str, Any], status_real: str, is_running: Callable[[str, str | None], Awaitable[bool]]
) -> None:
    """Write the project's claim `record` unless a sprint that claimed the same status file through another root
    runs. The other roots' claims are read and ours written under the status file's own lock, which a sprint
    through any root takes (of two started at once through two roots, each read the claims, and one written
    while the other asked the server about an ended sprint's was never seen: both ran every story). The server
    is asked outside the lock, where the running sprint's writes take their turns, and the claims are read again
    under it after."""
    path, besides = session_path(project_root, RUNNING_SPRINT_FILE), Path(project_root).resolve()
    not_running: list[tuple[str, str | None, Path]] = []
    while True:  # (each round asks about claims not seen before: one written meanwhile)
        async with polled_lock(Path(status_lock_path(status_real))):
            others = [c for c in claims_on_status_file(status_real, besides=besides) if c[0] != record["sprint_id"]]
            if all(other in not_running for other in others):
                write_json_atomic(path, record)
                return
        for other in others:
            if other not in not_running:
                if await is_running(other[0], other[1]):
                    raise ProjectBusyError(other[0], str(other[2]), status_real)
                not_running.append(other)


def status_lock_path(status_real: str) -> str:
    """The lock every U4 write of this status file takes (beside it, so that sprints through any root share it)."""
    return status_real + ".lock"


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def dispatch_answer_path(project_root: str, dispatch_id: str) -> Path:
    """Where the agent activity records the AGENT_COMPLETE of one dispatch (re-delivered on a retry)."""
    return session_path(project_root, "dispatches", f"{safe_name(dispatch_id)}.json")


def file_written_at(path: Path) -> datetime:
    return datetime.fromtimestamp(path.stat().st_mtime, UTC)


def record_dispatch_answer(path: Path, answer: dict[str, Any], run_id: str) -> None:
    """Record a dispatch's AGENT_COMPLETE with the workflow run it answers (see recorded_dispatch_answer)."""
    write_json_atomic(path, {"workflow_run_id": run_id, "answer": answer})


def recorded_dispatch_answer(path: Path, run_id: str, first_scheduled_at: datetime) -> dict[str, Any] | None:
    """The AGENT_COMPLETE recorded for this dispatch by this workflow run; None when there is none, or when
    another run of a workflow with the same id (a sprint started again under its id) recorded it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        written_at = file_written_at(path)
    except FileNotFoundError:
        return None
    if isinstance(data, dict) and "answer" in data and "workflow_run_id" in data:
        recorded_run_id, answer = data["workflow_run_id"], data["answer"]
    else:  # written before answers named their run: the AGENT_COMPLETE alone
        recorded_run_id, answer = None, data
    if not written_by_this_run(recorded_run_id, run_id, written_at=written_at, first_scheduled_at=first_scheduled_at):
        return None
    return answer


def dispatch_lock_path(project_root: str, dispatch_id: str) -> Path:
    """The lock an attempt of one dispatch holds while it runs (activities.agents.one_attempt_at_a_time)."""
    return session_path(project_root, "dispatches", f"{safe_name(dispatch_id)}.lock")


class UnreadableResultFile(ValueError):
    """An agent's result file that holds no JSON BSO can read, and why."""


# An answer is a few MB at most (200 findings, blocking issues and feedback items of thousands of characters each,
# bso.answer_size; a PO message past 128 KB is refused): a result file past this is refused, read no further (one
# of hundreds of MB was held whole, and parsed).
RESULT_FILE_BYTES = 8 * 1024 * 1024


def read_result_file(path: Path) -> Any:
    """The JSON an agent wrote to its result file. Raises UnreadableResultFile, saying why in a few words: a
    directory, bytes that are not UTF-8, JSON nested deeper than a parser goes (each failed the activity on every
    attempt, and the story ended with a raw Python error), a file past RESULT_FILE_BYTES, a FIFO, socket or
    device (a FIFO with no writer blocked the open for ever, and the dispatch with it)."""
    try:
        # Non-blocking: the open returns at once whatever is there; only a regular file is read.
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as fh:
            kind = os.fstat(fh.fileno()).st_mode
            if not (stat.S_ISREG(kind) or stat.S_ISDIR(kind)):  # (a directory's read says so: "Is a directory")
                raise UnreadableResultFile(
                    "is not a regular file (a FIFO, socket or device?): write the answer to a plain file there"
                )
            data = fh.read(RESULT_FILE_BYTES + 1)  # never more, however long it is (or grows)
    except OSError as err:
        raise UnreadableResultFile(f"cannot be read: {err.strerror or err}") from None
    if len(data) > RESULT_FILE_BYTES:
        raise UnreadableResultFile(f"is past {RESULT_FILE_BYTES:,} bytes: too long to be an answer")
    try:
        return json.loads(data.decode("utf-8-sig"))  # (a BOM, as some Windows tools write, is skipped)
    except RecursionError:
        raise UnreadableResultFile("is not JSON: nested too deep") from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise UnreadableResultFile(f"is not JSON: {err}") from None
