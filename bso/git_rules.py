"""The pure rules of BSO's git handling: branch names, secret files (P21), file scope (P19), messages.

activities/git_ops.py runs git; everything it decides is decided here.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from collections.abc import Mapping
from string import Template
from typing import NamedTuple

from bso.models import short_key

_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}\Z")


class GitRuleError(ValueError):
    pass


def check_ref_part(value: str, what: str) -> str:
    """A story key or session id usable in a branch name and a directory name (no `..`, no `/`)."""
    if not _KEY_RE.match(value) or ".." in value or value.endswith((".lock", ".")):
        raise GitRuleError(f"{what} {value!r} cannot be used in a git branch name")
    return value


def story_branch(session_id: str, story_key: str) -> str:
    """`bso/<session>/<story key>`."""
    return f"bso/{check_ref_part(session_id, 'session id')}/{check_ref_part(story_key, 'story key')}"


def originals_ref(session_id: str, story_key: str) -> str:
    """`refs/bso-originals/<session>/<story key>`: a story's commits as they were before the squash (P28)."""
    return f"refs/bso-originals/{check_ref_part(session_id, 'session id')}/{check_ref_part(story_key, 'story key')}"


def is_secret_path(path: str, patterns: list[str]) -> bool:
    """Does a changed file look like a secret (`.env*`, private keys, credential files)?"""
    # Case does not make a file less secret (KEY.PEM, .ENV): both sides lower-cased.
    path = path.lower()
    name = posixpath.basename(path)
    for pattern in (p.lower() for p in patterns):
        if fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(path, pattern):
            # `.env.example` / `.env.sample` are templates, not secrets.
            if name.startswith(".env") and name.endswith((".example", ".sample", ".template", ".dist")):
                continue
            return True
    return False


# A private key's armour: its BEGIN line, any header lines (`Proc-Type: 4,ENCRYPTED`, `Version: ...`), then its
# body. Newlines as they are or escaped (a key inside a config file's string, JSON's `\/` too, JSON inside a JSON
# string: `\\n`), its lines maybe string literals of their own ("...\n" + "...", Python's b"...\n"). The body is
# required: code that parses keys names the BEGIN line, and is no secret. Each line ends at its first line break
# and nothing else may end it, so a text that is no key is given up in linear time (a header's value and the
# blank after it both taking spaces was exponential). Every part is bounded, so a match is never longer than
# PRIVATE_KEY_LONGEST_MATCH: a stream read in blocks keeps that much of each block's end.
_ESCAPE = r"\\{1,3}"  # a string's backslash, maybe escaped once or twice more (a string inside a string)
_LINE_BREAK = r"(?:" + _ESCAPE + r"[rn]|[\r\n])"
_BETWEEN_ITEMS = 256
# (A `+` or a `b` between two lines is one only before a blank or a quote: a body holds both, and a run of
# either read both ways made each BEGIN cost thousands of steps.)
_BETWEEN_LINES = r"(?:" + _ESCAPE + r"[rn\"']|[ \t\r\n\"',.]|\+(?=[\s\"'])|[bB](?=[\"'])){0,%d}" % _BETWEEN_ITEMS
# PEM, PKCS#8, OpenSSH and PGP armour; SSH2's (RFC 4716: ssh.com, PuTTYgen's export).
_BEGIN_WORDS, _BEGIN_WORD = 4, 16
_SSH2_BEGIN = "---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----"
_ARMOUR_BEGIN = r"(?:-----BEGIN (?:[A-Z0-9]{1,%d} ){0,%d}PRIVATE KEY(?: BLOCK)?-----|%s)" % (
    _BEGIN_WORD, _BEGIN_WORDS, re.escape(_SSH2_BEGIN))
# PuTTY's .ppk: its private part follows its `Private-Lines: N` line, with no header of its own.
_PUTTY_BEGIN = "Private-Lines: "
# A header's value never holds four dashes (another BEGIN line: each BEGIN re-read all the lines after it), and
# headers are few and short: the search stays linear whatever the text. Its value may hold an escaped character
# (a quoted comment inside a string, `\"`) and go on past a backslash at the end of its line (RFC 4716).
_HEADERS, _HEADER_NAME, _HEADER_VALUE = 16, 64, 512
_HEADER = r"[A-Za-z][\w-]{0,%d}: (?:[^\r\n\\-]|-(?!---)|%s[^\r\n\\rn-]|\\\r?\n){0,%d}" % (
    _HEADER_NAME, _ESCAPE, _HEADER_VALUE)
_BODY_START = 40
_PRIVATE_KEY = re.compile(
    r"(?:" + _ARMOUR_BEGIN + _BETWEEN_LINES  # (newlines turned to spaces too)
    + r"(?:" + _HEADER + _LINE_BREAK + _BETWEEN_LINES + r"){0,%d}" % _HEADERS
    + r"|" + _PUTTY_BEGIN + r"[0-9]{1,4}" + _BETWEEN_LINES + r")"
    + r"(?:[A-Za-z0-9+]|\\{0,3}/){%d}" % _BODY_START
)
_LONGEST_ITEM = 4  # characters: an escape of three backslashes and its letter
_LONGEST_BETWEEN = _BETWEEN_ITEMS * _LONGEST_ITEM
PRIVATE_KEY_LONGEST_MATCH = (
    max(len("-----BEGIN PRIVATE KEY BLOCK-----") + _BEGIN_WORDS * (_BEGIN_WORD + 1), len(_SSH2_BEGIN),
        len(_PUTTY_BEGIN) + 4)
    + _LONGEST_BETWEEN
    + _HEADERS * (1 + _HEADER_NAME + len(": ") + _HEADER_VALUE * _LONGEST_ITEM + _LONGEST_ITEM + _LONGEST_BETWEEN)
    + _BODY_START * _LONGEST_ITEM
)
# For git's own search (`git grep`, `git log -G`: extended regular expressions) to find the few files worth
# reading: a key's BEGIN line, and (`git log -G` sees only the lines a commit changed) a line that is body alone,
# indented or quoted maybe, for a body written under a BEGIN line committed before (as long as the shortest body
# _PRIVATE_KEY takes: a PuTTY ed25519 key's private part is one line of 48 characters).
PRIVATE_KEY_LINE = f"-----BEGIN .*PRIVATE KEY|{_SSH2_BEGIN}|{_PUTTY_BEGIN}[0-9]"
PRIVATE_KEY_CHANGE = PRIVATE_KEY_LINE + "|^[ \t\"'+,bB]*[A-Za-z0-9+/]{%d}" % _BODY_START


def holds_private_key(text: str) -> bool:
    """Does this text carry a private key (PEM, OpenSSH, PGP or SSH2 armour, PuTTY's), under whatever name its
    file has? (`git mv key.pem notes.txt` took a key past the secret file names.)"""
    return _PRIVATE_KEY.search(text) is not None


def out_of_scope(paths: list[str], scope: list[str]) -> list[str]:
    """The changed paths matching none of the story's declared scope globs (empty scope: no check).

    A scope entry is a glob (`src/auth/**`, `tests/test_auth.py`) or a directory (`src/auth/`)."""
    if not scope:
        return []
    outside = []
    for path in paths:
        if not any(_in_scope(path, entry) for entry in scope):
            outside.append(path)
    return outside


def _in_scope(path: str, entry: str) -> bool:
    entry = entry.strip()
    if entry.startswith("./"):
        entry = entry[2:]
    if entry.endswith("/"):
        return path.startswith(entry)
    if entry.endswith("/**"):
        return path.startswith(entry[:-2])
    return fnmatch.fnmatchcase(path, entry) or path == entry


_SCOPE_LINE_RE = re.compile(r"^[\s>*-]*\**\s*(?:file scope|scope|files)\s*\**\s*:\s*\**\s*(.+?)\s*$", re.I | re.M)
_SCOPE_SECTION_RE = re.compile(r"^##+\s*(?:file scope|scope)\s*$(.*?)(?=^##|\Z)", re.I | re.M | re.S)


def _a_path(item: str) -> bool:
    """`src/auth/**`, `tests/`, `app.py`, `*.md`, `Makefile`: not a word of prose (`backend`, `only`, `UI`).
    A name with no `/`, `.` or `*` counts when it is capitalised the way file names are (`Makefile`,
    `Dockerfile`, `LICENSE`) and is no common word."""
    if not item or " " in item or item.lower() in _PROSE_WORDS:
        return False
    if "/" in item or "*" in item:
        return True
    if "." in item:
        return not item.endswith((".", ",", ";", ":"))  # "1.2." ends a sentence
    return item[:1].isupper() and (item[1:].islower() or item.isupper())


# Words a prose scope line uses that look like names of files (`UI`, `API`) or are capitalised at its start.
_PROSE_WORDS = frozenset(
    "ui api backend frontend only the a an and or no not all any none this that it is in of to for with "
    "without story stories see tbd n/a".split()
)


def parse_file_scope(story_text: str) -> list[str]:
    """A story's declared file scope: a `File scope: a/**, b.py` line or a `## File Scope` bullet list. Prose
    under such a name (`**Scope:** backend only, the UI comes in story 1.2`, a `### Scope` of Dev Notes) is no
    scope: every planned file would be out of it, and the PO gate blocked the story. A line counts when all
    its items are paths; a section, its items that are."""
    for section in _SCOPE_SECTION_RE.finditer(story_text):
        items = [
            line.strip().lstrip("-*").strip().strip("`")
            for line in section.group(1).splitlines()
            if line.strip().startswith(("-", "*"))
        ]
        if paths := [i for i in items if _a_path(i)]:
            return paths
    for line in _SCOPE_LINE_RE.finditer(story_text):
        items = [p.strip().strip("`'\"") for p in re.split(r"[,\s]+", line.group(1)) if p.strip().strip("`'\"")]
        if items and all(_a_path(i) for i in items):
            return items
    return []


_AC_SECTION_RE = re.compile(r"^##+\s*Acceptance Criteria\s*$(.*?)(?=^##|\Z)", re.I | re.M | re.S)


def parse_acceptance_criteria(story_text: str) -> list[str]:
    """The numbered or bulleted items under `## Acceptance Criteria`."""
    section = _AC_SECTION_RE.search(story_text)
    if not section:
        return []
    items = []
    for line in section.group(1).splitlines():
        m = re.match(r"^\s*(?:\d+[.)]|[-*])\s+(.*\S)\s*$", line)
        if m:
            items.append(m.group(1))
    return items


def count_passed(output: str, pattern: str) -> int | None:
    """P20: passing tests in verification output (`12 passed` from pytest); None when none is reported."""
    found = re.findall(pattern, output)
    if not found:
        return None
    return sum(int(x) for x in found if str(x).isdigit())


def commit_message(template: str, *, agent_type: str, story_key: str, path: str, dispatch_id: str) -> str:
    return Template(template).safe_substitute(
        agent_type=agent_type, story_key=story_key, path=path, dispatch_id=dispatch_id
    )


def squash_message(template: str, *, story_key: str, title: str) -> str:
    """P28: `feat: Story N.M: <title>`."""
    number = short_key(story_key).replace("-", ".")
    return Template(template).safe_substitute(story_number=number, title=title or story_key, story_key=story_key)


def parse_porcelain(text: str) -> list[str]:
    """Paths of `git status --porcelain=v1 -z` output (renames give the new path)."""
    return [path for _, path in parse_porcelain_entries(text)]


def parse_porcelain_entries(text: str) -> list[tuple[str, str]]:
    """Each entry of `git status --porcelain=v1 -z` output: its `XY` status (the index's, then the worktree's)
    and its path (renames give the new path). One path may have two: `D ` and `??` after `git rm --cached`."""
    found: list[tuple[str, str]] = []
    entries = text.split("\x00")
    i = 0
    while i < len(entries):
        entry = entries[i]
        i += 1
        if len(entry) < 4:
            continue
        status, path = entry[:2], entry[3:]
        found.append((status, path))
        if "R" in status or "C" in status:
            i += 1  # the original path follows
    return found


def index_holds(statuses: list[str]) -> bool:
    """Does the index hold the file of these `git status` entries? Not one only untracked (`??`) or whose
    removal is staged (`D `: `git rm`, `git rm --cached`)."""
    return any(status != "??" and status[0] != "D" for status in statuses)


def removal_staged(statuses: list[str]) -> bool:
    """Is the file's removal from the index staged (`git rm`, `git rm --cached`, its file kept on disk or not)?"""
    return "D " in statuses


# A sprint's merge of a story's branch moves the user's branch with this reflog subject (`merge bso/s/1-1: ...`).
_BSO_MERGE_SUBJECT = "merge bso/"
_REFLOG_TIME_RE = re.compile(r"@\{(\d+)\}\Z")
REFLOG_FORMAT = "%h%x1f%gd%x1f%gs"  # with --date=unix: `abc1234`, `main@{1732790000}`, `commit: add login`


def checkout_moves(reflog: str, since: int) -> list[tuple[str, str]]:
    """(commit, reflog subject) of each move of the checkout's branch at or after `since` (a Unix time) that is
    not a BSO merge of a story's branch, oldest first: `reflog` is `git reflog show --date=unix
    --format=REFLOG_FORMAT <branch>` (newest first)."""
    moves: list[tuple[str, str]] = []
    for line in reflog.splitlines():
        commit, _, rest = line.partition("\x1f")
        selector, _, subject = rest.partition("\x1f")
        if (when := _REFLOG_TIME_RE.search(selector)) is None or int(when.group(1)) < since:
            continue
        if not subject.startswith(_BSO_MERGE_SUBJECT):
            moves.append((commit, subject))
    return moves[::-1]


def work_outside_worktree(branch: str, moves: list[tuple[str, str]], files: list[str]) -> str | None:
    """What else happened in the user's checkout while a dev agent ran, said for its empty diff's failure: the
    agent may have worked in $BSO_PROJECT_ROOT instead of its worktree. None: nothing did."""
    said = []
    if moves:
        shown = "; ".join(f"{commit} {subject[:80]}" for commit, subject in moves[:3])
        said.append(f"{branch} moved {len(moves)} time(s) ({shown}{'; ...' if len(moves) > 3 else ''})")
    if files:
        said.append(f"uncommitted changes to {', '.join(files[:5])}{', ...' if len(files) > 5 else ''}")
    if not said:
        return None
    return (
        f"meanwhile, in the project's checkout and not by BSO: {' and '.join(said)}. BSO left them as they are; "
        "if the agent made them, it worked in $BSO_PROJECT_ROOT instead of its worktree ($BSO_WORKDIR)"
    )


# --- a merge into the user's checkout cut short by a kill ---------------------------------------------

GITLINK_MODE = "160000"
SYMLINK_MODE = "120000"


class MergedPath(NamedTuple):
    """One path a story's merge changes, as HEAD, the merge and the user's checkout have it. Entries: `(mode,
    object id)` in a tree, `(mode, object id, stage)` in the index, `(is a symlink, blob id)` on disk."""

    head: tuple[str, str] | None  # None: not in HEAD
    result: tuple[str, str] | None  # in the merge's result tree (`git merge-tree --write-tree`: a conflict's markers)
    merge_index: tuple[tuple[str, str, int], ...]  # what the merge leaves in the index (a conflict: its stages)
    index: tuple[tuple[str, str, int], ...]  # what the checkout's index holds
    disk: tuple[bool, str] | None | str  # None: not on disk; "other": a folder, a file git could not hash


MERGE_LEFT_NOTHING = "nothing"
MERGE_LEFT_ITS_OWN = "the merge's own"
MERGE_LEFT_OTHER = "other"


def in_index(entry: tuple[str, str] | None) -> tuple[tuple[str, str, int], ...]:
    """The index's entries for a tree's entry (none for a path not there)."""
    return () if entry is None else ((entry[0], entry[1], 0),)


def on_disk(entry: tuple[str, str] | None) -> tuple[bool, str] | None:
    """How a tree's entry is on disk once checked out (its mode's executable bit is not compared)."""
    return None if entry is None else (entry[0] == SYMLINK_MODE, entry[1])


def merge_leftovers(paths: Mapping[str, MergedPath], *, stopped: bool) -> str:
    """What a merge of a story's branch into the user's checkout, killed before it ended, left in the paths it
    changes (the other paths are not looked at: the merge never writes them, and neither does its undoing).

    git writes a merge's result into the checkout before it moves the branch; killed in between (a worker killed
    with its children), the story's files stay in the checkout, staged or untracked, as if the user's own work,
    and the same merge run again is refused for them. A merge stopped on a conflict (`stopped`: MERGE_HEAD, of this
    merge) whose `git merge --abort` a kill prevented leaves the conflict in the checkout.

    MERGE_LEFT_ITS_OWN only when each path is exactly as that merge leaves it, so undoing it loses nothing but
    what the merge run again writes: stopped, the index and the working tree hold the merge's whole result (its
    conflicts' stages, their files with the markers), nothing resolved since; cut short, each path's index entry
    and file are HEAD's or the merge's (git writes the files one by one, then the index), and one at least is the
    merge's. MERGE_LEFT_NOTHING: every path as in HEAD. MERGE_LEFT_OTHER: anything else (a file holding
    content that is neither, a conflict resolved or being resolved, a submodule): work of the user's, or not
    known to be the merge's, kept."""
    if not paths:
        return MERGE_LEFT_NOTHING
    for path in paths.values():
        modes = [e[0] for e in (path.head, path.result, *path.merge_index, *path.index) if e is not None]
        if GITLINK_MODE in modes or path.disk == "other":
            return MERGE_LEFT_OTHER
    if stopped:
        whole = all(
            sorted(path.index) == sorted(path.merge_index) and path.disk == on_disk(path.result)
            for path in paths.values()
        )
        return MERGE_LEFT_ITS_OWN if whole else MERGE_LEFT_OTHER
    left = False
    for path in paths.values():
        index, heads_index = tuple(sorted(path.index)), in_index(path.head)
        if index not in (heads_index, tuple(sorted(path.merge_index))):
            return MERGE_LEFT_OTHER
        if path.disk not in (on_disk(path.head), on_disk(path.result)):
            return MERGE_LEFT_OTHER
        left = left or index != heads_index or path.disk != on_disk(path.head)
    return MERGE_LEFT_ITS_OWN if left else MERGE_LEFT_NOTHING


def is_bsos_merge_message(merge_msg: str, message: str) -> bool:
    """Does MERGE_MSG (git's record of a merge stopped on a conflict) hold `message`, BSO's message for the merge
    (then git's `# Conflicts:` lines)? A merge of the user's holds git's own message, or theirs."""
    want = [line.rstrip() for line in message.strip().splitlines()]
    have = [line.rstrip() for line in merge_msg.strip().splitlines()]
    return bool(want) and have[: len(want)] == want and (len(have) == len(want) or not have[len(want)])


# --- activity boundary models --------------------------------------------------------------------

from pydantic import BaseModel, ConfigDict  # noqa: E402


class FinishStoryInput(BaseModel):
    """A story is done: squash its branch (P28) and merge it back into the project's branch."""

    model_config = ConfigDict(extra="forbid")
    project_root: str
    session_id: str
    story_key: str
    story_title: str = ""
    story_path: str = ""  # relative: the story file's current title wins over story_title
    squash: bool = True  # git_squash_strategy == per_story
    # auto_clear_git_track: once merged, the story's worktree, branch and scratch files go (the merge is
    # recorded); false keeps them for inspection.
    clear_track: bool = True


class FinishStoryResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    story_key: str
    merged: bool
    squashed: bool = False
    commit: str | None = None
    note: str = ""


# --- a done story's merge back ------------------------------------------------------------------------

NOT_MERGED_PREFIX = "not merged: "
# A done story with no work of its own on a branch (set done by hand before any commit): nothing is missing.
NOTHING_TO_MERGE = ("no branch: nothing to merge", "no commits on the story branch")
# The Master's word on a story whose batch ended while its merge ran, with no merge finished after it (the sprint
# cancelled, or a Master from before it finished such merges itself).
MERGE_CUT_SHORT = "its batch ended during the merge of its branch: check that it was merged"


def not_merged(why: str) -> str:
    """A done story's error when its branch did not merge back."""
    return f"{NOT_MERGED_PREFIX}{why}"


def error_says_work_left_out(error: str | None) -> bool:
    """For a story recorded before its merge's outcome was a flag (a sprint running across the upgrade): whether
    its error says its work may not be in the project (a merge that failed or was cut short)."""
    if not error:
        return False
    if error == MERGE_CUT_SHORT:
        return True
    return error.startswith(NOT_MERGED_PREFIX) and error.removeprefix(NOT_MERGED_PREFIX) not in NOTHING_TO_MERGE


class MergeOutcome(BaseModel):
    """How a done story's merge back ended, as its story shows it: `note` for its error (None: merged), and
    whether its work may be missing from the project (a merge that failed or was cut short; not a story with
    nothing to merge), which leaves the sprint partial (bso.report.undelivered_stories)."""

    note: str | None = None
    work_left_out: bool = False

    @classmethod
    def of(cls, result: FinishStoryResult) -> MergeOutcome:
        if result.merged:
            return cls()
        return cls(note=not_merged(result.note), work_left_out=result.note not in NOTHING_TO_MERGE)

    @classmethod
    def failed(cls, cause: str) -> MergeOutcome:
        """The merge activity failed (a conflict, git missing): the work stays on the story's branch."""
        return cls(note=not_merged(cause), work_left_out=True)

    @classmethod
    def cut_short(cls) -> MergeOutcome:
        """The batch ended while the merge ran and nobody finished it (the sprint was cancelled)."""
        return cls(note=MERGE_CUT_SHORT, work_left_out=True)
