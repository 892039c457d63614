"""BMAD sprint-status.yaml: parse, resolve keys, and edit one value byte-preservingly.

Pure: no file I/O, no clock. Safe to import inside Temporal workflows. The activity in
`activities/status_file.py` does the I/O and calls these helpers.
"""

from __future__ import annotations

import functools
import json
import math
import posixpath
import re
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import date, datetime
from typing import Any, Literal

from ruamel.yaml import YAML
from ruamel.yaml.comments import TaggedScalar
from ruamel.yaml.constructor import RoundTripConstructor
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from bso.models import TERMINAL_VALUES, StoryMeta, short_key
from bso.story_keys import EPIC_KEY_RE, MAX_NUMBER_DIGITS, RETRO_KEY_RE, SHORT_KEY_RE, STORY_KEY_RE

__all__ = [
    "EPIC_KEY_RE",
    "RETRO_KEY_RE",
    "STORY_KEY_RE",
    "SHORT_KEY_RE",
    "MAX_STATUS_BYTES",
    "StatusFileError",
    "StoryKeyError",
    "StatusEntry",
    "ParsedStatus",
    "StoryFileInfo",
    "TransitionResult",
    "classify_key",
    "parse_status_text",
    "short_key",
    "epic_key_of",
    "resolve_story_keys",
    "set_value",
    "set_top_level_value",
    "insert_story_entry",
    "compute_epic_changes",
    "format_last_updated",
    "apply_story_transition",
    "set_epics_back",
    "story_value",
    "story_values",
    "parse_story_file",
    "is_story_stub",
    "render_story_file",
    "title_from_slug",
    "resolve_inside",
    "is_inside",
    "resolve_story_location",
]

MAX_STATUS_BYTES = 5 * 1024 * 1024
MAX_VALUE_CHARS = 100  # of a development_status value (the longest state, needs-intervention, has 18)

EntryKind = Literal["epic", "story", "retrospective"]

# A value we may write as a plain (unquoted) YAML scalar.
_PLAIN_SAFE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+:-]*$")
_DATE_ONLY_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
# The line breaks ruamel counts (so our line numbers agree with its marks); the Unicode ones are refused (_load).
_LINE_BREAK_RE = re.compile(r"\r\n|\r|\n")
_UNEDITABLE_CHAR_RE = re.compile("[\x85\u2028\u2029\ufeff]")


class StatusFileError(ValueError):
    """A sprint-status.yaml problem; the message names the file, and line/column where known."""


class StoryKeyError(ValueError):
    """A requested story key is unknown or ambiguous."""


class UnknownEpicError(StoryKeyError):
    """A requested epic has no story in the status file."""


def _err(source: str, problem: str, line: int | None = None, column: int | None = None) -> StatusFileError:
    where = ""
    if line is not None:
        where = f"line {line}, " if column is None else f"line {line}, column {column}, "
        where = where[:-2] + ": "
    return StatusFileError(f"{source}: {where}{problem}")


# --- parsed shapes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class StatusEntry:
    key: str
    kind: EntryKind
    value: str
    line: int  # 1-based


@dataclass(frozen=True)
class ParsedStatus:
    project: str
    project_key: str
    story_location: str
    entries: list[StatusEntry]
    last_updated: str = ""  # the raw text of the value, "" when absent

    def values(self) -> dict[str, str]:
        return {e.key: e.value for e in self.entries}

    def stories(self) -> list[StatusEntry]:
        return [e for e in self.entries if e.kind == "story"]

    def epics(self) -> dict[str, str]:
        return {e.key: e.value for e in self.entries if e.kind == "epic"}

    def get(self, key: str) -> StatusEntry | None:
        for e in self.entries:
            if e.key == key:
                return e
        return None


@dataclass(frozen=True)
class StoryFileInfo:
    title: str = ""
    status: str = ""
    depends_on: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # `Files:` line: the files the story touches (P29)


@dataclass(frozen=True)
class TransitionResult:
    outcome: str  # written | already-applied | cas-mismatch
    story_key: str
    previous: str
    current: str
    epic_changes: dict[str, str]
    text: str  # the new text (== the input text unless outcome is written, or an epic was rolled up: epic_changes)


# --- keys ----------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1 << 16)  # pure; a U4 write classifies every key of the file
def classify_key(key: str) -> EntryKind | None:
    if EPIC_KEY_RE.match(key):
        return "epic"
    if RETRO_KEY_RE.match(key):
        return "retrospective"
    if STORY_KEY_RE.match(key):
        return "story"
    return None


@functools.lru_cache(maxsize=1 << 16)  # pure; the epic roll-up asks it for every story of the file
def epic_key_of(story_key: str) -> str:
    """`3-2-chunk-manager` (or `3-2`) -> `epic-3`."""
    m = STORY_KEY_RE.match(story_key) or SHORT_KEY_RE.match(story_key)
    if not m:
        raise StoryKeyError(f"not a story key: {story_key!r}")
    return f"epic-{int(m.group(1))}"


def resolve_story_keys(requested: list[str], known_full_keys: list[str]) -> list[str]:
    """Map each requested key (full `3-2-slug` or short `3-2`) to its full key; keeps order, drops repeats."""
    known = list(known_full_keys)
    known_set = set(known)
    out: list[str] = []
    for raw in requested:
        key = str(raw).strip()
        if key in known_set:
            full = key
        elif SHORT_KEY_RE.match(key):
            matches = [k for k in known if short_key(k) == key]
            if not matches:
                raise StoryKeyError(f"unknown story key {key!r}")
            if len(matches) > 1:
                raise StoryKeyError(f"ambiguous story key {key!r}: matches {', '.join(matches)}")
            full = matches[0]
        else:
            raise StoryKeyError(f"unknown story key {key!r}")
        if full not in out:
            out.append(full)
    return out


def story_dependencies(key: str, refs: list[str], known_full_keys: list[str]) -> tuple[list[str], list[str]]:
    """The stories a story file's `Depends on:` items name (full keys, in order, itself and repeats left out), and
    what is wrong with each item that names no story of the file (or several): it is ignored, and said so."""
    found: list[str] = []
    problems: list[str] = []
    for ref in refs:
        try:
            (full,) = resolve_story_keys([ref], known_full_keys)
        except StoryKeyError as exc:
            problems.append(f"{key}.md: Depends on {ref[:100]!r} ignored: {str(exc)[:300]}")
            continue
        if full != key and full not in found:
            found.append(full)
    return found, problems


def named_keys_error(named: dict[str, list[str]], known_full_keys: list[str], file_name: str) -> str | None:
    """A key the sprint's knobs or simulation script name (`where` -> keys) that is no story of the status file,
    or None: a typo would be ignored silently, the story run without its priority or its script."""
    for where, keys in named.items():
        try:
            resolve_story_keys(keys, known_full_keys)
        except StoryKeyError as err:
            return f"{where}: {err} (not a story of {file_name})"
    return None


SHARED_NUMBERS_AT_START = (
    "renumber one in the status file (and its story file), or leave all but one out of the sprint (--story)"
)


# The Master carries its stories (their metadata, views and batch results) through continue-as-new in one
# payload, which Temporal caps at 2 MB: ~550 bytes a story of the example project, most of it its metadata.
MAX_CARRIED_BYTES = 1_500_000
CARRIED_BYTES_PER_STORY = 300  # a story's view and batch result, besides its metadata


def too_large_to_carry(stories: list[StoryMeta]) -> str | None:
    """Why a sprint of these stories could not carry them from one run to the next, or None. A sprint over it
    ran until its first hand-over, whose workflow task then failed on every retry (the state over 2 MB)."""
    size = sum(len(story.model_dump_json()) + CARRIED_BYTES_PER_STORY for story in stories)
    if size <= MAX_CARRIED_BYTES:
        return None
    return (
        f"{len(stories)} stories make ~{size / 1e6:.1f} MB of sprint state with their story files' titles, "
        f"Depends on, Tags and Files: a sprint carries at most {MAX_CARRIED_BYTES / 1e6:.1f} MB (Temporal's "
        "payloads hold 2 MB): run the stories in several sprints (--epic, --story)"
    )


def shared_numbers(keys: Iterable[str], fix: str = SHARED_NUMBERS_AT_START) -> str | None:
    """Why these stories cannot run in one sprint, or None: two of them share a number (`1-2-login` and
    `1-2-logout`). A story's agent dispatches, debug requests and git branch are named by its number: the
    second story would take the first one's answers for its own."""
    by_number: dict[str, list[str]] = {}
    for key in keys:
        by_number.setdefault(short_key(key), []).append(key)
    shared = [f"{' and '.join(same)} ({number})" for number, same in by_number.items() if len(same) > 1]
    if not shared:
        return None
    return (
        f"stories that share a number: {'; '.join(shared)}. BSO names a story's agents' work and its git branch "
        f"by its number, so one story would take the other's answers: {fix}"
    )


EPIC_NOT_A_BOOL = "epic must be a number (2) or an epic's key (epic-2), not true or false"


def epic_as_given(requested: int | str) -> str:
    """The sprint's `epic` spelled as an epic's key, its number as given: `01` -> `epic-01`."""
    return f"epic-{str(requested).removeprefix('epic-')}"


def epic_numbered(requested: int | str) -> str:
    """The sprint's `epic` as `epic_key_of` spells its stories' epic: `01` and `epic-01` -> `epic-1`, as the
    file's stories `1-...` and `01-...` both belong to it. Not a number: as given (for the error)."""
    number = str(requested).removeprefix("epic-")
    if number.isascii() and number.isdigit() and len(number) <= MAX_NUMBER_DIGITS:
        return f"epic-{int(number)}"
    return epic_as_given(requested)


def resolve_epic(requested: int | str, known_full_keys: list[str], *, numbered: bool = True) -> str:
    """The sprint's `epic` (`2`, `"2"`, `"epic-2"`, `"02"`) -> `epic-2`, when the status file has a story of it.
    An epic without stories there is a typo more often than not: it would run an empty sprint.
    `numbered=False`: the number taken as spelled (before `02` named epic 2; workflows replaying that)."""
    epic = epic_numbered(requested) if numbered else epic_as_given(requested)
    known = sorted({epic_key_of(k) for k in known_full_keys}, key=lambda e: int(e.removeprefix("epic-")))
    if epic not in known:
        shown = epic if epic.isprintable() else repr(epic)  # `epic-1\n` said it had no story of epic-1
        raise UnknownEpicError(
            f"unknown epic {requested!r}: the status file has no story of {shown} "
            f"(its epics with stories: {', '.join(known) or 'none'})"
        )
    return epic


# A story in one of these states is not taken on by a new sprint: its journey is over (done, skipped) or a human
# must act first (needs-intervention: set its state back in the file, e.g. to ready-for-dev, to run it again).
SETTLED_AT_START = frozenset(TERMINAL_VALUES)
# Said of a status file a write cannot land in for now (its disk full or read-only): the sprint waits for it.
NOT_WRITABLE_NOW = "cannot be written now"
NOTHING_TO_RUN = (
    "nothing to run: every story selected is done, needs-intervention or skipped (to run a "
    "needs-intervention story again, set its state in the status file back, e.g. to ready-for-dev)"
)
EMPTY_STORY_SELECTION = (
    "nothing to run: story_keys is an empty list, which selects no story (leave story_keys out, or give it as "
    "null, for every story of the sprint's epic or file)"
)
NO_STORIES = (
    "nothing to run: the status file's development_status lists no story (only epics and retrospectives, or "
    "nothing): add the sprint's stories, e.g. `1-1-login-form: backlog` under `epic-1`"
)


def stories_outside_epic_error(epic: str, wanted: Iterable[str]) -> str | None:
    """Both an epic and stories given, the sprint takes the named stories of the epic: the named stories outside
    it, which would be dropped in silence, or None."""
    if outside := sorted(k for k in set(wanted) if epic_key_of(k) != epic):
        return (
            f"{', '.join(outside)} not in {epic}: with an epic, the stories named are picked among its own "
            "(name the epic's stories, or leave the epic out)"
        )
    return None


def stories_to_run(stories: list[tuple[str, str]], epic: int | str | None, story_keys: list[str]) -> list[str]:
    """The keys (file order) a sprint on these (key, state) stories would take on, by the Master's selection:
    its epic's and its requested stories, not settled. Raises UnknownEpicError / StoryKeyError."""
    known = [key for key, _ in stories]
    chosen = resolve_epic(epic, known) if epic is not None else None
    wanted = set(resolve_story_keys(story_keys, known)) if story_keys else None
    if chosen is not None and wanted and (error := stories_outside_epic_error(chosen, wanted)) is not None:
        raise StoryKeyError(error)
    return [
        key
        for key, state in stories
        if state not in SETTLED_AT_START
        and (chosen is None or epic_key_of(key) == chosen)
        and (wanted is None or key in wanted)
    ]


def title_from_slug(story_key: str) -> str:
    """`3-2-chunk-manager` -> `Chunk Manager`."""
    m = STORY_KEY_RE.match(story_key)
    slug = m.group(4) if m else story_key
    return " ".join(w.capitalize() for w in slug.split("-") if w)


# --- parsing -------------------------------------------------------------------------------------


class _LenientScalarConstructor(RoundTripConstructor):
    """ruamel 0.19 resolves a few plain words as numbers (`._`, `+_`, `0x_`: its patterns let `_` stand for digits)
    and then fails to convert them, so a valid file failed with no line. YAML 1.2 reads them as strings; so do we.
    Likewise a date that is no day (`generated: 2026-02-30`): the line scan takes it as text, and BSO needs no
    top-level date as a date, so both paths read it as the text it is (it failed with Python's bare ValueError)."""

    def _value_or_text(self, construct: Any, node: Any) -> Any:
        try:
            return construct(self, node)
        except (ValueError, IndexError):
            return self.construct_yaml_str(node)

    def construct_lenient_int(self, node: Any) -> Any:
        return self._value_or_text(RoundTripConstructor.construct_yaml_int, node)

    def construct_lenient_float(self, node: Any) -> Any:
        return self._value_or_text(RoundTripConstructor.construct_yaml_float, node)

    def construct_lenient_timestamp(self, node: Any) -> Any:
        return self._value_or_text(RoundTripConstructor.construct_yaml_timestamp, node)


_LenientScalarConstructor.add_constructor("tag:yaml.org,2002:int", _LenientScalarConstructor.construct_lenient_int)
_LenientScalarConstructor.add_constructor("tag:yaml.org,2002:float", _LenientScalarConstructor.construct_lenient_float)
_LenientScalarConstructor.add_constructor(
    "tag:yaml.org,2002:timestamp", _LenientScalarConstructor.construct_lenient_timestamp
)


def _yaml() -> YAML:
    y = YAML(typ="rt")
    y.Constructor = _LenientScalarConstructor
    y.allow_duplicate_keys = False
    return y


def _mark_of(exc: MarkedYAMLError) -> tuple[int | None, int | None]:
    mark = exc.problem_mark or exc.context_mark
    if mark is None:
        return None, None
    return mark.line + 1, mark.column + 1


def _load(text: str, source: str) -> Any:
    if not isinstance(text, str):
        raise _err(source, f"expected text, got {type(text).__name__}")
    if len(text) > MAX_STATUS_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_STATUS_BYTES:
        raise _err(source, f"file too large (over {MAX_STATUS_BYTES} bytes)")
    if (odd := _UNEDITABLE_CHAR_RE.search(text, 1 if text.startswith("\ufeff") else 0)) is not None:
        # ruamel breaks lines at the Unicode line breaks outside quotes but not inside, and leaves a BOM out of its
        # columns: where its marks point, the in-place edit found another line or column, and wrote over another
        # field. A BOM that starts the file is allowed (_offset_in_line counts it).
        char = odd.group()
        what = "a byte order mark (U+FEFF) after the file's start" if char == "\ufeff" else (
            f"a Unicode line break (U+{ord(char):04X}), which YAML readers split lines at differently"
        )
        line, column = _line_and_column(text, odd.start())
        raise _err(
            source,
            f"{what}: BSO cannot edit the file safely; remove it (in a double-quoted value it can be written as an "
            "escape)",
            line,
            column,
        )
    try:
        return _yaml().load(text)
    except MarkedYAMLError as exc:
        line, col = _mark_of(exc)
        problem = exc.problem or exc.context or type(exc).__name__
        start = exc.context_mark
        if exc.problem and exc.context and start is not None and exc.problem_mark is not None and (
            start.line != exc.problem_mark.line
        ):  # an unclosed bracket is noticed on a later line: name the line that opened it too
            problem += f" ({exc.context} started at line {start.line + 1}, column {start.column + 1})"
        elif "<stream end>" in problem and (lines := text.rstrip().splitlines()):
            # noticed past the last line (an unclosed `[` there): the line to look at is that last one
            problem += f" (the file ends inside a value: see its last line, line {len(lines)})"
        raise _err(source, f"YAML error: {problem}", line, col) from None
    except YAMLError as exc:
        raise _err(source, f"YAML error: {exc}") from None
    except RecursionError:
        raise _err(source, "YAML error: nesting too deep") from None
    except Exception as exc:  # noqa: BLE001 - any loader failure is a bad file, never a crash
        raise _err(source, f"YAML error: {type(exc).__name__}: {exc}") from None


def _lc_key(mapping: Any, key: Any) -> tuple[int | None, int | None]:
    try:
        line, col = mapping.lc.key(key)
        return line + 1, col + 1
    except Exception:  # noqa: BLE001
        return None, None


def _lc_value(mapping: Any, key: Any) -> tuple[int | None, int | None]:
    try:
        line, col = mapping.lc.value(key)
        return line + 1, col + 1
    except Exception:  # noqa: BLE001
        return None, None


def _type_name(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, datetime | date):
        return "a date"
    if isinstance(value, TaggedScalar):  # `!!str backlog`: BSO writes values back plain, so it takes them plain
        tag = str(getattr(value.tag, "value", value.tag)).replace("tag:yaml.org,2002:", "!!")
        return f"a value tagged {tag} (write it without the tag: {value.value})"
    return type(value).__name__


def _scalar_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime | date):
        return value.isoformat()
    return str(value)


def _top_scalar(doc: Mapping[Any, Any], key: str, source: str) -> str:
    if key not in doc:
        return ""
    value = doc[key]
    if isinstance(value, Mapping | list):
        line, col = _lc_value(doc, key)
        raise _err(source, f"{key} must be a scalar, got {_type_name(value)}", line, col)
    return _scalar_text(value)


def _parse_doc(text: str, source: str) -> tuple[Any, ParsedStatus]:
    """The parsed document (read only: callers must not change it) and its entries.

    Cached: one U4 write parses the same texts several times (the CAS, each in-place edit and its
    check, the read-back), and a ruamel round-trip parse costs ~0.1 s per 1,000 stories."""
    return _parse_doc_cached(text, source)


@functools.lru_cache(maxsize=8)
def _parse_doc_cached(text: str, source: str) -> tuple[Any, ParsedStatus]:
    doc = _load(text, source)
    if not isinstance(doc, Mapping):
        got = "an empty document" if doc is None else _type_name(doc)
        raise _err(source, f"top level must be a mapping, got {got}")
    try:
        return doc, _build(doc, text, source)
    except StatusFileError:
        raise
    except Exception as exc:  # noqa: BLE001 - odd YAML objects must not crash the caller
        raise _err(source, f"malformed status file: {type(exc).__name__}: {exc}") from None


def _build(doc: Mapping[Any, Any], text: str, source: str) -> ParsedStatus:
    if "development_status" not in doc:
        raise _err(source, "missing development_status")
    ds = doc["development_status"]
    if not isinstance(ds, Mapping):
        line, col = _lc_key(doc, "development_status")
        got = _type_name(ds)
        raise _err(source, f"development_status must be a mapping, got {got}", line, col)
    if merged := [k for k in ds if _lc_key(ds, k)[0] is None]:
        # A key with no line of its own under development_status came from a merge key (an anchor's map): BSO
        # writes each story's state on its own line, so the first write failed, after the story's agent had run.
        line, col = _lc_key(doc, "development_status")
        raise _err(
            source,
            f"development_status takes {', '.join(map(repr, merged[:5]))}{' ...' if len(merged) > 5 else ''} from a "
            "YAML merge key (<<): BSO writes each story's state on its own line; list them under development_status",
            line,
            col,
        )
    entries: list[StatusEntry] = []
    for k in ds:
        line, col = _lc_key(ds, k)
        if not isinstance(k, str):
            raise _err(source, f"invalid key {k!r} in development_status (not a string)", line, col)
        kind = classify_key(k)
        if kind is None:
            raise _err(
                source,
                f"invalid key {k!r} in development_status (expected epic-N, epic-N-retrospective or N-M-slug, "
                f"numbers of at most {MAX_NUMBER_DIGITS} digits)",
                line,
                col,
            )
        v = ds[k]
        if not isinstance(v, str):
            vline, vcol = _lc_value(ds, k)
            got = _type_name(v)
            raise _err(source, f"value of {k!r} must be a string, got {got}", vline or line, vcol or col)
        if "\n" in v or "\r" in v:
            vline, vcol = _lc_value(ds, k)
            raise _err(source, f"value of {k!r} spans several lines", vline or line, vcol or col)
        if len(v) > MAX_VALUE_CHARS:  # a state is a word; this one would travel in every payload of the story
            vline, vcol = _lc_value(ds, k)
            raise _err(
                source, f"value of {k!r} is {len(v)} characters long, {v[:40]!r}...: a state is a word such as "
                f"ready-for-dev (at most {MAX_VALUE_CHARS} characters)", vline or line, vcol or col,
            )  # fmt: skip
        if kind == "story":
            # BSO writes a story's state over its value, in place: a value it could not write there (an anchor, an
            # alias, a block scalar, one continued on the next line) failed that write after the story's agent ran.
            _locate(text, ds, k, source)
        entries.append(StatusEntry(key=k, kind=kind, value=str(v), line=line or 0))
    return ParsedStatus(
        project=_top_scalar(doc, "project", source),
        project_key=_top_scalar(doc, "project_key", source),
        story_location=_top_scalar(doc, "story_location", source),
        entries=entries,
        last_updated=_top_scalar(doc, "last_updated", source),
    )


def parse_status_text(text: str, source: str) -> ParsedStatus:
    """Parse a BMAD sprint-status.yaml; any problem raises StatusFileError (never another exception).

    A file in BMAD's plain layout is read by a line scan (same result; see `_fast_scan`)."""
    fast = _fast_parsed(text)
    if fast is not None:
        return fast
    return _parse_doc(text, source)[1]


# --- byte-preserving edit ------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)  # the parse locates every story's value in the same text
def _line_spans(text: str) -> tuple[tuple[int, int], ...]:
    """(start, end-without-break) of each line, counting breaks the way ruamel does."""
    spans: list[tuple[int, int]] = []
    pos = 0
    for m in _LINE_BREAK_RE.finditer(text):
        spans.append((pos, m.start()))
        pos = m.end()
    spans.append((pos, len(text)))
    return tuple(spans)


def _token_end(line: str, col: int, flow: bool) -> int | None:
    """End (exclusive) of the scalar token starting at `col` on `line`, or None if it is not on one line."""
    if col >= len(line):
        return None
    ch = line[col]
    if ch == "'":
        i = col + 1
        while i < len(line):
            if line[i] == "'":
                if i + 1 < len(line) and line[i + 1] == "'":
                    i += 2
                    continue
                return i + 1
            i += 1
        return None
    if ch == '"':
        i = col + 1
        while i < len(line):
            if line[i] == "\\":
                i += 2
                continue
            if line[i] == '"':
                return i + 1
            i += 1
        return None
    if ch in "|>[{&*!#":
        return None
    end = len(line)
    c = line.find(" #", col)
    if c != -1:
        end = c
    t = line.find("\t#", col)
    if t != -1:
        end = min(end, t)
    if flow:
        for stop in ",]}":
            s = line.find(stop, col)
            if s != -1:
                end = min(end, s)
    end_stripped = len(line[col:end].rstrip(" \t")) + col
    return end_stripped if end_stripped > col else None


def _render_token(old_token: str, new_value: str) -> str:
    if old_token.startswith("'"):
        return "'" + new_value.replace("'", "''") + "'"
    if old_token.startswith('"'):
        return json.dumps(new_value, ensure_ascii=False)
    if _PLAIN_SAFE_RE.match(new_value):
        return new_value
    return "'" + new_value.replace("'", "''") + "'"


def _plain_reads_as_string(token: str, value: str) -> bool:
    if token.startswith(("'", '"')):
        return True
    try:
        got = _yaml().load("v: " + token + "\n")
    except Exception:  # noqa: BLE001
        return False
    return isinstance(got, Mapping) and isinstance(got.get("v"), str) and got["v"] == value


def _line_and_column(text: str, offset: int) -> tuple[int, int]:
    """The 1-based line and column of `offset`, as ruamel counts them (a BOM that starts the file not counted)."""
    breaks = list(_LINE_BREAK_RE.finditer(text, 0, offset))
    line_start = breaks[-1].end() if breaks else (1 if text.startswith("\ufeff") else 0)
    return len(breaks) + 1, offset - line_start + 1


def _same(a: Any, b: Any) -> bool:
    """Equal as values, for the check after an edit: NaN equals NaN, a tagged scalar compares by tag and value."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, TaggedScalar) and isinstance(b, TaggedScalar):
        return (str(a.tag), a.value) == (str(b.tag), b.value)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a is b or a == b)


def _offset_in_line(text: str, line: int, column: int) -> int:
    """Where ruamel's (1-based) column is in the line's text: on the first line it does not count a BOM."""
    return column - 1 + (1 if line == 1 and text.startswith("\ufeff") else 0)


def _not_in_place(source: str, key: str, why: str, value: Any, line: int | None, column: int | None) -> StatusFileError:
    plainly = f": `{key}: {value}`" if isinstance(value, str) and _PLAIN_SAFE_RE.match(value) else ""
    return _err(
        source, f"cannot edit the value of {key!r} in place: {why}; write it plainly on one line{plainly}", line, column
    )


def _locate(text: str, mapping: Any, key: str, source: str) -> tuple[int, int, str]:
    """(start offset, end offset, raw token) of the value of `key` in `mapping`: the one token on one line an
    in-place edit replaces. A value that is not such a token raises StatusFileError saying why."""
    vline, vcol = _lc_value(mapping, key)
    if vline is None or vcol is None:
        raise _err(source, f"cannot locate the value of {key!r}")
    value = mapping[key]
    kline, kcol = _lc_key(mapping, key)
    if kline is not None and kcol is not None and (vline, vcol) < (kline, kcol):
        # An alias (`key: *name`): ruamel places its value at the anchor, which always comes before it.
        raise _not_in_place(source, key, f"it is an alias of the value on line {vline}", value, kline, kcol)
    spans = _line_spans(text)
    if vline - 1 >= len(spans):
        raise _err(source, f"cannot locate the value of {key!r}", vline)
    lstart, lend = spans[vline - 1]
    line = text[lstart:lend]
    flow = False
    try:
        flow = bool(mapping.fa.flow_style())
    except Exception:  # noqa: BLE001
        flow = False
    col = _offset_in_line(text, vline, vcol)
    end = _token_end(line, col, flow)
    if end is None:
        first = line[col:].split()[0] if line[col:].strip() else ""
        if first.startswith("&"):  # other lines may take it by its alias: the edit would change them too
            why = f"it carries an anchor ({first})"
        elif first.startswith(("|", ">")):
            why = f"it is a block scalar ({first})"
        else:
            why = "it is not a one-line scalar"
        raise _not_in_place(source, key, why, value, vline, vcol)
    token = line[col:end]
    if isinstance(value, str) and not token.startswith(("'", '"')) and token != value:
        # a plain value folded from several lines: the edit would replace its first line only
        raise _not_in_place(source, key, "it goes on over the next line", value, vline, vcol)
    return lstart + col, lstart + end, token


def _replace(text: str, start: int, end: int, token: str) -> str:
    return text[:start] + token + text[end:]


def set_value(text: str, key: str, new_value: str, source: str) -> str:
    """Change only the value of `key` in development_status; every other byte stays."""
    doc, before = _parse_doc(text, source)
    ds = doc["development_status"]
    if key not in ds:
        raise _err(source, f"no key {key!r} in development_status")
    if "\n" in new_value or "\r" in new_value:
        raise _err(source, f"new value for {key!r} must be one line")
    start, end, old_token = _locate(text, ds, key, source)
    token = _render_token(old_token, new_value)
    if not _plain_reads_as_string(token, new_value):
        token = "'" + new_value.replace("'", "''") + "'"
    new_text = _replace(text, start, end, token)
    _, after = _parse_doc(new_text, source)
    expected = before.values()
    expected[key] = new_value
    if after.values() != expected or [e.key for e in after.entries] != [e.key for e in before.entries]:
        raise _err(source, f"editing {key!r} in place changed more than its value")
    if (after.project, after.project_key, after.story_location) != (
        before.project,
        before.project_key,
        before.story_location,
    ):
        raise _err(source, f"editing {key!r} in place changed more than its value")
    return new_text


def insert_story_entry(text: str, after_key: str, new_key: str, value: str, source: str) -> str:
    """Add `new_key: value` to development_status on the line after `after_key`; every other byte stays."""
    if classify_key(new_key) != "story":
        raise StoryKeyError(f"not a story key: {new_key!r}")
    if not _PLAIN_SAFE_RE.match(value):
        raise _err(source, f"value {value!r} for {new_key!r} is not a plain status value")
    doc, before = _parse_doc(text, source)
    ds = doc["development_status"]
    if new_key in ds:
        raise _err(source, f"key {new_key!r} already in development_status")
    if after_key not in ds:
        raise _err(source, f"no key {after_key!r} in development_status")
    kline, kcol = _lc_key(ds, after_key)
    if kline is None or kcol is None:
        raise _err(source, f"cannot locate {after_key!r}")
    spans = _line_spans(text)
    lstart, lend = spans[kline - 1]
    newline = "\r\n" if "\r\n" in text else "\n"
    indent = text[lstart : lstart + _offset_in_line(text, kline, kcol)]
    if indent.strip():
        raise _err(source, f"cannot add a story after {after_key!r} (not in block style)")
    line_break = text[lend : lend + len(newline)] if text[lend:].startswith(newline) else ""
    insertion = f"{indent}{new_key}: {value}"
    if line_break:
        new_text = text[: lend + len(line_break)] + insertion + line_break + text[lend + len(line_break) :]
    else:
        new_text = text[:lend] + newline + insertion + text[lend:]
    _, after = _parse_doc(new_text, source)
    keys = [e.key for e in before.entries]
    keys.insert(keys.index(after_key) + 1, new_key)
    expected = before.values()
    expected[new_key] = value
    if [e.key for e in after.entries] != keys or after.values() != expected:
        raise _err(source, f"adding {new_key!r} after {after_key!r} changed more than one line")
    return new_text


def set_top_level_value(text: str, key: str, new_value: str, source: str) -> str:
    """Change only the value of the top-level scalar `key` (e.g. last_updated); every other byte stays."""
    doc, before = _parse_doc(text, source)
    if key not in doc:
        raise _err(source, f"no top-level key {key!r}")
    if key == "development_status" or isinstance(doc[key], Mapping | list):
        raise _err(source, f"top-level {key!r} is not a scalar")
    if "\n" in new_value or "\r" in new_value:
        raise _err(source, f"new value for {key!r} must be one line")
    start, end, old_token = _locate(text, doc, key, source)
    token = _render_token(old_token, new_value)
    new_text = _replace(text, start, end, token)
    new_doc, after = _parse_doc(new_text, source)
    if (
        after.entries != before.entries
        or list(new_doc.keys()) != list(doc.keys())
        or not all(_same(new_doc[k], doc[k]) for k in doc if k != key)
    ):
        raise _err(source, f"editing {key!r} in place changed more than its value")
    _, _, check = _locate(new_text, new_doc, key, source)
    if check != token:
        raise _err(source, f"editing {key!r} in place did not take")
    return new_text


# --- U4: the one story transition ----------------------------------------------------------------

_NOT_STARTED = {"backlog", "skipped"}
# An epic is done when all its stories are done (BMAD: "All stories in epic completed"): a skipped story (its
# dependency failed, or dropped) was never implemented and holds it open. An epic done already is left done when a
# story of it is skipped (dropped by a course correction); one that runs again (a rearm) reopens it.
_KEEP_EPIC_DONE = {"done", "skipped"}


def epic_entry_key(keys: Collection[str], epic_key: str) -> str | None:
    """The status file's own key for `epic-N` (`epic_key_of`'s spelling): itself, or the file's `epic-01`,
    which names the same epic as its stories `1-...`; None when the file has no entry for the epic."""
    if epic_key in keys:
        return epic_key
    number = int(epic_key.removeprefix("epic-"))
    return next((k for k in keys if (m := EPIC_KEY_RE.match(k)) and int(m.group(1)) == number), None)


def compute_epic_changes(values: dict[str, str], epic_key: str) -> dict[str, str]:
    """Epic transitions after a story change: backlog -> in-progress when a story started; -> done when
    all its stories are done (a skipped one holds it open); done -> in-progress when a story of it runs again."""
    entry = epic_entry_key(values, epic_key)
    if entry is None:
        return {}
    stories = [
        v for k, v in values.items() if STORY_KEY_RE.match(k) and epic_key_of(k) == epic_key
    ]
    return _epic_roll_up(entry, values[entry], stories)


def epics_finished_since(
    epic_stories: Mapping[str, Iterable[str]], keys: Collection[str], value: Callable[[str], str], but: str | None
) -> dict[str, str]:
    """The epics (but the entry `but`, the written story's, rolled up by compute_epic_changes) whose stories are all
    done, their entry not `done` yet: a story set done by hand, the last of its epic, left the epic
    open (BSO rolled up only the epic of the story it wrote). `epic_stories`: epic key -> its stories' keys;
    `keys`: the file's keys; `value(key)`: a key's value in the file. Only to `done`: an epic's other moves follow
    BSO's own story writes."""
    out: dict[str, str] = {}
    # Asked on every write (the hot path): an epic with a story not done is passed at that story, and the
    # file's epic entries are found in one pass, if needed (epic_entry_key scans every key for an epic without
    # one: 13 ms a write for a 1,000-story file without epic lines).
    entries: dict[int, str] | None = None
    for epic_key, stories in epic_stories.items():
        if any(value(k) != "done" for k in stories):
            continue
        if epic_key in keys:
            entry: str | None = epic_key
        else:
            if entries is None:
                entries = {}
                for k in keys:
                    if (m := EPIC_KEY_RE.match(k)) is not None:
                        entries.setdefault(int(m.group(1)), k)
            entry = entries.get(int(epic_key.removeprefix("epic-")))
        if entry is None or entry == but or entry in out or value(entry) == "done":
            continue
        if _epic_roll_up(entry, value(entry), [value(k) for k in stories]).get(entry) == "done":
            out[entry] = "done"
    return out


def _epic_roll_up(epic_key: str, current: str, stories: list[str]) -> dict[str, str]:
    """compute_epic_changes once the epic's current value and its stories' values are known."""
    if not stories:
        return {}
    if all(v == "done" for v in stories):
        return {} if current == "done" else {epic_key: "done"}
    if current == "done" and any(v not in _KEEP_EPIC_DONE for v in stories):
        return {epic_key: "in-progress"}  # a story of it runs again (a rearm, a course correction brought it back)
    if current == "backlog" and any(v not in _NOT_STARTED for v in stories):
        return {epic_key: "in-progress"}
    return {}


def format_last_updated(old_raw: str, now: datetime) -> str:
    """`now` in the style of the old value: date only if the old value was a date, else ISO seconds + Z."""
    old = old_raw.strip().strip("'\"")
    if _DATE_ONLY_RE.match(old):
        return now.strftime("%Y-%m-%d")
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


# --- U4 fast path: a status file in BMAD's plain block layout, edited line by line -------------------
#
# A round-trip YAML parse costs ~0.1 s per 1,000 stories and U4 did two to four of them per write under
# the file lock. A file made only of the lines BMAD writes (top-level `key: scalar`, one
# `development_status:` block of `  key: plain-value` entries at one indentation, comments, blank lines)
# is recognised by one regular expression per line; its edits replace one token on one line and give
# the same bytes as the YAML path. Anything else (flow style, anchors, quoted or odd values, tabs, CR,
# duplicates, unusual keys) takes the YAML path, which also produces every error message.

_FAST_TOP_RE = re.compile(
    r"(?P<key>[A-Za-z_][A-Za-z0-9_]*):"
    r"(?:[ ]+(?P<val>[A-Za-z0-9_./(+][A-Za-z0-9_ ./:()+-]*?|'(?:[^'\n]|'')*'|\"(?:[^\"\\\n]|\\.)*\"))?"
    r"(?:[ ]+#.*)?[ ]*"
)
_FAST_ENTRY_RE = re.compile(r"(?P<ind>[ ]+)(?P<key>[0-9a-z][a-z0-9-]*):[ ]+(?P<val>[a-z][a-z0-9-]*)(?:[ ]+#.*)?[ ]*")
_FAST_VALUE_RE = re.compile(r"[a-z][a-z0-9-]*")
_FAST_NOT_STRINGS = frozenset({"true", "false", "null", "yes", "no", "on", "off", "y", "n"})
_YAML_NULLS = frozenset({"null", "Null", "NULL", "~"})  # a last_updated the YAML path reads as none: left alone
_FAST_DATE_KEY_RE = re.compile(r"\d{4}-\d{1,2}-\d{1,2}")  # YAML would read such a key as a date
_FAST_ODD_CHARS_RE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff\ud800-\udfff]")


@dataclass(frozen=True)
class _FastFile:
    lines: list[str]
    entries: dict[str, tuple[int, int, int, str]]  # key -> (line index, value start, value end, value)
    last_updated: tuple[int, int, int] | None  # (line index, token start, token end) of a non-empty value
    top: dict[str, str | None]  # top-level key -> its raw value token (None: no value)
    epic_stories: dict[str, tuple[str, ...]]  # epic key -> its stories' keys, in file order


class _ScanCache:
    """The last few texts' scans. A U4 write scans the text it read, then the text it wrote when it reads
    it back; the write derives the second scan from the first (`_fast_transition`), so with a thousand
    stories a write costs no line-by-line scan unless another writer changed the file. Thread-safe: loads
    and writes run in activity threads."""

    def __init__(self, size: int = 4) -> None:
        self._size = size
        self._scans: dict[str, _FastFile | None] = {}
        self._lock = threading.Lock()

    def get(self, text: str) -> tuple[bool, _FastFile | None]:
        with self._lock:
            if text in self._scans:
                return True, self._scans[text]
            return False, None

    def put(self, text: str, scan: _FastFile | None) -> None:
        with self._lock:
            self._scans.pop(text, None)
            self._scans[text] = scan
            while len(self._scans) > self._size:
                del self._scans[next(iter(self._scans))]


_scans = _ScanCache()


def _fast_scan(text: str) -> _FastFile | None:
    """The file's entries if it is in the plain BMAD layout, else None (then the YAML path decides).
    The result is shared (cached): callers never modify it."""
    found, scan = _scans.get(text)
    if not found:
        scan = _scan_lines(text)
        _scans.put(text, scan)
    return scan


def _scan_lines(text: str) -> _FastFile | None:
    if len(text) > MAX_STATUS_BYTES // 4 and len(text.encode("utf-8", "surrogatepass")) > MAX_STATUS_BYTES:
        return None
    if _FAST_ODD_CHARS_RE.search(text):
        return None
    lines = text.split("\n")
    top: dict[str, str | None] = {}
    entries: dict[str, tuple[int, int, int, str]] = {}
    last_updated = None
    in_block = False
    indent = None
    for i, line in enumerate(lines):
        stripped = line.lstrip(" ")
        if not stripped or stripped.startswith("#"):
            continue
        if line[0] != " ":
            m = _FAST_TOP_RE.fullmatch(line)
            if m is None or m["key"] in top:
                return None
            key, val = m["key"], m["val"]
            if val is not None and not val.startswith(("'", '"')) and (val.endswith(":") or ": " in val):
                return None
            top[key] = val
            in_block = key == "development_status"
            if in_block and val is not None:
                return None
            if key == "last_updated" and val is not None and val not in _YAML_NULLS:
                last_updated = (i, m.start("val"), m.end("val"))
            continue
        if not in_block:
            return None
        m = _FAST_ENTRY_RE.fullmatch(line)
        if m is None or (indent is not None and m["ind"] != indent):
            return None
        indent = m["ind"]
        key, val = m["key"], m["val"]
        if key in entries or classify_key(key) is None or _FAST_DATE_KEY_RE.match(key) or val in _FAST_NOT_STRINGS:
            return None
        if len(val) > MAX_VALUE_CHARS:  # the YAML path says why
            return None
        entries[key] = (i, m.start("val"), m.end("val"), val)
    if not entries:
        return None
    epic_stories: dict[str, list[str]] = {}
    for key in entries:
        if classify_key(key) == "story":
            epic_stories.setdefault(epic_key_of(key), []).append(key)
    return _FastFile(lines, entries, last_updated, top, {k: tuple(v) for k, v in epic_stories.items()})


_FAST_STR_RE = re.compile(r"[A-Za-z_/][A-Za-z0-9_ ./:()+-]*")  # a plain scalar YAML reads as this string
_FAST_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")  # read as a date, shown as the same text


def _fast_top_text(raw: str | None) -> str | None:
    """What the YAML path makes of a top-level value (`_top_scalar`), or None when unsure."""
    if raw is None:
        return ""
    if raw.startswith("'"):
        return raw[1:-1].replace("''", "'")
    if raw.startswith('"'):
        return None if "\\" in raw else raw[1:-1]
    if _FAST_DATE_RE.fullmatch(raw):
        return raw
    if _FAST_STR_RE.fullmatch(raw) and raw.lower() not in _FAST_NOT_STRINGS and ": " not in raw:
        return raw
    return None


def _fast_parsed(text: str) -> ParsedStatus | None:
    """parse_status_text for the plain BMAD layout (same result), or None: not that layout."""
    fast = _fast_scan(text)
    if fast is None:
        return None
    fields = {}
    for key in ("project", "project_key", "story_location", "last_updated"):
        value = _fast_top_text(fast.top.get(key)) if key in fast.top else ""
        if value is None:
            return None
        fields[key] = value
    entries = [
        StatusEntry(key=k, kind=classify_key(k), value=v[3], line=v[0] + 1)  # type: ignore[arg-type]
        for k, v in fast.entries.items()
    ]
    return ParsedStatus(entries=entries, **fields)


def story_values(text: str, keys: Iterable[str], source: str) -> dict[str, str | None]:
    """The values of `keys` in development_status (None when absent); cheap for the plain BMAD layout."""
    fast = _fast_scan(text)
    if fast is not None:
        return {key: found[3] if (found := fast.entries.get(key)) is not None else None for key in keys}
    parsed = parse_status_text(text, source)
    return {key: entry.value if (entry := parsed.get(key)) is not None else None for key in keys}


def story_value(text: str, key: str, source: str) -> str | None:
    """The value of `key` in development_status (None when absent)."""
    return story_values(text, [key], source)[key]


def _fast_transition(
    text: str, story_key: str, expected: str, new: str, now: datetime, source: str
) -> TransitionResult | None:
    """apply_story_transition for the plain BMAD layout (same result, same bytes); None: not that layout."""
    if not _FAST_VALUE_RE.fullmatch(new) or new in _FAST_NOT_STRINGS:
        return None
    fast = _fast_scan(text)
    if fast is None:
        return None
    key = story_key if story_key in fast.entries and classify_key(story_key) == "story" else None
    if key is None:  # a short key (or an unknown one): resolved against every story, with its errors
        stories = [k for k in fast.entries if classify_key(k) == "story"]
        try:
            (key,) = resolve_story_keys([story_key], stories)
        except StoryKeyError as exc:
            raise StoryKeyError(f"{source}: {exc}") from None
    current = fast.entries[key][3]
    outcome = "already-applied" if current == new else "cas-mismatch" if current != expected else "written"
    if outcome != "written":  # the story's line is left; an epic finished by hand meanwhile is rolled up
        finished = epics_finished_since(fast.epic_stories, fast.entries, lambda k: fast.entries[k][3], None)
        if not finished:
            return TransitionResult(outcome, key, current, current, {}, text)
    lines = list(fast.lines)
    entries = dict(fast.entries)
    top = dict(fast.top)
    last_updated = fast.last_updated

    def put(line_index: int, start: int, end: int, token: str) -> int:
        line = lines[line_index]
        lines[line_index] = line[:start] + token + line[end:]
        return start + len(token)

    epic_changes: dict[str, str] = {}
    edits: list[tuple[str, str]] = []
    if outcome == "written":
        edits.append((key, new))
        epic_key = epic_key_of(key)
        epic_entry = epic_entry_key(fast.entries, epic_key)
        if epic_entry is not None:
            siblings = [new if k == key else fast.entries[k][3] for k in fast.epic_stories.get(epic_key, ())]
            epic_changes = _epic_roll_up(epic_entry, fast.entries[epic_entry][3], siblings)
        epic_changes.update(
            epics_finished_since(
                fast.epic_stories, fast.entries, lambda k: new if k == key else fast.entries[k][3], epic_entry
            )
        )
    else:
        epic_changes = finished
    for k, v in [*edits, *epic_changes.items()]:
        line_index, start, end, _ = fast.entries[k]
        entries[k] = (line_index, start, put(line_index, start, end, v), v)  # a plain value for a plain value
    if last_updated is not None:
        line_index, start, end = last_updated
        raw = fast.lines[line_index][start:end]
        token = _render_token(raw, format_last_updated(raw, now))
        last_updated = (line_index, start, put(line_index, start, end, token))
        top["last_updated"] = token
    new_text = "\n".join(lines)
    # The scan of the new text, derived (what _scan_lines(new_text) gives: same lines, one token each
    # changed for another of the same kind), so the read-back and the next write find it.
    _scans.put(new_text, _FastFile(lines, entries, last_updated, top, fast.epic_stories))
    return TransitionResult(outcome, key, current, new if outcome == "written" else current, epic_changes, new_text)


def apply_story_transition(
    text: str, story_key: str, expected: str, new: str, now: datetime, source: str
) -> TransitionResult:
    """The pure half of U4: compare-and-swap one story's value, with epic and last_updated follow-ups.
    `now` must be UTC. Unknown story keys raise StoryKeyError."""
    fast = _fast_transition(text, story_key, expected, new, now, source)
    if fast is not None:
        return fast
    return _yaml_transition(text, story_key, expected, new, now, source)


def set_epics_back(
    text: str, result: TransitionResult, epics_back: Mapping[str, tuple[str, str]], source: str
) -> TransitionResult:
    """`result` (apply_story_transition on `text`: a story set back to its value before a write being undone), with
    the epic lines that write rolled put back too. `epics_back`: epic entry -> (the value the undone write rolled
    it to, the value it held before). Compare-and-set, as the story's: an epic `text` holds at another value (edited
    by hand since), or that this write rolls itself, stays; none is put back when the story was not set back
    (cas-mismatch: its epic follows the value it holds). An epic rolled `done` stays: all its stories were done
    (by hand), and the next write would roll it again. So does one whose stories, the story set back, would roll
    it from its value before again: another story of it under way since (a batch's: its write rolled nothing, the
    epic rolled already), `backlog` put back would say it not started. (A story `ready-for-dev` does not hold a
    `backlog` epic: files hold that shape before any write, and putting back restores it.)"""
    if result.outcome == "cas-mismatch" or not epics_back:
        return result
    found = story_values(text, epics_back, source)
    new_text, put_back = result.text, {}
    values: dict[str, str] | None = None  # the file after the write: parsed for a candidate only (not the hot path)
    for epic, (rolled, before) in epics_back.items():
        if found[epic] != rolled or epic in result.epic_changes or rolled in ("done", before):
            continue
        if classify_key(epic) != "epic":
            continue
        if values is None:
            values = parse_status_text(result.text, source).values()
        stories = [
            v for k, v in values.items()
            if classify_key(k) == "story" and epic_key_of(k) == epic and not (before == "backlog" and v == "ready-for-dev")
        ]
        if _epic_roll_up(epic, before, stories):
            continue
        try:
            new_text = set_value(new_text, epic, before, source)
        except StatusFileError:  # (an anchor, a folded value: as the roll-up, a courtesy that never fails the write)
            continue
        put_back[epic] = before
    if not put_back:
        return result
    return replace(result, text=new_text, epic_changes={**result.epic_changes, **put_back})


def _yaml_transition(
    text: str, story_key: str, expected: str, new: str, now: datetime, source: str
) -> TransitionResult:
    """apply_story_transition through the round-trip YAML parser: any layout, every error message."""
    doc, parsed = _parse_doc(text, source)
    stories = [e.key for e in parsed.stories()]
    try:
        (key,) = resolve_story_keys([story_key], stories)
    except StoryKeyError as exc:
        raise StoryKeyError(f"{source}: {exc}") from None
    values = parsed.values()
    current = values[key]
    outcome = "already-applied" if current == new else "cas-mismatch" if current != expected else "written"
    epic_stories: dict[str, list[str]] = {}
    for k in values:
        if STORY_KEY_RE.match(k):
            epic_stories.setdefault(epic_key_of(k), []).append(k)
    if outcome != "written":  # the story's line is left; an epic finished by hand meanwhile is rolled up
        rolled_up = epics_finished_since(epic_stories, values, values.__getitem__, None)
        new_text = text
    else:
        new_text = set_value(text, key, new, source)
        values[key] = new
        rolled_up = compute_epic_changes(values, epic_key_of(key))
        rolled_up.update(
            epics_finished_since(epic_stories, values, values.__getitem__, epic_entry_key(values, epic_key_of(key)))
        )
    epic_changes: dict[str, str] = {}
    for ek, ev in rolled_up.items():
        try:
            new_text = set_value(new_text, ek, ev, source)
        except StatusFileError:  # (an anchor, a folded value: the roll-up is a courtesy; it never fails the story)
            continue
        epic_changes[ek] = ev
    if outcome != "written" and not epic_changes:
        return TransitionResult(outcome, key, current, current, {}, text)
    if "last_updated" in doc and doc["last_updated"] is not None and not isinstance(
        doc["last_updated"], Mapping | list
    ):
        try:
            _, _, raw = _locate(text, doc, "last_updated", source)
        except StatusFileError:
            raw = ""
        if raw:
            new_text = set_top_level_value(new_text, "last_updated", format_last_updated(raw, now), source)
    return TransitionResult(outcome, key, current, new if outcome == "written" else current, epic_changes, new_text)


# --- story files ---------------------------------------------------------------------------------

_TITLE_RE = re.compile(r"^\s*#\s*Story\s+[0-9]+[.\-][0-9]+[a-z]?\s*:\s*(.+?)\s*#*\s*$", re.MULTILINE)
_STATUS_RE = re.compile(r"^[ \t]*\**Status\**[ \t]*:[ \t]*\**[ \t]*(\S.*?)[ \t]*$", re.MULTILINE | re.IGNORECASE)


def _field_re(name: str) -> re.Pattern[str]:
    """`Name: value` on one line (spaces and tabs only around it: an empty value must not run into the next
    lines), bold or bulleted as Markdown may have it."""
    return re.compile(
        rf"^[ \t>*-]*\**[ \t]*{name}[ \t]*\**[ \t]*:[ \t]*\**[ \t]*(.*?)[ \t]*$", re.MULTILINE | re.IGNORECASE
    )


_DEPENDS_RE = _field_re(r"depends[ _-]?on")
_TAGS_RE = _field_re("tags")
_FILES_RE = _field_re("files")
_BULLET_RE = re.compile(r"[ \t]*[-*+][ \t]+(.*?)[ \t]*")
_NONE_WORDS = {"", "none", "-", "n/a", "na", "nothing", "[]"}
_JOINING_WORDS = {"and", "&"}  # `Depends on: 1-1 and 1-2`


def _split_list(raw: str) -> list[str]:
    """Items separated by commas; without a comma, by spaces (so a path with a space needs commas)."""
    raw = raw.strip().strip("*").strip()
    if raw.startswith("[") and raw.endswith("]"):
        raw = raw[1:-1]
    if raw.strip().lower() in _NONE_WORDS:
        return []
    out: dict[str, None] = {}  # in order, each once (a list's `in` made a long line quadratic)
    for part in re.split(r"\s*,\s*" if "," in raw else r"\s+", raw):
        item = part.strip().strip("'\"`").strip()
        if item and item.lower() not in _NONE_WORDS | _JOINING_WORDS:
            out.setdefault(item)
    return list(out)


def _field_items(text: str, pattern: re.Pattern[str]) -> list[str]:
    """A field's items: on its line, or (the line empty) as the bullet list right below it."""
    match = pattern.search(text)
    if match is None:
        return []
    if match.group(1).strip("* \t"):
        return _split_list(match.group(1))
    bullets: list[str] = []
    for line in text[match.end() :].split("\n")[1:]:
        if not line.strip() and not bullets:
            continue  # a blank line between the field and its list
        bullet = _BULLET_RE.fullmatch(line)
        if bullet is None:
            break
        bullets.append(bullet.group(1))
    return _split_list(", ".join(bullets))


MAX_TITLE_CHARS = 200  # a title is shown, not used: a longer one is cut (it travelled with the story in every payload)


_STORY_WORD_RE = re.compile(r"\bstory[ \t]+(?=[0-9])", re.IGNORECASE)  # `Depends on: Story 1.2`
_DOTTED_RE = re.compile(r"([0-9]+)\.([0-9]+[a-z]?)")  # BMAD's story numbering, as in `# Story 1.2: ...`


def _dependency(item: str) -> str:
    """A `Depends on:` item as a story key: `1.2` (`Story 1.2`, the word taken off first) is the story numbered 1-2."""
    return f"{dotted.group(1)}-{dotted.group(2)}" if (dotted := _DOTTED_RE.fullmatch(item)) else item


def parse_story_file(text: str) -> StoryFileInfo:
    """Lenient: title, Status, `Depends on:`, `Tags:` and `Files:` of a BMAD story file; missing parts are empty."""
    title_m = _TITLE_RE.search(text)
    status_m = _STATUS_RE.search(text)
    refs = _field_items(_STORY_WORD_RE.sub("", text), _DEPENDS_RE)
    depends_on = list(dict.fromkeys(_dependency(item) for item in refs))
    return StoryFileInfo(
        title=title_m.group(1).strip()[:MAX_TITLE_CHARS] if title_m else "",
        status=status_m.group(1).strip() if status_m else "",
        depends_on=depends_on,
        tags=[t.lower() for t in _field_items(text, _TAGS_RE)],
        files=_field_items(text, _FILES_RE),
    )


def is_story_stub(text: str) -> bool:
    """Whether a story file holds only what parse_story_file reads, for the story-creator to write the story from
    (its `# Story N.M: Title`, `Status:`, `Depends on:`, `Tags:` and `Files:` lines, a field's bullet list): an
    empty one does. Anything else (an `## Acceptance Criteria` section, a paragraph) is a story written already."""
    field_res = (_STATUS_RE, _DEPENDS_RE, _TAGS_RE, _FILES_RE)
    in_list = False  # the bullet list right below an empty field
    for line in text.splitlines():
        if not line.strip() or _TITLE_RE.fullmatch(line):
            continue
        if in_list and _BULLET_RE.fullmatch(line):
            continue
        field = next((m for r in field_res if (m := r.fullmatch(line)) is not None), None)
        if field is None:
            return False
        in_list = not field.group(1).strip("* \t")
    return True


def render_story_file(
    story_key: str,
    title: str,
    epic_num: int | str,
    story_num: int | str,
    status: str,
    acceptance_criteria: list[str],
    depends_on: list[str] | None = None,
    tags: list[str] | None = None,
    revision: int = 1,
    files: list[str] | None = None,
) -> str:
    """A BMAD story document that parse_story_file reads back (title, status, depends_on, tags, files)."""
    title = title or title_from_slug(story_key)
    acs = [a.strip() for a in acceptance_criteria if a and a.strip()] or [f"{title} works as described"]
    lines = [
        f"# Story {epic_num}.{story_num}: {title}",
        "",
        f"Status: {status}",
        "",
    ]
    if depends_on:
        lines.append(f"Depends on: {', '.join(depends_on)}")
    if tags:
        lines.append(f"Tags: {', '.join(tags)}")
    if files:
        lines.append(f"Files: {', '.join(files)}")
    if depends_on or tags or files:
        lines.append("")
    lines += [
        "## Story",
        "",
        "As a user,",
        f"I want {title[:1].lower() + title[1:]},",
        "so that the project delivers this capability.",
        "",
        "## Acceptance Criteria",
        "",
    ]
    lines += [f"{i}. {ac}" for i, ac in enumerate(acs, 1)]
    lines += ["", "## Tasks / Subtasks", ""]
    for i, ac in enumerate(acs, 1):
        lines.append(f"- [ ] Task {i}: {ac} (AC: {i})")
        lines.append(f"  - [ ] Subtask {i}.1: write tests for AC {i}")
    lines += [
        "",
        "## Dev Notes",
        "",
        f"- Story key: `{story_key}`",
        f"- Revision: {revision}",
        "",
        "## Dev Agent Record",
        "",
        "### Agent Model Used",
        "",
        "### Completion Notes List",
        "",
        "### File List",
        "",
    ]
    return "\n".join(lines)


# --- paths (pure arithmetic, no filesystem) ------------------------------------------------------


def is_inside(root: str, path: str) -> bool:
    """Is the normalised absolute `path` equal to or under the normalised absolute `root`?"""
    r = posixpath.normpath(root)
    p = posixpath.normpath(path)
    if r == "/":
        return p.startswith("/")
    return p == r or p.startswith(r + "/")


def project_root_error(project_root: str) -> str | None:
    """Why a sprint's project_root cannot be used, or None. It must be absolute: a relative one would be
    resolved against each worker's own working directory, so a worker restarted elsewhere (or a second
    worker) would read and write another project, or none."""
    if "\x00" in project_root:
        return f"project_root {project_root!r} contains a NUL byte"
    if not posixpath.isabs(project_root):
        return f"project_root {project_root!r} is relative: give the absolute path the workers see the project at"
    return None


def resolve_inside(project_root: str, relative: str) -> str:
    """Join a relative path onto project_root; reject absolute paths and `..` escapes (ValueError)."""
    if not relative or "\x00" in relative:
        raise ValueError(f"invalid path {relative!r}")
    if posixpath.isabs(relative) or relative.startswith("\\") or re.match(r"^[A-Za-z]:[\\/]", relative):
        raise ValueError(f"absolute path not allowed: {relative!r}")
    norm = posixpath.normpath(relative)
    if norm == ".." or norm.startswith("../"):
        raise ValueError(f"path escapes the project: {relative!r}")
    root = posixpath.normpath(project_root)
    joined = posixpath.normpath(posixpath.join(root, norm))
    if not is_inside(root, joined):
        raise ValueError(f"path escapes the project: {relative!r}")
    return joined


_PLACEHOLDER_RE = re.compile(r"\{project[-_]root\}")


def resolve_story_location(project_root: str, raw: str, default_rel: str) -> str:
    """The story directory relative to project_root (posix, "." for the root itself).

    `raw` may be empty (-> default_rel), relative, absolute inside the project, or start with a
    `{project-root}` / `{project_root}` placeholder. Anything outside the project -> ValueError."""
    root = posixpath.normpath(project_root)
    loc = (raw or "").strip()
    if not loc:
        loc = default_rel or "."
    if _PLACEHOLDER_RE.search(loc):
        loc = _PLACEHOLDER_RE.sub(lambda _m: root, loc)
    if posixpath.isabs(loc):
        full = posixpath.normpath(loc)
        if not is_inside(root, full):
            raise ValueError(f"story_location {raw!r} is outside the project")
    else:
        full = resolve_inside(root, loc) if posixpath.normpath(loc) != "." else root
    rel = posixpath.relpath(full, root)
    return rel
