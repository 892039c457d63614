"""bso.story_tally: the Master's running counts of its story views, and the one door views change through."""

from __future__ import annotations

import ast
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from bso.models import StoryView
from bso.story_tally import StoryTally

WORKFLOWS = Path(__file__).resolve().parents[2] / "workflows"

views = st.builds(
    StoryView,
    state=st.sampled_from(["backlog", "review", "done", "skipped", "needs-intervention"]),
    awaiting_decision=st.none() | st.sampled_from(["force_pass, skip_story or retry", "rearm"]),
)
# (story, its new view; None: the story leaves the sprint)
changes = st.lists(st.tuples(st.sampled_from(["1-1", "1-2", "1-3", "2-1"]), st.none() | views), max_size=40)


@given(st.dictionaries(st.sampled_from(["1-1", "1-2", "3-1"]), views), changes)
def test_a_tally_kept_change_by_change_equals_a_fresh_count(start: dict[str, StoryView], steps):
    current = dict(start)
    tally = StoryTally.of(current)
    for key, view in steps:
        tally.change(key, current.get(key), view)
        if view is None:
            current.pop(key, None)
        else:
            current[key] = view
    fresh = StoryTally.of(current)
    assert tally.done == fresh.done == sum(v.state == "done" for v in current.values())
    assert tally.awaiting == fresh.awaiting == {k: v.awaiting_decision for k, v in current.items() if v.awaiting_decision}


def _view_writes_outside_the_door(tree: ast.AST) -> list[int]:
    """Lines that change a `views` mapping (item assignment or deletion, or a mutating method) outside the
    Master's _put_view and _drop_view."""
    found: list[int] = []

    def is_views(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "views"

    def visit(node: ast.AST, function: str | None) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        door = function in ("_put_view", "_drop_view")
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign | ast.Delete):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.Subscript) and is_views(part.value) and not door:
                    found.append(node.lineno)
                if is_views(part) and isinstance(node, ast.Assign) and part in node.targets and not door:
                    found.append(node.lineno)  # a whole new mapping
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and is_views(node.func.value)
            and node.func.attr in ("pop", "popitem", "update", "setdefault", "clear", "__setitem__", "__delitem__")
            and not door
        ):
            found.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, None)
    return found


def test_the_workflows_change_story_views_only_through_put_view():
    """A view changed any other way would leave the details' counts wrong (they are no longer recounted)."""
    offenders = {
        path.name: lines
        for path in sorted(WORKFLOWS.glob("*.py"))
        if (lines := _view_writes_outside_the_door(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert offenders == {}


def test_the_door_check_sees_each_kind_of_write():
    source = """
def f(s, key, view):
    s.views[key] = view
    del s.stories[key], s.views[key]
    s.stories[key], s.views[key] = before
    s.views.pop(key)
    s.views = {}

def _put_view(self, key, view):
    self._state.views[key] = view
"""
    assert _view_writes_outside_the_door(ast.parse(source)) == [3, 4, 5, 6, 7]
