"""The command backend's launcher: the agent CLI's parent, in the agent's process group, so the agent's exit is
recorded durably even when the worker that started it is gone (killed hard while the agent worked).

    python -I agent_launcher.py SPEC_JSON AGENT_ARGV...

SPEC_JSON: `run_dir`; `stdin` (a file given to the agent as its stdin, or null); `secret_keys` (the names of the
env variables whose values are redacted from the transcript); `record` (what pid.json and exit.json carry besides
the process facts: dispatch id, workflow run id, attempt, the commit before the agent...); `deadline_seconds` and
`kill_grace_seconds` (optional): past the deadline the launcher stops the agent itself (SIGTERM to the group, the
grace, SIGKILL), records the timeout and ends the group with itself. The worker's activity holds the agent to
its timeout before that; the launcher's deadline is the backstop for an agent whose worker was killed hard and
that no retry adopts.

It writes `pid.json` before the agent starts, pumps the agent's stdout and stderr (secrets redacted) into
`stdout.log` and `stderr.log` itself (no pipe to the worker: an orphaned agent neither dies of SIGPIPE nor loses
its output), and writes `exit.json` once the agent exited. Killed with its group (a timeout, a cancellation),
it writes no `exit.json`. A cancelled sprint asks it to stop its agent through `cancelled.json` in the run folder
(written by `stop_sprint_agents` on whichever agent host takes that stop, the project being shared): it checks
for one every CANCEL_POLL_SECONDS, marks `pid.json` killed, stops the agent and ends the group with itself, with
no `exit.json`. Standard library only: the worker's interpreter runs it in isolated mode.
"""

from __future__ import annotations

import codecs
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from pathlib import Path

LAST_LINE_CHARS = 300
CANCELLED_FILE = "cancelled.json"  # stop_sprint_agents (activities/backends/command.py): the sprint was cancelled
CANCEL_POLL_SECONDS = 1.0  # how soon a cancelled sprint's request to stop is seen


# In the environment of everything the agent starts: `<process group>:<dispatch id>`. A child started in a session
# of its own (`setsid`, Node's `detached: true`) has left the group and outlives its kill, but keeps the mark.
GROUP_MARK = "BSO_PROCESS_GROUP"


def group_mark(pgid: int, dispatch_id: object) -> str:
    return f"{pgid}:{dispatch_id}"


def marked_pids(mark: str) -> list[int]:
    """The processes whose environment carries GROUP_MARK=mark, by procfs (none where there is none, as on macOS;
    another user's processes are unreadable, and never ours)."""
    needle = f"{GROUP_MARK}={mark}\0".encode()
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    found = []
    for name in names:
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                environ = fh.read()
        except OSError:  # gone, or not ours
            continue
        if environ.startswith(needle) or b"\0" + needle in environ:
            found.append(int(name))
    return found


def signal_marked(mark: str, sig: int) -> bool:
    """Send `sig` to the processes carrying the mark; False when there were none."""
    pids = marked_pids(mark)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    return bool(pids)


def write_json_atomic(path: Path, data: object) -> None:
    write_bytes_atomic(path, json.dumps(data, indent=2, sort_keys=True).encode("utf-8"))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Written aside, fsynced, renamed over: a reader sees the old content or the new, never a part."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


MIN_SECRET_CHARS = 4  # shorter values would redact ordinary words
MIN_SECRET_LINE_CHARS = 12  # a line of a value of several lines (a private key's body) redacted on its own


def secret_forms(values) -> list[str]:
    """Every way a secret value may appear in an agent's output: as it is; JSON-escaped, as CLIs printing JSON
    lines write it (with and without `\\u` escapes of non-ASCII); and for a value of several lines, which output
    read line by line never holds whole, each line long enough to be its own. Longest first: a form inside
    another does not leave the rest of it visible."""
    forms: set[str] = set()
    for value in values:
        if len(value) < MIN_SECRET_CHARS:
            continue
        forms.update((value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]))
        forms.update(line.strip() for line in value.splitlines() if len(line.strip()) >= MIN_SECRET_LINE_CHARS)
    return sorted(forms, key=len, reverse=True)


def redact_forms(text: str, forms: list[str]) -> str:
    for form in forms:
        text = text.replace(form, "***")
    return text


class StreamRedactor:
    """redact_forms over a text given in pieces (an agent's output as it prints, a file read in blocks) as over
    the whole: each form's replacement streams into the next one's, as str.replace runs over the whole text one
    form after another, each holding back less than its form's length (one that overlaps itself, a secret
    `aaaa` in a file of `a`s, made the end held grow to the whole file)."""

    def __init__(self, forms: list[str]) -> None:
        self._stages = [_FormReplacer(form) for form in forms]

    @property
    def redacted(self) -> bool:
        """Whether any form was found."""
        return any(stage.found for stage in self._stages)

    def feed(self, text: str) -> str:
        """What of the text so far is redacted for good."""
        for stage in self._stages:
            text = stage.feed(text)
        return text

    def finish(self) -> str:
        """The rest: the text's end (or a line's, which no form spans: each is redacted on its own)."""
        text = ""
        for stage in self._stages:
            text = stage.feed(text) + stage.finish()
        return text


class _FormReplacer:
    """text.replace(form, "***") over a text given in pieces: left to right, matches never overlapping."""

    def __init__(self, form: str) -> None:
        self._form = re.compile(re.escape(form))
        self._length = len(form)
        self._held = ""
        self.found = False

    def feed(self, text: str) -> str:
        text = self._held + text
        # Every match wholly in the text is final (no earlier one can still end in a later piece); past the last
        # one's end, only the last len(form) - 1 characters could begin one.
        last = deque(self._form.finditer(text), maxlen=1)
        cut = max(last[0].end() if last else 0, len(text) - self._length + 1)
        self._held = text[cut:]
        return self._replace(text[:cut])

    def finish(self) -> str:
        text, self._held = self._held, ""
        return self._replace(text)

    def _replace(self, text: str) -> str:
        replaced, count = self._form.subn("***", text)
        self.found = self.found or count > 0
        return replaced


# A line longer than this is pumped in pieces (a secret cut between two still redacted), never held whole: a line
# of hundreds of MB (a tool's output relayed in one JSON event) was.
PUMP_PIECE_BYTES = 64 * 1024


def pump(stream, path: Path, forms: list[str], last: list[str]) -> None:
    """The agent's output into `path` as it comes, redacted (secret_forms), line by line, each line shown at once."""
    decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
    redactor = StreamRedactor(forms)
    line = ""  # the start of the line being written, as much of it as `last` shows

    def write(text: str, ends_line: bool) -> None:
        nonlocal line
        fh.write(text)
        fh.flush()
        if len(line) < LAST_LINE_CHARS:  # (a line of many pieces: its start, not its last piece's)
            line = (line + text[: LAST_LINE_CHARS]).lstrip()[:LAST_LINE_CHARS]
        if line.strip():
            last[0] = line.strip()
        if ends_line:
            line = ""

    with open(path, "w", encoding="utf-8") as fh:
        for piece in iter(lambda: stream.readline(PUMP_PIECE_BYTES), b""):
            text = redactor.feed(decode(piece))
            ends_line = piece.endswith(b"\n")
            write(text + redactor.finish() if ends_line else text, ends_line)
        # (Output that ends without a newline: the end the redactor held is its last line's too.)
        write(redactor.feed(decode(b"", final=True)) + redactor.finish(), True)


def stop_agent(proc: subprocess.Popen, grace: float, mark: str) -> None:
    """SIGTERM to the group (the launcher itself ignores it) and to what left it, up to `grace` for the agent to
    exit, then SIGKILL; what left the group is killed too (the group goes with the launcher)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(os.getpgrp(), signal.SIGTERM)
    signal_marked(mark, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    signal_marked(mark, signal.SIGKILL)


def cancel_requested(run_dir: Path, record: dict) -> bool:
    """The sprint of this dispatch (this workflow run, not an earlier one under the same id) was cancelled."""
    try:
        data = json.loads((run_dir / CANCELLED_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and all(data.get(k) == record.get(k) for k in ("dispatch_id", "run_id"))


def await_agent(proc: subprocess.Popen, deadline_seconds: float | None, run_dir: Path, record: dict) -> int | str:
    """The agent's exit code; "timed_out" once past the deadline, "cancelled" when its sprint was cancelled."""
    end = None if deadline_seconds is None else time.monotonic() + float(deadline_seconds)
    while True:
        wait = CANCEL_POLL_SECONDS if end is None else max(0.0, min(CANCEL_POLL_SECONDS, end - time.monotonic()))
        try:
            return proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            if cancel_requested(run_dir, record):
                return "cancelled"
            if end is not None and time.monotonic() >= end:
                return "timed_out"


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    command = argv[1:]
    run_dir = Path(spec["run_dir"])
    record = dict(spec.get("record", {}))
    forms = secret_forms(os.environ.get(key, "") for key in spec.get("secret_keys", []))
    started = time.time()
    pid_record = {**record, "pid": os.getpid(), "pgid": os.getpgrp(), "started_at": started}
    write_json_atomic(run_dir / "pid.json", pid_record)
    mark = group_mark(os.getpgrp(), record.get("dispatch_id"))
    last = [""]
    timed_out = False
    stdin = open(spec["stdin"], "rb") if spec.get("stdin") else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(command, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**os.environ, GROUP_MARK: mark})
    except OSError as err:  # the worker checked the command; it may have gone since
        (run_dir / "stdout.log").write_text("", encoding="utf-8")
        (run_dir / "stderr.log").write_text(f"cannot start the agent: {err}\n", encoding="utf-8")
        returncode = 127
    else:
        pumps = [
            threading.Thread(target=pump, args=(proc.stdout, run_dir / "stdout.log", forms, last), daemon=True),
            threading.Thread(target=pump, args=(proc.stderr, run_dir / "stderr.log", forms, [""]), daemon=True),
        ]
        for t in pumps:
            t.start()
        if stdin is not subprocess.DEVNULL:
            stdin.close()
        outcome = await_agent(proc, spec.get("deadline_seconds"), run_dir, record)
        if outcome == "cancelled":  # killed, as by its worker: pid.json says so, and no exit.json
            try:
                write_json_atomic(run_dir / "pid.json", {**pid_record, "killed": True})
            except OSError:  # the agent is stopped all the same
                pass
            stop_agent(proc, float(spec.get("kill_grace_seconds", 5)), mark)
            os.killpg(os.getpgrp(), signal.SIGKILL)  # the launcher too: nothing of the group stays
        timed_out = outcome == "timed_out"
        if timed_out:
            stop_agent(proc, float(spec.get("kill_grace_seconds", 5)), mark)
        returncode = outcome if isinstance(outcome, int) else None
        deadline = time.monotonic() + (0 if timed_out else 10)  # a child the agent left behind may hold its output open
        for t in pumps:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
    write_json_atomic(
        run_dir / "exit.json",
        {**record, "returncode": returncode, "timed_out": timed_out, "elapsed": time.time() - started,
         "last_line": last[0]},
    )
    if timed_out:  # what the agent left behind in the group goes too, the launcher with it (its record is written)
        os.killpg(os.getpgrp(), signal.SIGKILL)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception:  # the launcher's own failure: kept where the transcripts are (the worker reads no pipe)
        try:
            with open(Path(json.loads(sys.argv[1])["run_dir"], "launcher-error.log"), "a", encoding="utf-8") as fh:
                fh.write(traceback.format_exc())
        finally:  # an agent already started would run on with no deadline: the group goes, the launcher with it
            if os.getpgrp() == os.getpid():  # the group it leads (started in a session of its own), no other
                os.killpg(os.getpgrp(), signal.SIGKILL)
        sys.exit(1)
