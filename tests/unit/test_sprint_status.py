"""bso.sprint_status: BMAD sprint-status.yaml parsing, key grammar, byte-preserving edits, story files."""

from __future__ import annotations

import difflib
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bso import sprint_status
from bso.sprint_status import (
    UnknownEpicError,
    EPIC_KEY_RE,
    RETRO_KEY_RE,
    STORY_KEY_RE,
    StatusFileError,
    StoryKeyError,
    apply_story_transition,
    classify_key,
    compute_epic_changes,
    epic_key_of,
    format_last_updated,
    insert_story_entry,
    is_inside,
    stories_to_run,
    parse_status_text,
    parse_story_file,
    render_story_file,
    project_root_error,
    resolve_epic,
    resolve_inside,
    resolve_story_keys,
    resolve_story_location,
    set_epics_back,
    set_top_level_value,
    set_value,
    shared_numbers,
    short_key,
    story_dependencies,
    too_large_to_carry,
    title_from_slug,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "sprint-status.yaml"
SRC = "sprint-status.yaml"


def fixture_text() -> str:
    return FIXTURE.read_text(encoding="utf-8")


def changed_lines(old: str, new: str) -> list[str]:
    return [
        line
        for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]


# --- key grammar ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key,kind",
    [
        ("epic-1", "epic"),
        ("epic-12", "epic"),
        ("epic-3-retrospective", "retrospective"),
        ("1-1-foo", "story"),
        ("3-2-chunk-manager", "story"),
        ("2-6a-foo", "story"),
        ("10-11-a1-b2", "story"),
    ],
)
def test_valid_keys(key: str, kind: str) -> None:
    assert classify_key(key) == kind


@pytest.mark.parametrize(
    "key",
    ["../x", "/abs", "Foo Bar", "epic-", "epic-x", "1-1", "1-1-Foo", "1-1-foo_bar", "2-6ab-foo", "a-1-foo",
     "1-1-foo/../x", "epic-1-retro", "1-1-", "1-1-foo bar", "",
     # `$` matched before a final line break: a quoted "1-1-login\n" passed for a story
     "1-1-login\n", "epic-1\n", "epic-1-retrospective\n"],
)
def test_invalid_keys(key: str) -> None:
    assert classify_key(key) is None


def test_regex_constants_exported() -> None:
    assert EPIC_KEY_RE.match("epic-2")
    assert RETRO_KEY_RE.match("epic-2-retrospective")
    assert STORY_KEY_RE.match("2-6a-foo")


def test_short_key_and_epic_key() -> None:
    assert short_key("3-2-chunk-manager") == "3-2"
    assert short_key("2-6a-foo") == "2-6a"
    assert epic_key_of("3-2-chunk-manager") == "epic-3"
    assert epic_key_of("2-6a-foo") == "epic-2"
    assert epic_key_of("3-2") == "epic-3"
    with pytest.raises(ValueError):
        epic_key_of("epic-3")


def test_title_from_slug() -> None:
    assert title_from_slug("3-2-chunk-manager") == "Chunk Manager"
    assert title_from_slug("2-6a-compaction-hints") == "Compaction Hints"


# --- parsing -------------------------------------------------------------------------------------


def test_parse_realistic_fixture() -> None:
    p = parse_status_text(fixture_text(), SRC)
    assert p.project == "chunkstore"
    assert p.project_key == "CHUNK"
    assert p.story_location == "{project-root}/_bmad-output/implementation-artifacts"
    assert p.last_updated.startswith("2025-10-05")
    values = p.values()
    assert values["epic-1"] == "in-progress"
    assert values["1-2-config-loader"] == "review"
    assert values["1-3-logging"] == "ready-for-dev"
    assert values["2-1-block-format"] == "backlog"
    assert values["2-6a-compaction-hints"] == "drafted"  # legacy value kept
    assert values["3-2-chunk-manager"] == "in-progress"
    kinds = {e.key: e.kind for e in p.entries}
    assert kinds["epic-2"] == "epic"
    assert kinds["epic-2-retrospective"] == "retrospective"
    assert kinds["2-6a-compaction-hints"] == "story"
    assert [e.key for e in p.entries][:3] == ["epic-1", "1-1-project-scaffold", "1-2-config-loader"]
    # 1-based line numbers agree with the file
    lines = fixture_text().splitlines()
    for e in p.entries:
        assert lines[e.line - 1].lstrip().lstrip("'\"").startswith(e.key)
    assert p.epics() == {"epic-1": "in-progress", "epic-2": "backlog", "epic-3": "backlog"}
    assert len(p.stories()) == 8


def test_unknown_values_are_kept() -> None:
    p = parse_status_text("development_status:\n  1-1-a: banana\n", SRC)
    assert p.values() == {"1-1-a": "banana"}
    assert p.project == "" and p.story_location == ""


def test_syntax_error_names_file_line_and_column() -> None:
    text = "project: x\ndevelopment_status:\n  1-1-a: done\n  1-2-b: [review\n"
    with pytest.raises(StatusFileError) as ei:
        parse_status_text(text, SRC)
    msg = str(ei.value)
    assert msg.startswith("sprint-status.yaml: line ")
    assert "column" in msg


def test_duplicate_key_is_an_error_with_position() -> None:
    text = "project: x\n\n\n\n\ndevelopment_status:\n  1-1-foo: done\n  1-1-foo: review\n"
    with pytest.raises(StatusFileError) as ei:
        parse_status_text(text, SRC)
    msg = str(ei.value)
    assert "sprint-status.yaml: line 8, column 3" in msg
    assert 'found duplicate key "1-1-foo"' in msg


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("- a\n- b\n", "top level must be a mapping"),
        ("", "top level must be a mapping"),
        ("just a string\n", "top level must be a mapping"),
        ("project: x\n", "missing development_status"),
        ("development_status:\n", "development_status must be a mapping"),
        ("development_status: [a, b]\n", "development_status must be a mapping"),
        ("development_status:\n  1-1-a: 3\n", "line 2, column 10: value of '1-1-a' must be a string"),
        ("development_status:\n  1-1-a:\n", "value of '1-1-a' must be a string"),
        ("development_status:\n  1-1-a: [done]\n", "value of '1-1-a' must be a string"),
        ("development_status:\n  1-1-a: true\n", "must be a string"),
        # It said "got TaggedScalar".
        ("development_status:\n  1-1-a: !!str backlog\n", "got a value tagged !!str (write it without the tag: backlog)"),
        ("development_status:\n  1-1-a: !mine done\n", "got a value tagged !mine (write it without the tag: done)"),
        ("development_status:\n  1-1-a: done\n  ../x: done\n", "line 3, column 3: invalid key '../x'"),
        ("development_status:\n  /abs: done\n", "invalid key '/abs'"),
        ("development_status:\n  Foo Bar: done\n", "invalid key 'Foo Bar'"),
        ("development_status:\n  7: done\n", "invalid key 7"),
        ("project: [x]\ndevelopment_status: {}\n", "project must be a scalar"),
    ],
)
def test_structural_errors(text: str, fragment: str) -> None:
    with pytest.raises(StatusFileError) as ei:
        parse_status_text(text, SRC)
    assert str(ei.value).startswith(SRC + ":")
    assert fragment in str(ei.value)


def test_too_large_rejected_before_parsing() -> None:
    text = "development_status: {}\n" + "#" * (5 * 1024 * 1024)
    with pytest.raises(StatusFileError, match="too large"):
        parse_status_text(text, SRC)


def test_empty_development_status_is_fine() -> None:
    assert parse_status_text("development_status: {}\n", SRC).entries == []


# --- byte-preserving edits -----------------------------------------------------------------------


def test_set_value_changes_exactly_one_line() -> None:
    old = fixture_text()
    new = set_value(old, "2-2-chunk-manager", "ready-for-dev", SRC)
    diff = changed_lines(old, new)
    assert diff == ["-  2-2-chunk-manager: backlog", "+  2-2-chunk-manager: ready-for-dev"]
    assert parse_status_text(new, SRC).values()["2-2-chunk-manager"] == "ready-for-dev"


def test_set_value_keeps_trailing_comment_and_quoting() -> None:
    old = fixture_text()
    new = set_value(old, "1-2-config-loader", "done", SRC)
    assert changed_lines(old, new) == [
        "-  1-2-config-loader: review   # waiting on second reviewer",
        "+  1-2-config-loader: done   # waiting on second reviewer",
    ]
    new = set_value(old, "1-3-logging", "review", SRC)
    assert changed_lines(old, new) == ["-  1-3-logging: 'ready-for-dev'", "+  1-3-logging: 'review'"]
    new = set_value(old, "2-1-block-format", "story-doc-review", SRC)
    assert changed_lines(old, new) == [
        '-  2-1-block-format: "backlog"',
        '+  2-1-block-format: "story-doc-review"',
    ]
    new = set_value(old, "3-1-http-server", "ready-for-dev", SRC)
    assert changed_lines(old, new) == [
        "-  3-1-http-server: backlog # first API story",
        "+  3-1-http-server: ready-for-dev # first API story",
    ]


def test_set_value_preserves_crlf_and_other_bytes() -> None:
    old = "# head\r\ndevelopment_status:\r\n  epic-1: backlog\r\n  1-1-a: backlog  # c\r\n"
    new = set_value(old, "1-1-a", "done", SRC)
    assert new == "# head\r\ndevelopment_status:\r\n  epic-1: backlog\r\n  1-1-a: done  # c\r\n"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (
            "\ufefflast_updated: 2025-01-05\nproject: P\ndevelopment_status:\n  epic-1: backlog\n  1-1-a: review\n",
            "\ufefflast_updated: 2026-03-04\nproject: P\ndevelopment_status:\n  epic-1: done\n  1-1-a: done\n",
        ),
        ("\ufeffdevelopment_status: {1-1-a: review, 1-2-b: backlog}\n", "\ufeffdevelopment_status: {1-1-a: done, 1-2-b: backlog}\n"),
        ("\ufeffdevelopment_status: {1-1-a:  review}\n", "\ufeffdevelopment_status: {1-1-a:  done}\n"),
    ],
    ids=["block", "flow", "flow-two-spaces"],
)
def test_a_file_that_starts_with_a_bom_is_edited_in_place(old: str, new: str) -> None:
    """ruamel does not count a UTF-8 BOM in its columns: every write to a file whose first line holds a value (as
    Windows editors save it) edited one character early and failed, or dropped a byte."""
    r = apply_story_transition(old, "1-1-a", "review", "done", NOW, SRC)
    assert (r.outcome, r.text) == ("written", new)


@pytest.mark.parametrize("char", ["\u2028", "\u2029", "\x85"])
@pytest.mark.parametrize("stories_first", [True, False])
def test_a_unicode_line_break_is_refused_naming_where_it_is(char: str, stories_first: bool) -> None:
    """ruamel breaks lines at U+2028, U+2029 and U+0085 outside quotes but not in a quoted value, so the edit
    found the wrong line: `last_updated` was written over `project_name` with no error, or every write failed
    with a made-up YAML error."""
    stories = "development_status:\n  epic-1: backlog\n  1-1-a: review\n"
    top = f"project: 'Acme{char}Portal'\nproject_name: Foo\nlast_updated: 2026-01-05\n"
    text = stories + top if stories_first else top + stories
    line = 4 if stories_first else 1
    hex_code = f"{ord(char):04X}"
    with pytest.raises(StatusFileError, match=rf"line {line}, column 15: a Unicode line break \(U\+{hex_code}\)"):
        parse_status_text(text, SRC)
    with pytest.raises(StatusFileError, match="a Unicode line break"):
        apply_story_transition(text, "1-1-a", "review", "done", NOW, SRC)


@pytest.mark.parametrize("other", ["x: .nan", "x: !foo bar", "x: {a: !foo b, b: [.NaN, !bar c]}"])
@pytest.mark.parametrize("newline", ["\n", "\r\n"])  # CRLF takes the YAML path
def test_values_that_never_compare_equal_do_not_stop_a_write(other: str, newline: str) -> None:
    """The check after an edit compares the other top-level values: a NaN or a custom-tagged value is never `==`
    to itself, and every write to such a file was refused."""
    old = newline.join([other, "last_updated: 2025-01-05", "development_status:", "  1-1-a: review", ""])
    r = apply_story_transition(old, "1-1-a", "review", "done", NOW, SRC)
    assert r.outcome == "written" and r.text == old.replace("2025-01-05", "2026-03-04").replace("review", "done")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("a: 1\rb: 2\rproject: 'x\u2028y'\rdevelopment_status: {}\r", "line 3, column 12: a Unicode line break"),
        ("\ufeffproject: 'x\u2029y'\ndevelopment_status: {}\n", "line 1, column 12: a Unicode line break"),
        ("a: 1\ndevelopment_status: {1-1-a: 'in\ufeffx'}\n", "line 2, column 32: a byte order mark (U+FEFF) after"),
    ],
    ids=["cr-only", "after-a-bom", "bom-inside"],
)
def test_a_character_the_editor_cannot_place_is_refused_where_ruamel_would_say(text: str, where: str) -> None:
    """A BOM inside the file (ruamel skips it in its columns) made the edit land one character off; the line and
    column named count lines as ruamel does (CR-only too) and leave out a BOM that starts the file."""
    with pytest.raises(StatusFileError, match=re.escape(where)):
        parse_status_text(text, SRC)


def test_a_top_level_edit_that_changes_another_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check after an in-place edit compared the stories and the keys only: a value located one line off (as a
    Unicode line break made it) was written over the next key's, and the check's own look, one line off too,
    found the new value and let it through."""

    locate = sprint_status._locate

    def one_line_off(text: str, mapping, key: str, source: str) -> tuple[int, int, str]:
        if key != "a":  # the parse locates each story's value
            return locate(text, mapping, key, source)
        lines = text.split("\n")
        below = next(i for i, line in enumerate(lines) if line.startswith(f"{key}: ")) + 1
        start = sum(len(line) + 1 for line in lines[:below]) + lines[below].index(": ") + 2
        end = start + len(lines[below]) - lines[below].index(": ") - 2
        return start, end, text[start:end]

    monkeypatch.setattr(sprint_status, "_locate", one_line_off)
    with pytest.raises(StatusFileError, match="changed more than its value"):
        set_top_level_value("a: x\nb: y\ndevelopment_status:\n  1-1-a: review\n", "a", "z", SRC)


def test_set_value_value_on_next_line_and_flow_style() -> None:
    old = "development_status:\n  1-1-a:\n    backlog\n  1-2-b: done\n"
    assert set_value(old, "1-1-a", "review", SRC) == "development_status:\n  1-1-a:\n    review\n  1-2-b: done\n"
    old = "development_status: {1-1-a: backlog, 1-2-b: done}\n"
    assert set_value(old, "1-1-a", "review", SRC) == "development_status: {1-1-a: review, 1-2-b: done}\n"


def test_set_value_quotes_values_that_would_not_read_as_strings() -> None:
    old = "development_status:\n  1-1-a: backlog\n"
    new = set_value(old, "1-1-a", "true", SRC)
    assert parse_status_text(new, SRC).values()["1-1-a"] == "true"
    new = set_value(old, "1-1-a", "odd value: # x", SRC)
    assert parse_status_text(new, SRC).values()["1-1-a"] == "odd value: # x"


def test_set_value_unknown_key() -> None:
    with pytest.raises(StatusFileError, match="no key"):
        set_value(fixture_text(), "9-9-nope", "done", SRC)


def test_set_top_level_value() -> None:
    old = fixture_text()
    new = set_top_level_value(old, "last_updated", "2026-01-02T03:04:05Z", SRC)
    assert changed_lines(old, new) == [
        "-last_updated: 2025-10-05T14:22:03Z",
        "+last_updated: 2026-01-02T03:04:05Z",
    ]
    with pytest.raises(StatusFileError):
        set_top_level_value(old, "nope", "x", SRC)


def test_format_last_updated() -> None:
    now = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
    assert format_last_updated("2025-01-01", now) == "2026-03-04"
    assert format_last_updated("'2025-01-01'", now) == "2026-03-04"
    assert format_last_updated("2025-01-01T10:00:00Z", now) == "2026-03-04T05:06:07Z"
    assert format_last_updated("2025-01-01 10:00", now) == "2026-03-04T05:06:07Z"


# --- the pure U4 transition ----------------------------------------------------------------------

NOW = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)


def test_transition_written_with_epic_and_last_updated() -> None:
    old = fixture_text()
    r = apply_story_transition(old, "2-1", "backlog", "story-doc-review", NOW, SRC)
    assert r.outcome == "written"
    assert (r.story_key, r.previous, r.current) == ("2-1-block-format", "backlog", "story-doc-review")
    assert r.epic_changes == {"epic-2": "in-progress"}
    assert sorted(changed_lines(old, r.text)) == sorted(
        [
            "-last_updated: 2025-10-05T14:22:03Z",
            "+last_updated: 2026-03-04T05:06:07Z",
            "-  epic-2: backlog",
            "+  epic-2: in-progress",
            '-  2-1-block-format: "backlog"',
            '+  2-1-block-format: "story-doc-review"',
        ]
    )


def test_transition_already_applied_and_cas_mismatch() -> None:
    old = fixture_text()
    r = apply_story_transition(old, "1-2-config-loader", "ready-for-dev", "review", NOW, SRC)
    assert r.outcome == "already-applied" and r.text == old
    r = apply_story_transition(old, "1-2-config-loader", "ready-for-dev", "done", NOW, SRC)
    assert r.outcome == "cas-mismatch" and r.text == old and r.current == "review"
    with pytest.raises(StoryKeyError):
        apply_story_transition(old, "9-9", "backlog", "done", NOW, SRC)


def test_epic_done_when_all_done() -> None:
    text = "development_status:\n  epic-1: in-progress\n  1-1-a: done\n  1-2-b: review\n"
    r = apply_story_transition(text, "1-2", "review", "done", NOW, SRC)
    assert r.epic_changes == {"epic-1": "done"}
    assert parse_status_text(r.text, SRC).values()["epic-1"] == "done"
    # a backlog epic whose only story finishes goes straight to done
    assert compute_epic_changes({"epic-1": "backlog", "1-1-a": "done"}, "epic-1") == {"epic-1": "done"}
    # no epic key: nothing
    assert compute_epic_changes({"1-1-a": "done"}, "epic-1") == {}
    # epic stays when nothing started
    assert compute_epic_changes({"epic-1": "backlog", "1-1-a": "backlog"}, "epic-1") == {}


@pytest.mark.parametrize("fast", [True, False], ids=["bmad-layout", "yaml-path"])
def test_a_done_epic_whose_story_runs_again_is_in_progress_again(fast: bool) -> None:
    """A rearm brought back a story skipped in an epic rolled up to done (its other story done): the epic stayed
    `done` over a `ready-for-dev` story, and the sprint's shutdown left it so."""
    text = "development_status:\n  epic-2: done\n  2-1-a: skipped\n  2-2-b: done\n"
    if not fast:
        text = text.replace("epic-2: done", "epic-2: 'done'")  # quoted: not BMAD's plain layout
    r = apply_story_transition(text, "2-1", "skipped", "ready-for-dev", NOW, SRC)
    assert r.epic_changes == {"epic-2": "in-progress"}
    assert parse_status_text(r.text, SRC).values()["epic-2"] == "in-progress"
    done = apply_story_transition(r.text, "2-1", "ready-for-dev", "done", NOW, SRC)
    assert done.epic_changes == {"epic-2": "done"}


@pytest.mark.parametrize("fast", [True, False], ids=["bmad-layout", "yaml-path"])
def test_an_epic_whose_last_story_was_set_done_by_hand_is_rolled_up_at_the_next_write(fast: bool) -> None:
    """1-2 set `done` by hand mid-sprint, the last of epic-1 not done: BSO rolled up only the epic of the story it
    wrote, and epic-1 stayed in-progress for good. The next write of any story rolls it up, from the file's
    story values, as does a write that finds its story's value not the one expected (set by hand: no write of
    the story); an epic not all finished, or none done, or done already, is left as it is."""
    text = (
        "development_status:\n  epic-1: in-progress\n  1-1-a: done\n  1-2-b: done\n"
        "  epic-2: backlog\n  2-1-c: ready-for-dev\n"
        "  epic-3: in-progress\n  3-1-d: done\n  3-2-e: review\n"
        "  epic-4: in-progress\n  4-1-f: skipped\n"
        "  epic-5: done\n  5-1-g: done\n"
    )
    if not fast:
        text = text.replace("epic-2: backlog", "epic-2: 'backlog'")  # quoted: not BMAD's plain layout
    r = apply_story_transition(text, "2-1", "ready-for-dev", "in-progress", NOW, SRC)
    assert r.outcome == "written" and r.epic_changes == {"epic-2": "in-progress", "epic-1": "done"}
    values = parse_status_text(r.text, SRC).values()
    assert [values[f"epic-{n}"] for n in range(1, 6)] == ["done", "in-progress", "in-progress", "in-progress", "done"]
    epic_2 = ("backlog", "in-progress") if fast else ("'backlog'", "'in-progress'")
    assert changed_lines(text, r.text) == [
        "-  epic-1: in-progress", "+  epic-1: done", f"-  epic-2: {epic_2[0]}", "-  2-1-c: ready-for-dev",
        f"+  epic-2: {epic_2[1]}", "+  2-1-c: in-progress",
    ]
    # the story written is of the epic: as before, its own roll-up
    r = apply_story_transition(r.text, "3-2", "review", "done", NOW, SRC)
    assert r.epic_changes == {"epic-3": "done"}
    # the story's value there already, or another than expected (set by hand too): its line is left, the epic
    # rolled up all the same (the Slave's write of a story set done by hand finds it so, then writes no more)
    epic_2_done = [f"-  epic-2: {epic_2[0]}", "+  epic-2: done" if fast else "+  epic-2: 'done'"]
    for value, outcome, changes, lines in (
        ("in-progress", "already-applied", {"epic-1": "done"}, []),
        ("done", "cas-mismatch", {"epic-1": "done", "epic-2": "done"}, epic_2_done),  # 2-1 done by hand too
    ):
        hand = text.replace("2-1-c: ready-for-dev", f"2-1-c: {value}")
        r = apply_story_transition(hand, "2-1", "ready-for-dev", "in-progress", NOW, SRC)
        assert (r.outcome, r.current, r.epic_changes) == (outcome, value, changes)
        assert changed_lines(hand, r.text) == ["-  epic-1: in-progress", "+  epic-1: done", *lines]
        settled = apply_story_transition(r.text, "2-1", "ready-for-dev", "in-progress", NOW, SRC)
        assert (settled.outcome, settled.epic_changes, settled.text) == (outcome, {}, r.text)  # nothing more


def test_a_write_undoing_another_puts_back_the_epic_lines_it_rolled() -> None:
    """A refused course correction writes its added stories' values back: the epic line an added story's write
    rolled (epic-2 backlog -> in-progress, 2-2-b under way) stayed rolled, though none of its stories moved. Put
    back where it still holds the value rolled to; an epic edited since, one rolled done (its stories all done by
    hand), one the write rolls itself, any epic when the story was not set back (edited since), stay."""
    text = (
        "development_status:\n  epic-2: backlog\n  2-1-a: skipped\n  2-2-b: ready-for-dev\n"
        "  epic-3: in-progress\n  3-1-c: done\n"
    )
    add = apply_story_transition(text, "2-1", "skipped", "backlog", NOW, SRC)
    assert add.epic_changes == {"epic-2": "in-progress", "epic-3": "done"}
    epics_back = {"epic-2": ("in-progress", "backlog"), "epic-3": ("done", "in-progress")}
    back = set_epics_back(add.text, apply_story_transition(add.text, "2-1", "backlog", "skipped", NOW, SRC), epics_back, SRC)
    assert (back.outcome, back.epic_changes) == ("written", {"epic-2": "backlog"})
    assert parse_status_text(back.text, SRC).values() == parse_status_text(add.text, SRC).values() | {
        "2-1-a": "skipped", "epic-2": "backlog",
    }
    # once more (a retry whose first attempt wrote): nothing more
    again = set_epics_back(back.text, apply_story_transition(back.text, "2-1", "backlog", "skipped", NOW, SRC), epics_back, SRC)
    assert (again.outcome, again.epic_changes, again.text) == ("already-applied", {}, back.text)
    # the epic edited since: it stays
    edited = add.text.replace("epic-2: in-progress", "epic-2: contexted")
    r = set_epics_back(edited, apply_story_transition(edited, "2-1", "backlog", "skipped", NOW, SRC), epics_back, SRC)
    assert (r.outcome, r.epic_changes, parse_status_text(r.text, SRC).values()["epic-2"]) == ("written", {}, "contexted")
    # rolled by the write itself (2-2-b done meanwhile: the story set back makes its epic done): the roll-up's
    finished = add.text.replace("2-2-b: ready-for-dev", "2-2-b: done")
    r = set_epics_back(finished, apply_story_transition(finished, "2-1", "backlog", "done", NOW, SRC), epics_back, SRC)
    assert (r.outcome, r.epic_changes) == ("written", {"epic-2": "done"})
    # the story edited since: not set back, and its epic stays as the story's value has it
    moved = add.text.replace("2-1-a: backlog", "2-1-a: ready-for-dev")
    r = set_epics_back(moved, apply_story_transition(moved, "2-1", "backlog", "skipped", NOW, SRC), epics_back, SRC)
    assert (r.outcome, r.epic_changes, r.text) == ("cas-mismatch", {}, moved)


def test_an_epic_a_story_of_which_started_since_is_not_put_back() -> None:
    """A refused course correction's write-back put its epic line back to `backlog` though a story of that epic
    had started meanwhile (the Slave took 2-1-a after the add write rolled epic-2: its write rolled nothing, the
    epic in-progress already): epic-2 said backlog with 2-1-a in progress. The epic stays where the story set back
    is not its only started one; a `done` epic reopened by the add write stays open where a story of it runs."""
    text = "development_status:\n  epic-2: backlog\n  2-1-a: backlog\n  2-2-b: skipped\n"
    add = apply_story_transition(text, "2-2", "skipped", "ready-for-dev", NOW, SRC)
    assert add.epic_changes == {"epic-2": "in-progress"}
    started = apply_story_transition(add.text, "2-1", "backlog", "in-progress", NOW, SRC)
    assert (started.outcome, started.epic_changes) == ("written", {})
    epics_back = {"epic-2": ("in-progress", "backlog")}
    back = set_epics_back(
        started.text, apply_story_transition(started.text, "2-2", "ready-for-dev", "skipped", NOW, SRC), epics_back, SRC
    )
    assert (back.outcome, back.epic_changes) == ("written", {})
    assert parse_status_text(back.text, SRC).values()["epic-2"] == "in-progress"
    # a done epic the add write reopened, a story of it rearmed since: it stays open
    text = "development_status:\n  epic-3: done\n  3-1-c: done\n  3-2-d: skipped\n"
    add = apply_story_transition(text, "3-2", "skipped", "ready-for-dev", NOW, SRC)
    assert add.epic_changes == {"epic-3": "in-progress"}
    rearmed = add.text.replace("3-1-c: done", "3-1-c: in-progress")
    back = set_epics_back(
        rearmed, apply_story_transition(rearmed, "3-2", "ready-for-dev", "skipped", NOW, SRC),
        {"epic-3": ("in-progress", "done")}, SRC,
    )
    assert (back.outcome, parse_status_text(back.text, SRC).values()["epic-3"]) == ("written", "in-progress")


@pytest.mark.parametrize(
    "epic_line", ["epic-1: &st backlog", "epic-1: >-\n    backlog"], ids=["anchored", "folded"]
)
def test_an_epic_whose_value_cannot_be_edited_in_place_never_fails_its_stories(epic_line: str) -> None:
    """An anchor on the epic's value failed every write of its stories (retried, then needs-intervention after
    each story's first agent): the epic's roll-up is left, the story's own line written."""
    text = f"development_status:\n  {epic_line}\n  1-1-a: backlog\n  1-2-b: backlog\n"
    r = apply_story_transition(text, "1-1", "backlog", "ready-for-dev", NOW, SRC)
    assert r.outcome == "written" and r.epic_changes == {}
    assert changed_lines(text, r.text) == ["-  1-1-a: backlog", "+  1-1-a: ready-for-dev"]


@pytest.mark.parametrize(
    ("status", "where", "why"),
    [
        ("  1-1-a: &st review\n  1-2-b: review\n", "line 3, column 10",
         "it carries an anchor (&st); write it plainly on one line: `1-1-a: review`"),
        ("  epic-1: &st backlog\n  1-1-a: *st\n", "line 4, column 3",
         "it is an alias of the value on line 3; write it plainly on one line: `1-1-a: backlog`"),
        ("  1-1-a: >-\n    review\n", "line 3, column 10",
         "it is a block scalar (>-); write it plainly on one line: `1-1-a: review`"),
        ("  1-1-a: |-\n    review\n", "line 3, column 10",
         "it is a block scalar (|-); write it plainly on one line: `1-1-a: review`"),
        ("  1-1-a: ready-for-dev\n    please\n", "line 3, column 10",
         "it goes on over the next line; write it plainly on one line"),
        ("  1-1-a: 'ready-for-dev\n    please'\n", "line 3, column 10",
         "it is not a one-line scalar; write it plainly on one line"),
        (" {epic-1: &st backlog, 1-1-a: *st}\n", "line 3, column 24",
         "it is an alias of the value on line 3; write it plainly on one line: `1-1-a: backlog`"),
    ],
    ids=["anchor", "alias", "folded", "literal", "continued", "quoted-over-two-lines", "alias-in-flow"],
)
def test_a_story_value_bso_cannot_write_in_place_is_refused_when_the_file_is_read(
    status: str, where: str, why: str
) -> None:
    """It parsed: the sprint started, the story's agent ran, then the write of its state (in place, on the
    story's line) failed and the story ended needs-intervention, its work lost. Refused when read, as a merge key
    is, naming the story's own line (an alias's position is its anchor's: another line)."""
    text = f"generated: 2026-01-05\ndevelopment_status:\n{status}"
    assert sprint_status._fast_parsed(text) is None  # not the plain layout: the line scan leaves it to the YAML path
    for attempt in (
        lambda: parse_status_text(text, SRC),
        lambda: apply_story_transition(text, "1-1", "review", "done", NOW, SRC),
    ):
        with pytest.raises(StatusFileError) as caught:
            attempt()
        assert f"{SRC}: {where}: cannot edit the value of '1-1-a' in place: {why}" in str(caught.value)


@pytest.mark.parametrize("no_day", ["2026-02-30", "2026-13-01", "0000-01-01", "2026-02-28T25:00:00Z"])
def test_a_date_that_is_no_day_is_read_as_its_text_by_both_paths(no_day: str) -> None:
    """`generated: 2026-02-30` (a typo): the line scan took the file, the YAML path failed with Python's bare
    "day is out of range for month" (no line, no field), so the first edit taking the YAML path (a story the
    improvement cycle inserts) failed in a sprint the file had started."""
    plain = f"generated: {no_day}\nlast_updated: {no_day}\ndevelopment_status:\n  epic-1: backlog\n  1-1-a: review\n"
    quoted = plain.replace("  1-1-a:", "  '1-1-a':")  # the same file, one key quoted: the YAML path
    assert sprint_status._fast_parsed(quoted) is None
    assert parse_status_text(quoted, SRC) == parse_status_text(plain, SRC)
    assert parse_status_text(quoted, SRC).last_updated == no_day
    inserted = insert_story_entry(plain, "1-1-a", "1-2-b", "backlog", SRC)
    assert changed_lines(plain, inserted) == ["+  1-2-b: backlog"]
    for text in (plain, quoted):
        r = apply_story_transition(text, "1-1-a", "review", "done", NOW, SRC)
        assert r.outcome == "written" and r.text.startswith(f"generated: {no_day}\n")
        assert f"\nlast_updated: {format_last_updated(no_day, NOW)}\n" in r.text


@pytest.mark.parametrize("quoted", [False, True], ids=["fast-path", "yaml-path"])
def test_an_epic_spelled_with_a_leading_zero_is_rolled_up_as_the_file_spells_it(quoted: bool) -> None:
    """`epic-01` names the epic of the stories `1-...`: it was never rolled up (looked up as `epic-1`)."""
    key = '"1-1-a"' if quoted else "1-1-a"  # a quoted key takes the YAML path
    text = f"development_status:\n  epic-01: backlog\n  {key}: backlog\n  1-2-b: done\n"
    started = apply_story_transition(text, "1-1", "backlog", "in-progress", NOW, SRC)
    assert started.epic_changes == {"epic-01": "in-progress"}
    done = apply_story_transition(started.text, "1-1", "in-progress", "done", NOW, SRC)
    assert done.epic_changes == {"epic-01": "done"}
    assert parse_status_text(done.text, SRC).values()["epic-01"] == "done"
    # the file's own `epic-1` wins over another spelling of it
    assert compute_epic_changes({"epic-01": "backlog", "epic-1": "backlog", "1-1-a": "done"}, "epic-1") == {
        "epic-1": "done"
    }


# --- story files ---------------------------------------------------------------------------------


def test_story_file_round_trip() -> None:
    text = render_story_file(
        "3-2-chunk-manager",
        "Chunk Manager",
        3,
        2,
        "ready-for-dev",
        ["Chunks are stored", "Chunks are evicted"],
        depends_on=["3-1", "2-2-chunk-manager"],
        tags=["frontend", "ui"],
        revision=2,
        files=["src/chunks.py", "tests/"],
    )
    assert text.startswith("# Story 3.2: Chunk Manager\n")
    for section in ("## Story", "## Acceptance Criteria", "## Tasks / Subtasks", "## Dev Notes",
                    "## Dev Agent Record", "### File List"):
        assert f"\n{section}\n" in text
    assert "1. Chunks are stored" in text and "2. Chunks are evicted" in text
    assert "- [ ] Task 1" in text and "(AC: 2)" in text
    assert "As a" in text and "I want" in text and "so that" in text
    info = parse_story_file(text)
    assert info.title == "Chunk Manager"
    assert info.status == "ready-for-dev"
    assert info.depends_on == ["3-1", "2-2-chunk-manager"]
    assert info.tags == ["frontend", "ui"]
    assert info.files == ["src/chunks.py", "tests/"]


def test_parse_story_file_lenient() -> None:
    assert parse_story_file("") == parse_story_file("no heading here")
    info = parse_story_file("# Story 1.2: Thing\n\nsome text\ndepends_on: [1-1, '1-3']\nTAGS: Web\n")
    assert info.title == "Thing"
    assert info.depends_on == ["1-1", "1-3"]
    assert info.tags == ["web"]
    assert parse_story_file("Depends on: none\n").depends_on == []
    assert parse_story_file("**Depends on:** 1-1\n").depends_on == ["1-1"]


# --- key resolution ------------------------------------------------------------------------------

KNOWN = ["1-1-foo", "1-2-bar", "2-6a-baz", "3-2-chunk-manager"]


def test_resolve_story_keys() -> None:
    assert resolve_story_keys(["3-2", "1-1-foo", "2-6a"], KNOWN) == ["3-2-chunk-manager", "1-1-foo", "2-6a-baz"]
    assert resolve_story_keys(["1-1", "1-1-foo"], KNOWN) == ["1-1-foo"]
    with pytest.raises(ValueError, match="9-9"):
        resolve_story_keys(["9-9"], KNOWN)
    with pytest.raises(ValueError, match="1-1-nope"):
        resolve_story_keys(["1-1-nope"], KNOWN)
    with pytest.raises(ValueError, match="ambiguous.*1-1"):
        resolve_story_keys(["1-1"], ["1-1-foo", "1-1-other"])


def test_stories_that_share_a_number_cannot_run_in_one_sprint() -> None:
    assert shared_numbers(KNOWN) is None
    assert shared_numbers(["2-2-expiry", "2-2a-digest", "12-2-other", "1-22-more"]) is None  # numbers, not prefixes
    why = shared_numbers(["1-2-login", "1-3-x", "1-2-logout", "2-1-a", "2-1-b", "1-2-logoff"])
    assert why is not None and why.startswith(
        "stories that share a number: 1-2-login and 1-2-logout and 1-2-logoff (1-2); 2-1-a and 2-1-b (2-1). "
    ), why
    assert "renumber one in the status file" in why


def test_resolve_epic() -> None:
    for spelling in (2, "2", "epic-2", "02", "epic-002"):
        assert resolve_epic(spelling, KNOWN) == "epic-2"
    with pytest.raises(UnknownEpicError, match="no story of epic-02"):
        resolve_epic("02", KNOWN, numbered=False)  # as workflows started before it replay it
    with pytest.raises(UnknownEpicError, match=r"unknown epic 7: .*no story of epic-7 .*epic-1, epic-2, epic-3"):
        resolve_epic(7, KNOWN)
    with pytest.raises(UnknownEpicError, match="epics with stories: none"):
        resolve_epic("1", [])
    with pytest.raises(UnknownEpicError, match=r"no story of 'epic-1\\n' \(its epics with stories: epic-1, "):
        resolve_epic("epic-1\n", KNOWN)  # it said it had no story of epic-1, listing epic-1


# --- paths ---------------------------------------------------------------------------------------


def test_project_root_must_be_absolute() -> None:
    assert project_root_error("/home/me/shelfwise") is None
    assert "is relative" in project_root_error("examples/demo-project")
    assert "is relative" in project_root_error("./shelfwise")
    assert "is relative" in project_root_error("~/shelfwise")  # no shell here to expand it
    assert "NUL" in project_root_error("/p\x00/x")


def test_resolve_inside() -> None:
    assert resolve_inside("/p", "a/b.yaml") == "/p/a/b.yaml"
    assert resolve_inside("/p/", "./a/../b") == "/p/b"
    for bad in ["../x", "a/../../x", "/etc/passwd", "..", ""]:
        with pytest.raises(ValueError):
            resolve_inside("/p", bad)
    assert is_inside("/p", "/p/x") and is_inside("/p", "/p") and not is_inside("/p", "/px")


def test_resolve_story_location() -> None:
    dflt = "_bmad-output/implementation-artifacts"
    assert resolve_story_location("/p", "", dflt) == dflt
    assert resolve_story_location("/p", "{project-root}/docs/stories", dflt) == "docs/stories"
    assert resolve_story_location("/p", "{project_root}/docs", dflt) == "docs"
    assert resolve_story_location("/p", "/p/docs", dflt) == "docs"
    assert resolve_story_location("/p", "docs/stories", dflt) == "docs/stories"
    assert resolve_story_location("/p", ".", dflt) == "."
    for bad in ["/etc", "../x", "{project-root}/../x"]:
        with pytest.raises(ValueError):
            resolve_story_location("/p", bad, dflt)


# --- properties ----------------------------------------------------------------------------------

yamlish = st.text(
    alphabet=st.sampled_from(list("abc-_:#'\"{}[],&*!|>%@`?\n\t 0123456789\\\r.") + ["\ufeff", "é", "\x00", "\x85"]),
    max_size=200,
)


@settings(max_examples=400)
@given(st.one_of(st.text(max_size=200), yamlish, yamlish.map(lambda t: "development_status:\n  " + t)))
def test_parse_never_raises_anything_else(text: str) -> None:
    try:
        parse_status_text(text, SRC)
    except StatusFileError as exc:
        assert str(exc).startswith(SRC + ":")


STATES = ["backlog", "story-doc-review", "ready-for-dev", "review", "done", "in-progress", "drafted",
          "needs-intervention", "weird-value"]
slug = st.from_regex(r"[a-z][a-z0-9]{0,6}(-[a-z0-9]{1,5}){0,2}", fullmatch=True)


@st.composite
def status_files(draw):
    n = draw(st.integers(min_value=1, max_value=8))
    keys: list[str] = []
    for _ in range(n):
        e = draw(st.integers(1, 4))
        s = draw(st.integers(1, 9))
        letter = draw(st.sampled_from(["", "", "a"]))
        k = f"{e}-{s}{letter}-{draw(slug)}"
        if k not in keys:
            keys.append(k)
    lines = ["# generated by hypothesis", "last_updated: 2025-01-01", "development_status:"]
    values: dict[str, str] = {}
    epics = sorted({epic_key_of(k) for k in keys})
    for ep in epics:
        lines.append(f"  {ep}: backlog")
        values[ep] = "backlog"
    for k in keys:
        v = draw(st.sampled_from(STATES))
        style = draw(st.sampled_from(["plain", "single", "double"]))
        tok = {"plain": v, "single": f"'{v}'", "double": f'"{v}"'}[style]
        comment = draw(st.sampled_from(["", "  # note", " # x: y"]))
        lines.append(f"  {k}: {tok}{comment}")
        values[k] = v
        if draw(st.booleans()):
            lines.append("")
    return "\n".join(lines) + "\n", keys, values


@settings(max_examples=200)
@given(status_files(), st.data())
def test_set_value_then_parse(generated, data) -> None:
    text, keys, values = generated
    key = data.draw(st.sampled_from(keys))
    new = data.draw(st.sampled_from(STATES + ["true", "a b", "x'y"]))
    new_text = set_value(text, key, new, SRC)
    after = parse_status_text(new_text, SRC).values()
    expected = dict(values)
    expected[key] = new
    assert after == expected
    assert len(changed_lines(text, new_text)) in (0, 2)


def test_a_sprint_takes_on_the_selected_stories_that_are_not_settled():
    stories = [("1-1-a", "done"), ("1-2-b", "needs-intervention"), ("1-3-c", "review"), ("2-1-d", "skipped"),
               ("2-2-e", "backlog"), ("2-3-f", "in-progress")]  # fmt: skip
    assert stories_to_run(stories, None, []) == ["1-3-c", "2-2-e", "2-3-f"]
    assert stories_to_run(stories, 2, []) == ["2-2-e", "2-3-f"]
    assert stories_to_run(stories, "epic-1", ["1-2", "1-3-c"]) == ["1-3-c"]
    assert stories_to_run(stories, None, ["1-2"]) == []
    with pytest.raises(UnknownEpicError):
        stories_to_run(stories, 3, [])
    with pytest.raises(StoryKeyError):
        stories_to_run(stories, None, ["9-9"])
    # A named story outside the epic was dropped in silence ("nothing to run" when it was the only one).
    with pytest.raises(StoryKeyError, match=r"^2-2-e not in epic-1: with an epic, the stories named are picked"):
        stories_to_run(stories, 1, ["1-3", "2-2"])


def test_depends_on_takes_bmad_dotted_story_numbers() -> None:
    """BMAD numbers stories `1.2` (`# Story 1.2: ...`): `Depends on: 1.2` and `Depends on: Story 1.2` were
    ignored (no such key), and the dependant ran beside its dependency. They are the story numbered 1-2."""
    assert parse_story_file("Depends on: 1.1\n").depends_on == ["1-1"]
    assert parse_story_file("Depends on: Story 1.2\n").depends_on == ["1-2"]
    assert parse_story_file("Depends on: Story 1.1, story 1.2, 2.6a\n").depends_on == ["1-1", "1-2", "2-6a"]
    assert parse_story_file("**Depends on:** Story 1-1\n").depends_on == ["1-1"]
    assert parse_story_file("Depends on:\n- Story 1.1\n- 1.2\n").depends_on == ["1-1", "1-2"]
    assert parse_story_file("Depends on: 1-1-login, 1.1, 1-1\n").depends_on == ["1-1-login", "1-1"]
    keys = ["1-1-login", "1-2-logout", "1-3-profile"]
    found, problems = story_dependencies("1-3-profile", ["1-1", "1-2-logout", "1-3", "9-9", "1-1"], keys)
    assert found == ["1-1-login", "1-2-logout"]  # itself and repeats left out
    assert problems == ["1-3-profile.md: Depends on '9-9' ignored: unknown story key '9-9'"]


def test_story_file_fields_stay_on_their_line_or_their_list() -> None:
    """An empty field no longer reads the next lines (`Files:` then `## Acceptance Criteria` gave the files
    `##`, `Acceptance`, `Criteria`); a bullet list right below a field is its items; commas keep a path with a
    space whole; `and` joins dependencies."""
    empty = parse_story_file("# Story 1.1: X\n\nDepends on:\nFiles:\n\n## Acceptance Criteria\n\nStatus:\n\nTags: ui\n")
    assert (empty.depends_on, empty.files, empty.status, empty.tags) == ([], [], "", ["ui"])
    listed = parse_story_file("Files:\n- src/a.py\n- `src/b.py`\n\nDepends on:\n\n  * 1-1\n  * 1-2\nText after.\n")
    assert listed.files == ["src/a.py", "src/b.py"] and listed.depends_on == ["1-1", "1-2"]
    assert parse_story_file("Files: src/my file.py, src/b.py\n").files == ["src/my file.py", "src/b.py"]
    assert parse_story_file("Files: src/a.py src/b.py\n").files == ["src/a.py", "src/b.py"]
    assert parse_story_file("Depends on: 1-1 and 1-2\n").depends_on == ["1-1", "1-2"]
    assert parse_story_file("- **Files:** src/a.py\n").files == ["src/a.py"]


def test_a_sprint_carries_a_few_thousand_stories_of_the_usual_size():
    from bso.models import StoryMeta

    def stories(n: int) -> list[StoryMeta]:
        return [
            StoryMeta(key=f"1-{i}-pantry-item-model-and-storage", epic="epic-1", short_key=f"1-{i}", state="review",
                      title="Pantry Item Model And Storage", depends_on=["1-1-project-scaffold-and-health-check"],
                      story_path=f"_bmad-output/implementation-artifacts/1-{i}-pantry-item-model-and-storage.md")
            for i in range(1, n + 1)
        ]  # fmt: skip

    assert too_large_to_carry(stories(2_000)) is None  # the long-sprint test's 1,000 and the benchmark's too
    why = too_large_to_carry(stories(4_000))
    assert why is not None and why.startswith("4000 stories make ~2.") and "run the stories in several sprints" in why


def test_a_story_files_title_is_cut_and_a_long_list_read_in_linear_time():
    text = "# Story 1.1: " + "T" * 100_000 + "\n\nTags: " + ", ".join(f"t{i % 50_000}" for i in range(100_000)) + "\n"
    info = parse_story_file(text)
    assert info.title == "T" * 200
    assert info.tags == [f"t{i}" for i in range(50_000)]  # each once, in order
