"""U4's fast path (bso.sprint_status._fast_transition) and the fast parse (_fast_parsed): for a status
file in BMAD's plain layout they must give exactly what the round-trip YAML path gives (outcome, values,
epic changes, bytes; the parsed entries and fields); anything else must be left to the YAML path."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.infra import make_project, many_stories
from bso.sprint_status import (
    StatusFileError,
    StoryKeyError,
    _fast_parsed,
    _fast_scan,
    _fast_transition,
    _parse_doc,
    _scan_lines,
    _scans,
    _yaml_transition,
    apply_story_transition,
    parse_status_text,
    story_value,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples/demo-project/_bmad-output/implementation-artifacts/sprint-status.yaml"
NOW = datetime(2026, 11, 22, 8, 30, 5, tzinfo=UTC)
STATES = ["backlog", "ready-for-dev", "story-doc-review", "in-progress", "review", "done", "skipped", "needs-intervention"]


def both(text: str, key: str, expected: str, new: str):
    fast = _fast_transition(text, key, expected, new, NOW, "s.yaml")
    slow = _yaml_transition(text, key, expected, new, NOW, "s.yaml")
    return fast, slow


def test_the_example_file_takes_the_fast_path_with_the_same_bytes():
    text = EXAMPLE.read_text(encoding="utf-8")
    assert _fast_scan(text) is not None
    for entry in parse_status_text(text, "s.yaml").stories():
        for new in ("in-progress", "done", "skipped", entry.value):
            fast, slow = both(text, entry.key, entry.value, new)
            assert fast is not None and fast == slow
        mismatch, slow = both(text, entry.key, "not-this", "done")
        assert mismatch == slow


def test_the_example_and_bench_files_are_parsed_fast_with_the_same_result(tmp_path: Path):
    for text in (EXAMPLE.read_text(encoding="utf-8"), make_project(tmp_path, many_stories(120)).read_text()):
        fast = _fast_parsed(text)
        assert fast is not None and fast == _parse_doc(text, "s.yaml")[1]


def test_a_written_file_stays_on_the_fast_path(tmp_path: Path):
    status = make_project(tmp_path, many_stories(120, "review"))
    text = status.read_text(encoding="utf-8")
    for key in list(many_stories(120))[:60]:
        fast, slow = both(text, key, "review", "done")
        assert fast == slow and fast.outcome == "written"
        text = fast.text
        assert _fast_scan(text) is not None and story_value(text, key, "s.yaml") == "done"
    assert parse_status_text(text, "s.yaml").values()["epic-1"] == "done"  # all 50 stories of epic 1 done


def test_short_keys_and_unknown_keys_behave_the_same():
    text = EXAMPLE.read_text(encoding="utf-8")
    story = parse_status_text(text, "s.yaml").stories()[0]
    short = "-".join(story.key.split("-")[:2])
    fast, slow = both(text, short, story.value, "done")
    assert fast == slow and fast.story_key == story.key
    with pytest.raises(StoryKeyError) as fast_err:
        _fast_transition(text, "9-9", "review", "done", NOW, "s.yaml")
    with pytest.raises(StoryKeyError) as slow_err:
        _yaml_transition(text, "9-9", "review", "done", NOW, "s.yaml")
    assert str(fast_err.value) == str(slow_err.value)


BASE = "last_updated: 2026-01-05\nproject: P\ndevelopment_status:\n  epic-1: backlog\n  1-1-a: review\n"


@pytest.mark.parametrize(
    "text",
    [
        BASE.replace("  1-1-a: review", "  1-1-a: 'review'"),  # quoted value
        BASE.replace("  1-1-a: review", "    1-1-a: review"),  # another indentation
        BASE.replace("\n", "\r\n"),  # CRLF
        BASE.replace("  1-1-a: review", "  1-1-a:\treview"),  # tab
        BASE + "  1-1-a: done\n",  # duplicate key
        BASE.replace("project: P", "project: &a P"),  # anchor
        BASE.replace("development_status:\n  epic-1: backlog\n  1-1-a: review\n", "development_status: {epic-1: backlog, 1-1-a: review}\n"),
        "---\n" + BASE,  # document marker
        BASE.replace("project: P", "project: [a, b]"),  # not a scalar
        BASE + "  1-2-b: true\n",  # not a string
        BASE + "  2026-1-5: review\n",  # read as a date
        BASE.replace("project: P", "project: a: b"),
        "\ufeff" + BASE,
    ],
)
def test_anything_else_takes_the_yaml_path(text: str):
    assert _fast_scan(text) is None and _fast_parsed(text) is None
    try:
        slow = _yaml_transition(text, "1-1-a", "review", "done", NOW, "s.yaml")
    except (StatusFileError, StoryKeyError) as err:
        with pytest.raises(type(err)) as again:
            apply_story_transition(text, "1-1-a", "review", "done", NOW, "s.yaml")
        assert str(again.value) == str(err)
    else:
        assert apply_story_transition(text, "1-1-a", "review", "done", NOW, "s.yaml") == slow


def test_odd_new_values_take_the_yaml_path():
    assert _fast_transition(BASE, "1-1-a", "review", "In Progress", NOW, "s.yaml") is None
    assert _fast_transition(BASE, "1-1-a", "review", "true", NOW, "s.yaml") is None
    assert apply_story_transition(BASE, "1-1-a", "review", "true", NOW, "s.yaml").text != BASE


top_value = st.one_of(
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9 _.-]{0,12}[A-Za-z0-9]", fullmatch=True),
    st.sampled_from(["2026-01-05", "2026-01-05T10:00:00Z", '"{project-root}/x"', "'quoted'", ""]),
)
comment = st.sampled_from(["", "  # note", " # x: y"])


@st.composite
def plain_files(draw):
    lines = [draw(st.sampled_from(["# generated: today", "", "#"]))]
    lines.append(f"last_updated: {draw(top_value)}".rstrip() + draw(comment))
    lines.append(f"project: {draw(top_value)}".rstrip())
    lines.append("development_status:" + draw(comment))
    indent = " " * draw(st.integers(1, 4))
    keys = []
    for epic in range(1, draw(st.integers(1, 3)) + 1):
        lines.append(f"{indent}epic-{epic}: {draw(st.sampled_from(['backlog', 'in-progress', 'done']))}")
        for story in range(1, draw(st.integers(1, 4)) + 1):
            key = f"{epic}-{story}-s{story}"
            keys.append(key)
            lines.append(f"{indent}{key}: {draw(st.sampled_from(STATES))}" + draw(comment))
            if draw(st.booleans()):
                lines.append(draw(st.sampled_from(["", "  # between", "# at column 0"])))
        lines.append(f"{indent}epic-{epic}-retrospective: optional")
    if draw(st.booleans()):
        lines.append("tracking_system: file-system")
    return "\n".join(lines) + draw(st.sampled_from(["\n", ""])), keys


@settings(max_examples=150)
@given(plain_files(), st.data())
def test_fast_and_yaml_paths_agree_on_plain_files(generated, data):
    text, keys = generated
    assert _fast_scan(text) is not None, text
    key = data.draw(st.sampled_from(keys))
    current = parse_status_text(text, "s.yaml").values()[key]
    expected = data.draw(st.sampled_from([current, "review"]))
    new = data.draw(st.sampled_from(STATES))
    fast, slow = both(text, key, expected, new)
    assert fast == slow


@settings(max_examples=150)
@given(plain_files())
def test_fast_and_yaml_parses_agree_on_plain_files(generated):
    text, _ = generated
    fast = _fast_parsed(text)
    if fast is not None:  # None: a top-level value the line scan is unsure of (a timestamp)
        assert fast == _parse_doc(text, "s.yaml")[1]
    assert parse_status_text(text, "s.yaml") == _parse_doc(text, "s.yaml")[1]


@pytest.mark.parametrize("value", ["'it''s'", '"plain"', "2026-01-05", "Bench Project", "", "x:y"])
def test_top_level_values_read_the_same(value: str):
    text = BASE.replace("project: P", f"project: {value}".rstrip())
    fast = _fast_parsed(text)
    assert fast is not None and fast == _parse_doc(text, "s.yaml")[1]


@pytest.mark.parametrize("value", ["true", "12", "1.5", "2026-01-05T10:00:00Z", '"a\\tb"', "~", "on"])
def test_top_level_values_yaml_would_convert_take_the_yaml_path(value: str):
    text = BASE.replace("project: P", f"project: {value}")
    assert _fast_parsed(text) is None
    assert parse_status_text(text, "s.yaml") == _parse_doc(text, "s.yaml")[1]


@settings(max_examples=150)
@given(plain_files(), st.data())
def test_a_write_leaves_the_scan_a_fresh_scan_of_its_text_would_give(generated, data):
    """The write derives the new text's scan from the old one's (no rescan of a thousand lines); the
    read-back and the next write use it, so it must be exactly what scanning the new text gives."""
    text, keys = generated
    key = data.draw(st.sampled_from(keys))
    current = parse_status_text(text, "s.yaml").values()[key]
    new = data.draw(st.sampled_from([s for s in STATES if s != current]))
    result = _fast_transition(text, key, current, new, NOW, "s.yaml")
    assert result is not None and result.outcome == "written"
    found, derived = _scans.get(result.text)
    assert found and derived == _scan_lines(result.text)
    assert story_value(result.text, key, "s.yaml") == new


def test_a_file_changed_by_someone_else_is_scanned_afresh(tmp_path: Path):
    status = make_project(tmp_path, many_stories(30, "review"))
    text = status.read_text(encoding="utf-8")
    written = apply_story_transition(text, "1-1-story-1", "review", "done", NOW, "s.yaml").text
    edited = written.replace("1-2-story-2: review", "1-2-story-2: in-progress")
    assert story_value(edited, "1-2-story-2", "s.yaml") == "in-progress"
    assert story_value(written, "1-2-story-2", "s.yaml") == "review"


@pytest.mark.parametrize("null", ["null", "Null", "NULL", "~"])
def test_a_null_last_updated_is_left_alone_on_both_paths(null: str):
    """The fast path wrote a date over `Null` and `NULL`, which the YAML path reads as none and leaves."""
    text = f"last_updated: {null}\ndevelopment_status:\n  epic-1: backlog\n  1-1-a: review\n"
    fast, slow = both(text, "1-1-a", "review", "done")
    assert fast is None or fast == slow  # `~` takes the YAML path
    assert slow.text == f"last_updated: {null}\ndevelopment_status:\n  epic-1: done\n  1-1-a: done\n"



@pytest.mark.parametrize("word", ["._", "+_", "-_", "+._", "0x_", "0o_", "0b_"])
def test_a_plain_word_ruamel_takes_for_a_number_is_read_as_a_word_on_both_paths(word: str):
    """ruamel 0.19 resolves these as numbers and fails converting them: the YAML path refused a valid file (a
    ValueError, no line) that the fast path read and wrote. YAML 1.2 reads them as strings."""
    text = f"project: {word}\nlast_updated: 2026-11-20\ndevelopment_status:\n  epic-1: backlog\n  1-1-a: review\n"
    assert parse_status_text(text, "s.yaml").project == word
    fast, slow = both(text, "1-1-a", "review", "done")
    assert fast is None or fast == slow
    assert slow.text == text.replace("2026-11-20", "2026-11-22").replace(": backlog", ": done").replace(": review", ": done")
