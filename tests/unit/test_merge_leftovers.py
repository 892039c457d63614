"""What a story's merge into the user's checkout, killed before it ended, left there: only exactly the merge's own
leftovers are undone by the retry, never the user's work (bso.git_rules.merge_leftovers, is_bsos_merge_message)."""

from __future__ import annotations

from bso.git_rules import (
    MERGE_LEFT_ITS_OWN,
    MERGE_LEFT_NOTHING,
    MERGE_LEFT_OTHER,
    MergedPath,
    in_index,
    is_bsos_merge_message,
    merge_leftovers,
    on_disk,
)

OLD, NEW, USERS, MARKERS = ("100644", "a" * 40), ("100644", "b" * 40), ("100644", "c" * 40), ("100644", "d" * 40)
STAGES = (("100644", "e" * 40, 1), ("100644", "a" * 40, 2), ("100644", "f" * 40, 3))


def path(head, result, *, index=None, disk="as-head", merge_index=None) -> MergedPath:
    """A path the merge changes from `head` to `result`; its index and file as HEAD's unless given."""
    return MergedPath(
        head=head, result=result,
        merge_index=merge_index if merge_index is not None else in_index(result),
        index=index if index is not None else in_index(head),
        disk=on_disk(head) if disk == "as-head" else disk,
    )


def test_a_checkout_as_head_holds_nothing_of_the_merge() -> None:
    assert merge_leftovers({"a.py": path(OLD, NEW), "new.py": path(None, NEW)}, stopped=False) == MERGE_LEFT_NOTHING
    assert merge_leftovers({}, stopped=False) == MERGE_LEFT_NOTHING


def test_a_fast_forward_killed_before_its_index_left_the_merges_files_only() -> None:
    # Files written one by one (a.py yes, b.py not yet), the index still HEAD's: a new file is untracked.
    paths = {
        "a.py": path(OLD, NEW, disk=on_disk(NEW)),
        "b.py": path(OLD, NEW),
        "new.py": path(None, NEW, disk=on_disk(NEW)),
        "gone.py": path(OLD, None, disk=None),
    }
    assert merge_leftovers(paths, stopped=False) == MERGE_LEFT_ITS_OWN


def test_a_merge_commit_killed_before_its_commit_left_the_merges_index_and_files() -> None:
    paths = {
        "a.py": path(OLD, NEW, index=in_index(NEW), disk=on_disk(NEW)),
        "new.py": path(None, NEW, index=in_index(NEW), disk=on_disk(NEW)),
        "gone.py": path(OLD, None, index=(), disk=None),
    }
    assert merge_leftovers(paths, stopped=False) == MERGE_LEFT_ITS_OWN


def test_the_users_content_in_a_path_the_merge_changes_is_never_the_merges() -> None:
    merged = {"new.py": path(None, NEW, index=in_index(NEW), disk=on_disk(NEW))}
    # Edited after the kill, staged or not; a file of the user's where the story makes one.
    assert merge_leftovers({**merged, "a.py": path(OLD, NEW, index=in_index(NEW), disk=on_disk(USERS))},
                           stopped=False) == MERGE_LEFT_OTHER
    assert merge_leftovers({**merged, "a.py": path(OLD, NEW, index=in_index(USERS), disk=on_disk(USERS))},
                           stopped=False) == MERGE_LEFT_OTHER
    assert merge_leftovers({"new.py": path(None, NEW, disk=on_disk(USERS))}, stopped=False) == MERGE_LEFT_OTHER
    # A file the merge deletes, rewritten; a folder where the merge writes a file.
    assert merge_leftovers({**merged, "gone.py": path(OLD, None, index=(), disk=on_disk(USERS))},
                           stopped=False) == MERGE_LEFT_OTHER
    assert merge_leftovers({**merged, "a.py": path(OLD, NEW, disk="other")}, stopped=False) == MERGE_LEFT_OTHER


def test_a_symlink_is_not_a_file_of_the_same_bytes() -> None:
    link = ("120000", NEW[1])
    assert merge_leftovers({"l": path(None, link, disk=(True, NEW[1]))}, stopped=False) == MERGE_LEFT_ITS_OWN
    assert merge_leftovers({"l": path(None, link, disk=(False, NEW[1]))}, stopped=False) == MERGE_LEFT_OTHER


def test_a_submodule_is_never_judged() -> None:
    gitlink = ("160000", NEW[1])
    assert merge_leftovers({"sub": path(None, gitlink, disk=None)}, stopped=False) == MERGE_LEFT_OTHER


def test_a_merge_stopped_on_its_conflict_is_its_own_only_as_git_left_it() -> None:
    conflicted = path(OLD, MARKERS, index=STAGES, merge_index=STAGES, disk=on_disk(MARKERS))
    clean = path(None, NEW, index=in_index(NEW), disk=on_disk(NEW))
    assert merge_leftovers({"a.py": conflicted, "new.py": clean}, stopped=True) == MERGE_LEFT_ITS_OWN
    # The user resolving it: the markers edited away, or the resolution staged.
    edited = conflicted._replace(disk=on_disk(USERS))
    assert merge_leftovers({"a.py": edited, "new.py": clean}, stopped=True) == MERGE_LEFT_OTHER
    staged = conflicted._replace(index=in_index(USERS), disk=on_disk(USERS))
    assert merge_leftovers({"a.py": staged, "new.py": clean}, stopped=True) == MERGE_LEFT_OTHER
    # A stopped merge wrote everything: a path still as HEAD's is not as it left it.
    assert merge_leftovers({"a.py": conflicted, "new.py": path(None, NEW)}, stopped=True) == MERGE_LEFT_OTHER


def test_bsos_merge_message_is_told_from_the_users() -> None:
    message = "Merge feat: Story 1.1: Hello"
    assert is_bsos_merge_message("Merge feat: Story 1.1: Hello\n\n# Conflicts:\n#\tsrc/app.py\n", message)
    assert is_bsos_merge_message("Merge feat: Story 1.1: Hello\n", message)
    assert not is_bsos_merge_message("Merge branch 'bso/s1/1-1-hello'\n\n# Conflicts:\n#\tsrc/app.py\n", message)
    assert not is_bsos_merge_message("Merge feat: Story 1.1: Hello world\n", message)
    assert not is_bsos_merge_message("", message)
