"""Dependency rules across batches, the critical path, P29 (stories touching the same files), `Files:`."""

from __future__ import annotations

from bso.dependencies import UNFINISHED, check_dependencies, critical_path, skipped_for_dependency
from bso.dispatch import Outcome
from bso.models import StoryMeta, StoryProgress
from bso.planning import plan_batches, shares_files
from bso.sprint_status import parse_story_file


def meta(key: str, depends_on: list[str] | None = None, files: list[str] | None = None) -> StoryMeta:
    return StoryMeta(
        key=key, epic="epic-1", short_key=key[:3], state="backlog", story_path=f"s/{key}.md",
        depends_on=depends_on or [], files=files or [],
    )


def test_dependencies_done_or_unplanned_are_ready():
    assert check_dependencies(["a", "b"], {"a": "done"}).ready  # b is not planned: it does not count
    assert check_dependencies([], {}).ready


def test_dependency_on_its_way_waits():
    check = check_dependencies(["a", "b"], {"a": "done", "b": "review"})
    assert not check.ready and check.blocked_by is None and check.waiting_for == ("b",)


def test_dependency_that_will_never_be_done_blocks():
    for state in ("needs-intervention", "skipped", f"{UNFINISHED}:review"):
        check = check_dependencies(["a", "b"], {"a": "review", "b": state})
        assert check.blocked_by == ("b", state)


def test_skipped_for_dependency_names_it():
    t = skipped_for_dependency(StoryProgress(key="x", state="backlog"), "1-1-a", "needs-intervention")
    assert t.outcome is Outcome.SKIPPED and t.progress.state == "skipped"
    assert "dependency 1-1-a ended needs-intervention" in t.progress.error


def test_critical_path_is_the_heaviest_chain():
    stories = [meta("a"), meta("b"), meta("c", ["a"]), meta("d", ["c", "b"])]
    length, path = critical_path(stories, {"a": 2, "b": 5, "c": 2, "d": 1})
    assert (length, path) == (6, ["b", "d"])
    length, path = critical_path(stories, {"a": 3, "b": 1, "c": 3, "d": 1})
    assert (length, path) == (7, ["a", "c", "d"])


def test_files_line_is_parsed():
    info = parse_story_file("# Story 1.1: X\n\nStatus: backlog\n\nFiles: src/a.py, src/b.py\n")
    assert info.files == ["src/a.py", "src/b.py"]
    assert parse_story_file("# Story 1.1: X\n").files == []


def test_stories_touching_the_same_files_are_not_batched_together():
    a, b, c = meta("a", files=["x.py"]), meta("b", files=["y.py", "x.py"]), meta("c", files=["z.py"])
    assert shares_files(b, [a]) and not shares_files(c, [a, b]) and not shares_files(meta("d"), [a])
    plan = plan_batches("s", [a, b, c], batch_size=3)
    assert [spec.stories for spec in plan.batches] == [["a"], ["b", "c"]]
