"""Dependency rules across batches, the critical path, P29 (stories touching the same files), `Files:`."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bso.dependencies import (
    dependencies_waited_for,
    checked_dependency_update,
    MERGING,
    UNFINISHED,
    check_dependencies,
    critical_path,
    skipped_for_dependency,
    state_for_dependants,
)
from bso.dispatch import Outcome
from bso.models import StoryMeta, StoryProgress, StoryView
from bso.messages import BatchSpec
from bso.planning import batch_numbering_problem, plan_batches, shares_files, startable_batch, still_on_its_files, history_hold
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


def batches_of(stories: list[StoryMeta], batch_size: int, concurrent: int) -> list[list[str]]:
    return [spec.stories for spec in plan_batches("s", stories, batch_size, concurrent).batches]


# A chain a <- b <- c <- d in file order, then four stories that depend on nothing.
CHAIN_FIRST = [meta("a"), meta("b", ["a"]), meta("c", ["b"]), meta("d", ["c"]), *(meta(k) for k in "efgh")]


def test_one_batch_at_a_time_keeps_the_file_order():
    assert batches_of(CHAIN_FIRST, 2, 1) == [["a"], ["b"], ["c"], ["d", "e"], ["f", "g"], ["h"]]


def test_batches_running_at_once_follow_the_dependency_levels():
    """With 2 Slaves the file order left e-h behind the chain (d, then e in one batch: e waited for c); by
    levels every story that can start at once comes first, and each batch's waiting stories come last."""
    plan = batches_of(CHAIN_FIRST, 2, 2)
    assert plan == [["a", "e"], ["f", "g"], ["h", "b"], ["c"], ["d"]]
    position = {key: (i, spec.index(key)) for i, spec in enumerate(plan) for key in spec}
    for story in CHAIN_FIRST:  # still: a dependency in an earlier batch
        assert all(position[d][0] < position[story.key][0] for d in story.depends_on)


def test_levels_keep_the_file_order_within_a_level_and_p29():
    stories = [meta("x", files=["f.py"]), meta("y", ["x"]), meta("z", files=["f.py"]), meta("w")]
    assert batches_of(stories, 3, 3) == [["x"], ["z", "w", "y"]]


def test_a_batch_waits_while_a_running_story_works_on_its_file():
    running = {1: [meta("a", files=["auth.py"])]}
    held, free = [meta("b", files=["auth.py", "x.py"])], [meta("c", files=["y.py"])]
    assert startable_batch([held, free], running) == (1, [(0, "b touches auth.py, as a of running batch 1 does")])
    assert startable_batch([held, free], {1: []}) == (0, [])  # a is finished: nothing to wait for
    assert startable_batch([free, held], running) == (0, [])


def test_a_batch_goes_ahead_of_a_waiting_one_only_without_depending_on_it():
    """c depends on b of the waiting batch: started first, it would hold a Slave waiting for a batch that has
    not started (and, touching b's file, could keep b waiting for ever)."""
    running = {1: [meta("a", files=["auth.py"])]}
    held = [meta("b", files=["auth.py"])]
    dependant, other = [meta("c", ["b"])], [meta("d", ["a"], files=["z.py"])]
    because = "b touches auth.py, as a of running batch 1 does"
    assert startable_batch([held, dependant, other], running) == (
        2, [(0, because), (1, "c depends on b, of a batch that waits")]
    )
    assert startable_batch([held, dependant], running)[0] is None


def test_nothing_is_held_while_a_running_batch_waits_for_a_queued_story():
    """A budget pause queued c again, b (running) waits for it, and t, with c, touches s's file: holding that
    batch for s, which sits behind b, would wait for ever."""
    running = {2: [meta("b", ["c"]), meta("s", files=["f.py"])]}
    assert startable_batch([[meta("c"), meta("t", files=["f.py"])]], running) == (0, [])
    assert startable_batch([], running) == (None, [])


def test_a_story_being_merged_still_holds_its_files_and_its_dependants():
    """command backend: done in the file, its branch not merged back yet. A batch touching its files, or a
    dependant, that started then made its worktree without that work, and its own merge conflicted."""
    merging = StoryView(state="done", batch_id=1, merging=True)
    merged = StoryView(state="done", batch_id=1)
    assert still_on_its_files(merging, 1) and not still_on_its_files(merged, 1)
    assert merging.in_flight == "merging"  # what bso sprint status shows meanwhile
    assert still_on_its_files(StoryView(state="dev", batch_id=1), 1) and still_on_its_files(None, 1)
    # Rearmed into batch 3 while batch 1 still runs: batch 3's story now (batch 3 was held by the story itself).
    assert not still_on_its_files(StoryView(state="ready-for-dev", batch_id=3), 1)

    assert state_for_dependants(merging, pending=True) == MERGING
    assert check_dependencies(["a"], {"a": MERGING}).waiting_for == ("a",)
    assert state_for_dependants(merged, pending=True) == "done"
    # Its batch ended during the merge (timed out, terminated): a batch starting later takes it as done (the
    # Master tells the running ones so: tests/workflow/test_command_local.py).
    assert state_for_dependants(merging, pending=False) == "done"
    assert state_for_dependants(StoryView(state="dev", batch_id=1), pending=False) == f"{UNFINISHED}:dev"


_keys = st.sampled_from(["a", "b", "c", "d", "e"])
_stories = st.builds(
    meta,
    key=_keys,
    depends_on=st.lists(_keys, max_size=2),
    files=st.lists(st.sampled_from(["f.py", "g.py"]), max_size=2),
)


@given(
    st.lists(st.lists(_stories, min_size=1, max_size=3), min_size=1, max_size=4),
    st.dictionaries(st.integers(1, 3), st.lists(_stories.map(lambda m: m.model_copy(update={"files": []})), max_size=3)),
)
def test_nothing_waits_while_no_running_story_touches_a_file(queued, running):
    """What the Master's _next_batch answers without calling startable_batch (it runs on every story update)."""
    assert startable_batch(queued, running) == (0, [])


def test_a_dependency_update_names_only_the_batchs_dependencies():
    """The Master tells a batch only of its stories' dependencies: anything else is a hand-sent update, ignored
    and said so with what the batch does depend on; the states it gives for their dependencies are taken."""
    batch = [meta("2-1-signup", ["1-1-login"]), meta("2-2-profile", ["1-2-logout", "2-1-signup"])]
    update = {"1-1-login": "done", "1-2-logout": "unfinished:review"}
    assert checked_dependency_update(update, batch) == (update, None)
    assert checked_dependency_update({"2-1-signup": "done"}, batch) == ({"2-1-signup": "done"}, None)  # rearmed elsewhere
    assert checked_dependency_update({"9-9-x": "done", "1-1-login": "done"}, batch) == (
        {"1-1-login": "done"},
        "ignored for stories no story of this batch depends on: 9-9-x (it depends on: 1-1-login, 1-2-logout, 2-1-signup)",
    )
    many = {f"9-{n}-x": "done" for n in range(7)}
    assert checked_dependency_update(many, [meta("3-1-alone")]) == (
        {},
        "ignored for stories no story of this batch depends on: 9-0-x, 9-1-x, 9-2-x, 9-3-x, 9-4-x and 2 more "
        "(it depends on: none)",
    )


def test_the_hand_over_hold_names_the_batches_it_waits_for_and_those_waiting_for_a_decision():
    assert history_hold([3], []) == (
        "no new batch starts until batch 3 ends: the sprint's history is long, and it continues as new once nothing runs"
    )
    assert history_hold([3, 5], [5]).startswith("no new batch starts until batches 3, 5 end: ")
    assert history_hold([3, 5], [5]).endswith("(batch 5 waits for your decision: `bso sprint decide`)")


def test_status_names_the_dependencies_a_running_batchs_idle_story_waits_for():
    stories = {
        "1-1-a": StoryMeta(key="1-1-a", epic="epic-1", short_key="1-1", state="review", story_path="s/a.md"),
        "1-2-b": StoryMeta(key="1-2-b", epic="epic-1", short_key="1-2", state="ready-for-dev", story_path="s/b.md",
                           depends_on=["1-1-a", "1-9-outside"]),
        "1-3-c": StoryMeta(key="1-3-c", epic="epic-1", short_key="1-3", state="review", story_path="s/c.md",
                           depends_on=["1-1-a"]),
        "1-4-d": StoryMeta(key="1-4-d", epic="epic-1", short_key="1-4", state="review", story_path="s/d.md",
                           depends_on=["1-5-e"]),
        "1-5-e": StoryMeta(key="1-5-e", epic="epic-1", short_key="1-5", state="review", story_path="s/e.md"),
    }
    views = {
        "1-1-a": StoryView(state="review", batch_id=1, agent_in_flight="review-runner"),
        "1-2-b": StoryView(state="ready-for-dev", batch_id=2),  # waits for 1-1-a (1-9-outside is not planned)
        "1-3-c": StoryView(state="review", batch_id=2, agent_in_flight="review-runner"),  # at work: not waiting
        "1-4-d": StoryView(state="review", batch_id=2),  # its dependency failed: it will be skipped, not wait
        "1-5-e": StoryView(state="needs-intervention", batch_id=1),
    }
    running = [(k, views[k]) for k in ("1-1-a", "1-2-b", "1-3-c", "1-4-d")]
    assert dependencies_waited_for(running, views, stories) == {"1-2-b": ["1-1-a"]}


def test_a_plans_batches_are_numbered_from_the_masters_next_id_one_after_another_each_with_a_story():
    def specs(*ids: int, empty: int | None = None) -> list[BatchSpec]:
        return [BatchSpec(batch_id=i, stories=[] if i == empty else [f"1-{i}-x"]) for i in ids]

    assert batch_numbering_problem(specs(1, 2, 3), 1) is None
    assert batch_numbering_problem(specs(4, 5), 4) is None  # a course correction's, after three batches
    assert batch_numbering_problem([], 4) is None  # nothing left to plan
    assert batch_numbering_problem(specs(1, 1), 1) == "its batches are numbered [1, 1], not [1, 2]"
    assert batch_numbering_problem(specs(1, 2), 4) == "its batches are numbered [1, 2], not [4, 5]"
    assert batch_numbering_problem(specs(2, 1), 1) == "its batches are numbered [2, 1], not [1, 2]"
    assert batch_numbering_problem(specs(1, 2, empty=2), 1) == "its batch 2 holds no story"
    assert batch_numbering_problem(plan_batches("s", [meta("1-1-a"), meta("1-2-b")], 1).batches, 1) is None
