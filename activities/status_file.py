"""Activities that read and write BMAD's sprint-status.yaml.

`load_sprint_status` reads the file (and the story files) into a StatusSnapshot.
`write_story_status` is U4: the only way the status file changes (compare-and-swap of one story's
value under an exclusive lock, atomic rename, read-back verification).
`wait_for_status_file` waits, without a history event per try, for a file that does not parse to parse again.

The pure helpers in bso.sprint_status do the parsing and editing; this module only does I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import posixpath
import stat
import tempfile
from collections.abc import Iterator
from functools import partial
from datetime import UTC, datetime
from pathlib import PurePath

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.service import RPCError, RPCStatusCode

from activities.process import heartbeating
from activities.session_files import ProjectBusyError, claim_project, status_lock_path

from bso.models import (
    DEFAULT_STATUS_FILE,
    MAX_DEPENDENCY_PROBLEMS,
    LoadStatusInput,
    StatusSnapshot,
    StatusWriteInput,
    StatusWriteResult,
    StoryMeta,
)
from bso.sprint_status import (
    NOT_WRITABLE_NOW,
    MAX_STATUS_BYTES,
    StatusFileError,
    StoryKeyError,
    apply_story_transition,
    epic_key_of,
    is_inside,
    parse_status_text,
    parse_story_file,
    resolve_inside,
    resolve_story_location,
    set_epics_back,
    short_key,
    story_dependencies,
    story_value,
    story_values,
    title_from_slug,
)
from bso.temporal_client import is_running, sprint_started_on

MAX_STORY_FILE_BYTES = MAX_STATUS_BYTES
MAX_SNAPSHOT_BYTES = 1_900_000
# The heartbeat timeout of the Master's file activities (the status load, the improvement stories, the summary):
# a worker killed in the middle of one is noticed within it and the activity retried on another, where the server
# waited for their 60 s start-to-close timeout (a restarted sprint stood still a minute). They heartbeat 5 times in it.
FILE_WORK_HEARTBEAT = 10


def file_work_heartbeats(what: str):
    """The heartbeats of one of those activities while it works on `what`."""
    return heartbeating(lambda: what, FILE_WORK_HEARTBEAT / 5)

ERROR_TYPE = "StatusFileError"
# The file does not parse: during a sprint, most likely someone's editor in the middle of saving it (or a line
# typed half-way). Retryable: the Slave's read or write lands once the file parses again; a sprint's first read
# lists it as non-retryable, to refuse a broken file at once.
UNREADABLE_ERROR_TYPE = "StatusFileUnreadable"
NOT_EDITABLE_ERROR_TYPE = "StatusFileNotEditable"
PROJECT_BUSY_ERROR = "ProjectBusy"


def _fail(message: str) -> ApplicationError:
    return ApplicationError(str(message), type=ERROR_TYPE, non_retryable=True)


def _posix(path: str) -> str:
    return PurePath(path).as_posix()


def _project_root(project_root: str) -> tuple[str, str]:
    """(absolute normalised root, realpath of the root); refuses a missing or non-directory root."""
    if not project_root:
        raise _fail("project_root is empty")
    root = os.path.abspath(project_root)
    if not os.path.exists(root):  # retryable, as a missing file: a project moved away mid-sprint is waited for
        raise _unreadable(f"{project_root}: project root does not exist (moved or deleted?)")
    if not os.path.isdir(root):
        raise _fail(f"{project_root}: project root is not a directory")
    return root, os.path.realpath(root)


def _status_path(root: str, root_real: str, status_file: str | None) -> str:
    """The realpath of the status file; it must be inside the (real) project root."""
    given = status_file or DEFAULT_STATUS_FILE
    if os.path.isabs(given):
        path = os.path.normpath(given)
        if not (is_inside(root, path) or is_inside(root_real, path)):
            raise _fail(f"{given}: status file is outside the project root {root}")
    else:
        try:
            path = resolve_inside(root, given)
        except ValueError as exc:
            raise _fail(f"{given}: {exc}") from None
    real = os.path.realpath(path)
    if not is_inside(root_real, real):
        raise _fail(f"{path}: status file resolves to {real}, outside the project root {root_real}")
    if not os.path.exists(real):  # retryable: an editor may be saving it (write aside, then rename)
        raise _unreadable(f"{path}: status file does not exist")
    if not os.path.isfile(real):
        raise _fail(f"{path}: status file is not a regular file")
    return real


def read_snapshot(project_root: str, status_file: str | None) -> StatusSnapshot:
    """The snapshot the sprint's first load would take (without claiming the project): for `bso sprint start`'s
    checks. Raises ApplicationError as the activity does."""
    return _load_sync(LoadStatusInput(project_root=project_root, status_file=status_file))


def status_path_problem(project_root: str, status_file: str | None) -> str | None:
    """Why the sprint would refuse this status file's path (outside the project, not a file...), by the rule
    load_sprint_status applies; None when the path is fine or the file is only missing (the caller says so)."""
    try:
        _status_path(*_project_root(project_root), status_file)
    except ApplicationError as err:
        return None if err.type == UNREADABLE_ERROR_TYPE else err.message
    return None


def _read_text(path: str, limit: int = MAX_STATUS_BYTES) -> str:
    try:
        size = os.stat(path).st_size
        if size > limit:
            raise _fail(f"{path}: file too large ({size} bytes; the limit is {limit})")
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise _fail(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise _fail(f"{path}: file too large (over {limit} bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:  # retryable: read while an editor was writing a character
        raise _unreadable(f"{path}: not valid UTF-8 at byte offset {exc.start}: {exc.reason}") from None


def _unreadable(message: str) -> ApplicationError:
    # Benign: an expected condition the Slave reports in plain words, not a traceback per attempt in the log.
    return ApplicationError(
        message, type=UNREADABLE_ERROR_TYPE, non_retryable=False, category=ApplicationErrorCategory.BENIGN
    )


# A disk full or read-only for now (a remount, a quota): no reason to give a story up, as an unreadable file is
# none. Waited for as one is (it ended the story needs-intervention after the write's retries, the file behind).
NOT_WRITABLE_NOW_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


@contextlib.contextmanager
def _waited_for_when_disk_full(path: str) -> Iterator[None]:
    """A disk full or read-only for now, met writing `path`, is the retryable not-writable-now error."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in NOT_WRITABLE_NOW_ERRNOS:
            raise
        raise _unreadable(
            f"{path}: {NOT_WRITABLE_NOW} ({exc.strerror or exc}): make room on the disk, or make it writable "
            "again, and the sprint goes on"
        ) from None


def _probe_writable(status_real: str) -> None:
    """Raises the not-writable-now error while a write of the status file could not land: its lock opened for
    writing, and a file of its size written and synced beside it (a full disk takes an empty file)."""
    try:
        with _waited_for_when_disk_full(status_real):
            os.close(os.open(status_lock_path(status_real), os.O_RDWR | os.O_CREAT, 0o644))
            fd, probe = tempfile.mkstemp(dir=os.path.dirname(status_real), prefix=".bso-write-probe-", suffix=".tmp")
            try:
                left = memoryview(b"\0" * (os.stat(status_real).st_size + 1))
                while left:  # a nearly full disk takes part of a write without an error: the next part raises
                    left = left[os.write(fd, left):]
                os.fsync(fd)
            finally:
                os.close(fd)
                os.unlink(probe)
    except OSError:
        pass  # anything else is no wait's to mend: the write says it


def _parse(text: str, source: str):
    try:
        return parse_status_text(text, source)
    except StatusFileError as exc:
        raise _unreadable(str(exc)) from None


# --- load ----------------------------------------------------------------------------------------


def cannot_write(status_real: str) -> str | None:
    """Why a sprint could not write the status file (U4 replaces it through a temporary file beside it), or None.
    Checked before a sprint starts: a file it cannot write would have every story's first agent run for nothing."""
    directory = os.path.dirname(status_real)
    if not os.access(status_real, os.W_OK):
        why = f"{status_real} is not writable"
    elif not os.access(directory, os.W_OK | os.X_OK):
        why = f"{directory} is not writable (each write replaces the file through a temporary file beside it)"
    else:
        return None
    return f"{why}: the sprint could not record any story's state (fix the permissions, then start it)"


def _read_parsed(inp: LoadStatusInput):
    """(root, real root, the status file's real path, its parse): the load's first steps, and the wait's."""
    root, root_real = _project_root(inp.project_root)
    status_real = _status_path(root, root_real, inp.status_file)
    return root, root_real, status_real, _parse(_read_text(status_real), status_real)


def _load_sync(inp: LoadStatusInput) -> StatusSnapshot:
    root, root_real, status_real, parsed = _read_parsed(inp)
    if inp.claim_project and (why := cannot_write(status_real)):  # the sprint's start
        raise _fail(why)

    # story_location, relative to the project root (computed against the real root)
    default_rel = _posix(os.path.relpath(os.path.dirname(status_real), root_real))
    raw_loc = parsed.story_location
    story_rel: str | None = None
    last_exc: ValueError | None = None
    for base in (root_real, root):
        try:
            story_rel = resolve_story_location(base, raw_loc, default_rel)
            break
        except ValueError as exc:
            last_exc = exc
    if story_rel is None:
        raise _fail(f"{status_real}: {last_exc}")
    story_dir = os.path.normpath(os.path.join(root_real, story_rel))
    story_dir_real = os.path.realpath(story_dir)
    if not is_inside(root_real, story_dir_real):
        raise _fail(f"{status_real}: story_location {raw_loc!r} resolves outside the project ({story_dir_real})")

    story_keys = [e.key for e in parsed.stories()]
    stories: list[StoryMeta] = []
    dependency_problems: dict[str, list[str]] = {}
    wanted = set(inp.only_stories) if inp.only_stories is not None else None
    for entry in parsed.stories():
        if wanted is not None and entry.key not in wanted:
            continue
        rel_path = posixpath.normpath(posixpath.join(story_rel, f"{entry.key}.md"))
        title, depends_on, tags, files = "", [], [], []
        info = _read_story_file(os.path.join(story_dir, f"{entry.key}.md"), root_real)
        if info is not None:
            title = info.title
            tags = list(info.tags)
            files = list(info.files)
            # unknown or ambiguous deps are ignored, and said so (the sprint's errors, `bso sprint start`)
            depends_on, problems = story_dependencies(entry.key, list(info.depends_on), story_keys)
            for problem in problems:
                if activity.in_activity():
                    activity.logger.warning("%s", problem)
            if problems and len(dependency_problems) < MAX_DEPENDENCY_PROBLEMS:
                dependency_problems[entry.key] = problems[:3]
        stories.append(
            StoryMeta(
                key=entry.key,
                epic=epic_key_of(entry.key),
                short_key=short_key(entry.key),
                state=entry.value,
                title=title or title_from_slug(entry.key),
                story_path=rel_path,
                depends_on=depends_on,
                tags=tags,
                files=files,
            )
        )
    snapshot = StatusSnapshot(
        status_file=status_real,
        story_location=story_rel,
        project=parsed.project,
        stories=stories,
        epics=parsed.epics(),
        read_at=datetime.now(UTC),
        dependency_problems=dependency_problems,
    )
    # Over it, the result could not be handed to the workflow at all (the SDK's bare TMPRL1103 at the start).
    if (size := len(snapshot.model_dump_json())) > MAX_SNAPSHOT_BYTES:
        raise _fail(
            f"{status_real}: its {len(stories)} stories with their story files make {size / 1e6:.1f} MB, more than "
            f"a read of the status file may hand on ({MAX_SNAPSHOT_BYTES / 1e6:.1f} MB; Temporal's payloads hold "
            "2 MB): split it into several files (--status-file), each a sprint of its own"
        )
    return snapshot


def story_file_problem(path: str, root_real: str) -> str | None:
    """Why BSO may neither read nor write the story file at `path`, or None (a missing one is no problem): a link
    out of the project (a simulated story-creator overwrote the file it pointed to), or no regular file (the open
    of a FIFO waits for a writer for ever)."""
    real = os.path.realpath(path)
    if not is_inside(root_real, real):
        return f"{path} is a link out of the project (to {real}): replace the link by the story file itself"
    if os.path.exists(real) and not os.path.isfile(real):
        return f"{path} is not a regular file (a folder, FIFO or device?): move it away for the story file"
    return None


def read_story_text(path: str) -> str:
    """A story file's text, its bytes that are not UTF-8 replaced (an editor's cp1252 `café` fails no agent)."""
    with open(path, "rb") as fh:
        return fh.read(MAX_STORY_FILE_BYTES).decode("utf-8", errors="replace")


def _read_story_file(path: str, root_real: str):
    """The parsed story file, or None when absent, unreadable, outside the project or too large."""
    try:
        if not os.path.isfile(path) or story_file_problem(path, root_real) is not None:
            return None
        if os.stat(path).st_size > MAX_STORY_FILE_BYTES:
            return None
        return parse_story_file(read_story_text(path))
    except OSError:
        return None


@activity.defn
async def load_sprint_status(inp: LoadStatusInput) -> StatusSnapshot:
    """Read sprint-status.yaml and its story files into a snapshot; any problem is non-retryable."""
    # The claim too: it may wait for another sprint's lock, and asks the server about that sprint.
    async with file_work_heartbeats("reading sprint-status.yaml"):
        return await _load_and_claim(inp)


async def _load_and_claim(inp: LoadStatusInput) -> StatusSnapshot:
    with _unreadable_given_up(inp.wait_when_unreadable_after):
        snapshot = await asyncio.to_thread(_load_sync, inp)
    if inp.claim_project:  # after the load: it has checked the project root is a real directory
        info = activity.info()
        try:
            # U4 takes this lock for every write: a folder in its place would fail them all, so it fails the start.
            os.close(os.open(status_lock_path(snapshot.status_file), os.O_RDWR | os.O_CREAT, 0o644))
            if (other := await _sprint_past_its_claim_on(inp.project_root, info.workflow_id)) is not None:
                raise ProjectBusyError(other, inp.project_root)
            await claim_project(
                inp.project_root, info.workflow_id, info.workflow_run_id, partial(is_running, activity.client()),
                status_real=snapshot.status_file,
            )
        except ProjectBusyError as err:
            raise ApplicationError(str(err), type=PROJECT_BUSY_ERROR, non_retryable=True) from None
        except OSError as err:
            if err.errno not in LASTING_ERRNOS:
                raise  # a full disk, too many open files: retried
            # e.g. a folder where the status file's lock must be: it would fail every story later
            raise ApplicationError(
                f"{err.filename or inp.project_root}: {err.strerror or err} (needed to claim the project at the "
                "sprint's start)",
                type=ERROR_TYPE,
                non_retryable=True,
            ) from None
    return snapshot


async def _sprint_past_its_claim_on(project_root: str, sprint_id: str) -> str | None:
    """A running sprint that claimed the project before, asked of the server: its claim record may be gone
    (`.sprint-session/` deleted, by `git clean -fdX` say), and then the project's claim alone let a second sprint
    run every story again. Only sprints past their first step count: of two starting at once, the claim decides."""
    try:
        return await sprint_started_on(activity.client(), PurePath(project_root), besides=sprint_id, claimed=True)
    except RPCError as err:
        if err.status != RPCStatusCode.UNIMPLEMENTED:
            raise  # the server busy or away: retried
        activity.logger.warning("the server cannot list workflows (%s): only the project's claim record is checked", err)
        return None


# What no retry of a claim mends: a folder where a file must be (or the reverse), no permission, a read-only disk.
LASTING_ERRNOS = frozenset({errno.EISDIR, errno.ENOTDIR, errno.EACCES, errno.EPERM, errno.EROFS})

# How often a status file that does not parse is read again while a batch waits for it.
STATUS_FILE_POLL_SECONDS = 1.0


@activity.defn
async def wait_for_status_file(inp: LoadStatusInput) -> bool:
    """Returns once sprint-status.yaml parses again (someone left it broken: a half-typed line, a merge conflict)
    and a write of it could land (the disk full or read-only for a while): whether it found it broken at all
    (False: all was well at the first look). Reads it every second, heartbeating
    the problem (the Web UI shows it on the pending activity); the wait adds nothing to the workflow's history
    however long it lasts. A problem no wait mends (the file moved out of the project, too large) fails it at
    once, as the load would."""
    broken = bool(activity.info().heartbeat_details)  # an attempt before this one (its worker lost) saw it broken
    while True:
        try:
            status_real = (await asyncio.to_thread(_read_parsed, inp))[2]
            await asyncio.to_thread(_probe_writable, status_real)
            return broken
        except ApplicationError as err:
            if err.type != UNREADABLE_ERROR_TYPE:
                raise
            broken = True
            activity.heartbeat(err.message)
        await asyncio.sleep(STATUS_FILE_POLL_SECONDS)


# --- U4 write ------------------------------------------------------------------------------------


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_replace(target: str, data: bytes, mode: int) -> None:
    directory = os.path.dirname(target)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(target) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


_SAVES_IN_BETWEEN = 5  # the file changed under a write this often in a row: the activity is retried


def _read_during_a_save(target: str) -> str:
    """The file read again within a write: an editor saving by rename leaves a moment with no file, and that
    attempt is retried (as a file not there at the start is), not taken for a file gone for good."""
    try:
        return _read_text(target)
    except ApplicationError as err:
        if err.type == UNREADABLE_ERROR_TYPE:
            raise
        raise _unreadable(f"{target}: being saved by someone else while BSO wrote it ({err.message})") from None


def _epics_before(text: str, epic_changes: dict[str, str], target: str) -> dict[str, str]:
    """The values the rolled epics held in `text`, the file before the write (none rolled: nothing read)."""
    if not epic_changes:
        return {}
    return {key: value for key, value in story_values(text, epic_changes, target).items() if value is not None}


def _write_sync(inp: StatusWriteInput) -> StatusWriteResult:
    root, root_real = _project_root(inp.project_root)
    target = _status_path(root, root_real, inp.status_file)
    lock_path = status_lock_path(target)
    try:
        with _waited_for_when_disk_full(target):
            lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ApplicationError(f"{lock_path}: cannot open lock file: {exc.strerror or exc}", type=ERROR_TYPE) from None
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        text = _read_text(target)
        for _ in range(_SAVES_IN_BETWEEN):
            mode = stat.S_IMODE(os.stat(target).st_mode)
            try:
                result = set_epics_back(
                    text,
                    apply_story_transition(text, inp.story_key, inp.expected, inp.new, datetime.now(UTC), target),
                    inp.epics_back,
                    target,
                )
            except StatusFileError as exc:
                _parse(text, target)  # a file that does not parse is "unreadable": waited for (on the error path only)
                # It parses, but the edit failed (its check after the edit, say; a story value it cannot edit in
                # place does not parse): no wait mends that; retried a little, as an editor's save would be, then
                # given up.
                raise ApplicationError(str(exc), type=NOT_EDITABLE_ERROR_TYPE, non_retryable=False) from None
            except StoryKeyError as exc:  # the story is not in the file (renamed or removed by hand)
                raise _fail(str(exc)) from None
            # An editor takes no lock: a save since the read would be overwritten by this write (3% of saves made
            # during a tight loop of writes were lost). The change is made again on what the file holds now.
            if result.text == text or (now := _read_during_a_save(target)) == text:
                break
            text = now
        else:
            raise ApplicationError(
                f"{target} changed {_SAVES_IN_BETWEEN} times while {inp.story_key} was being written; retried",
                type="StatusFileBusy",
                non_retryable=False,
            )
        # Written: the story's new value, or (the story's value not the one expected, or there already) an epic
        # whose stories were all set done by hand, rolled up.
        if result.text != text:
            with _waited_for_when_disk_full(target):
                _atomic_replace(target, result.text.encode("utf-8"), mode)
            # read back and verify (the bytes, then the story's value: a line scan for BMAD's layout)
            back = _read_text(target)
            try:
                value = story_value(back, result.story_key, target) if back == result.text else None
            except StatusFileError as exc:
                raise _fail(str(exc)) from None
            if value != result.current:
                raise ApplicationError(
                    f"{target}: read-back verification failed for {result.story_key!r}",
                    type="StatusWriteVerifyError",
                    non_retryable=False,
                )
            if activity.in_activity():
                activity.logger.info(
                    "status write %s: %s -> %s (epics %s)",
                    result.story_key,
                    result.previous,
                    result.current,
                    result.epic_changes,
                )
        # result.text is what the file holds now: the text read, or the one written (verified above)
        watched = story_values(result.text, inp.watch, target) if inp.watch else {}
        return StatusWriteResult(
            watched_changes={key: value for key, value in watched.items() if value != inp.watch[key]},
            outcome=result.outcome,
            story_key=result.story_key,
            previous=result.previous,
            current=result.current,
            epic_changes=result.epic_changes,
            epics_before=_epics_before(text, result.epic_changes, target),
            expected=inp.expected,
            new=inp.new,
            done_at=datetime.now(UTC),
        )
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
        os.close(lock_fd)


def story_value_now(project_root: str, status_file: str | None, story_key: str) -> str | None:
    """The story's value in the status file as it is now; None when the file or the story cannot be read."""
    try:
        root, root_real = _project_root(project_root)
        target = _status_path(root, root_real, status_file)
        return story_value(_read_text(target), story_key, target)
    except (ApplicationError, StatusFileError, StoryKeyError):
        return None


def set_back_story_value(project_root: str, status_file: str | None, story_key: str, found: str, value: str) -> bool:
    """U4: the story's value back from `found` to `value` (one story's line, under the lock: the other Slaves'
    writes stay); False when the file holds something else by now."""
    result = _write_sync(StatusWriteInput(
        project_root=project_root, status_file=status_file or DEFAULT_STATUS_FILE, story_key=story_key,
        expected=found, new=value,
    ))
    return result.outcome == "written"


@activity.defn
async def write_story_status(inp: StatusWriteInput) -> StatusWriteResult:
    """U4: compare-and-swap one story's value in sprint-status.yaml (atomic, verified, idempotent)."""
    with _unreadable_given_up(inp.wait_when_unreadable_after):
        return await asyncio.to_thread(_write_sync, inp)


@contextlib.contextmanager
def _unreadable_given_up(after_attempts: int | None) -> Iterator[None]:
    """From the `after_attempts`th attempt on, a file that does not parse fails the activity for good: the
    caller (a Slave) then waits for it with wait_for_status_file, which costs no history however long."""
    try:
        yield
    except ApplicationError as err:
        if err.type != UNREADABLE_ERROR_TYPE or after_attempts is None or not activity.in_activity():
            raise
        if activity.info().attempt < after_attempts:
            raise
        raise ApplicationError(
            err.message, type=UNREADABLE_ERROR_TYPE, non_retryable=True, category=ApplicationErrorCategory.BENIGN
        ) from None
