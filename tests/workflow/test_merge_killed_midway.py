"""A worker killed with its whole process tree (a container stopped, the OOM killer, a power cut) while git merges a
done story into the user's checkout. git writes a merge's result to the checkout before it moves the branch:
`git merge --ff-only` writes the files, then the index (under index.lock), then the ref; `git merge --no-ff` writes
the index and the files, then commits. Killed in between, it leaves the story's files in the user's checkout (staged,
or untracked with index.lock left), HEAD where it was and no MERGE_HEAD. Temporal retries finish_story_git: the same
merge then fails ("Your local changes to the following files would be overwritten by merge", "The following untracked
working tree files would be overwritten by merge"), the story stays unmerged ("merge of ... failed; worktree kept"),
and its half-merge stays in the user's checkout as if it were the user's own uncommitted work; while it is staged,
every later story's merge commit fails the same way. The retry should finish the merge its predecessor started."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from temporalio.testing import ActivityEnvironment

import activities.git_ops as git_ops
from activities.git_ops import ensure_worktree, finish_story_git
from bso.git_rules import FinishStoryInput
from tests.fake_agent.project import STORY, git
from tests.workflow.test_command_backend import _done_story, finish

STORY_FILE_UNTRACKED = f"?? _bmad-output/implementation-artifacts/{STORY}.md"  # as after any finish


def _git_dir(cwd: str) -> Path:
    return Path(cwd, git(Path(cwd), "rev-parse", "--git-dir").strip())


async def _killed_then_retried(root: Path, monkeypatch: pytest.MonkeyPatch, merge_kind: str, leave) -> tuple:
    """finish_story_git, its `git merge <merge_kind>` killed after `leave(checkout, branch)` left what git had
    written; then Temporal's retry on a worker started again. (HEAD before, the retry's result.)"""
    head_before = git(root, "rev-parse", "HEAD").strip()
    real = git_ops._past_index_lock

    async def killed_in_the_merge(cwd: str, *args: str):
        if merge_kind not in args:
            return await real(cwd, *args)
        leave(cwd, args[-1])
        raise git_ops.GitError("the worker was killed with its children (simulated)")

    monkeypatch.setattr(git_ops, "_past_index_lock", killed_in_the_merge)
    monkeypatch.setattr(git_ops, "INDEX_LOCK_PATIENCE_SECONDS", 0.5)  # the stale lock is removed sooner
    with pytest.raises(git_ops.GitError):
        await finish(root, story_title="Hello")
    assert git(root, "rev-parse", "HEAD").strip() == head_before  # the kill came before the branch moved
    # The killed attempt's record that it began the merge, what lets the retry undo it.
    assert (_git_dir(str(root)) / git_ops.MERGE_BEGUN_MARKER).exists()
    monkeypatch.setattr(git_ops, "_past_index_lock", real)
    return head_before, await finish(root, story_title="Hello")


async def test_a_merge_commit_killed_before_its_commit_is_finished_by_the_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, changed = await _done_story(tmp_path)
    # The user's branch moved on since the story began (another story merged, a commit of the user's): the
    # story's work needs a merge commit, not a fast-forward.
    (root / "USER_NOTES.md").write_text("the user's own work\n")
    git(root, "add", "USER_NOTES.md")
    git(root, "commit", "-q", "-m", "the user's commit")

    def index_written_not_committed(cwd: str, branch: str) -> None:
        # The merge's tree in the index and the working tree, HEAD unmoved, no MERGE_HEAD (git writes it only
        # for a merge it stops), no index.lock (the index was written whole).
        subprocess.run(["git", "-C", cwd, "merge", "--no-ff", "--no-commit", "-q", branch], check=True,
                       capture_output=True)
        for name in ("MERGE_HEAD", "MERGE_MSG", "MERGE_MODE", "AUTO_MERGE"):
            (_git_dir(cwd) / name).unlink(missing_ok=True)

    head_before, result = await _killed_then_retried(root, monkeypatch, "--no-ff", index_written_not_committed)

    assert result.merged, result.note
    assert set(changed) <= set(git(root, "ls-files").split())
    assert git(root, "rev-parse", "HEAD~1").strip() == head_before, "the story's work is merged onto the user's branch"
    # Nothing of the story is left staged in the user's checkout as if it were the user's own work (the story
    # file, untracked in the checkout, is the fixture's).
    assert git(root, "status", "--porcelain").strip() == STORY_FILE_UNTRACKED


async def test_a_fast_forward_killed_before_its_index_is_finished_by_the_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, changed = await _done_story(tmp_path)

    def files_written_index_not(cwd: str, branch: str) -> None:
        # git holds index.lock, writes the new files into the checkout, then the index: killed in between.
        (_git_dir(cwd) / "index.lock").write_bytes(b"")
        for path in git(Path(cwd), "diff", "--name-only", "HEAD", branch).split():
            target = Path(cwd, path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(subprocess.run(["git", "-C", cwd, "show", f"{branch}:{path}"], check=True,
                                              capture_output=True).stdout)

    head_before, result = await _killed_then_retried(root, monkeypatch, "--ff-only", files_written_index_not)

    assert result.merged, result.note
    assert set(changed) <= set(git(root, "ls-files").split())
    assert git(root, "status", "--porcelain").strip() == STORY_FILE_UNTRACKED
    assert not (_git_dir(str(root)) / git_ops.MERGE_BEGUN_MARKER).exists()


async def _conflicted_merge_killed_before_its_abort(root: Path, changed: list[str], monkeypatch: pytest.MonkeyPatch):
    """The user's branch changed a file the story changes: the story's merge conflicts, and the worker is killed
    before its `git merge --abort`. Then Temporal's retry. (The file, HEAD before, the retry's result.)"""
    clash, head_before = await _stopped_on_a_conflict_by_a_killed_attempt(root, changed, monkeypatch)
    assert (_git_dir(str(root)) / "MERGE_HEAD").exists()  # BSO's merge, stopped on its conflict
    return clash, head_before, await finish(root, story_title="Hello")


async def test_a_merge_that_conflicted_killed_before_its_abort_is_aborted_by_the_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Here the worker alone is killed (kill -9; git had exited): its `git merge` stopped on a conflict (MERGE_HEAD,
    conflict markers in the user's files) and the worker died before its `git merge --abort`. The retry takes BSO's
    own half-done merge for one of the user's ("the project's checkout is in the middle of a merge (finish or abort
    it first)") and leaves it there, conflict markers and all."""
    root, changed = await _done_story(tmp_path)
    clash, head_before, result = await _conflicted_merge_killed_before_its_abort(root, changed, monkeypatch)

    assert not result.merged  # the conflict is real: the story's branch and worktree stay for a human
    assert "in the middle of a merge" not in result.note, result.note
    # The user's checkout is as the user left it: no merge of BSO's under way, no conflict markers.
    assert not (_git_dir(str(root)) / "MERGE_HEAD").exists()
    assert git(root, "rev-parse", "HEAD").strip() == head_before
    assert git(root, "status", "--porcelain", "--untracked-files=no").strip() == ""
    assert (root / clash).read_text() == "# the user's own version\n"


async def test_a_later_story_still_merges_after_a_conflicted_merge_killed_before_its_abort(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sprint goes on: the next done story's merge, into the checkout BSO's killed merge was left in, is
    refused as well ("in the middle of a merge"), and so is every one after it."""
    root, changed = await _done_story(tmp_path)
    await _conflicted_merge_killed_before_its_abort(root, changed, monkeypatch)
    later = "1-2-later-story"
    wt = await ensure_worktree(str(root), "s1", later)
    (Path(wt.path) / "later.txt").write_text("a later story's work\n")
    git(Path(wt.path), "add", "later.txt")
    git(Path(wt.path), "commit", "-q", "-m", "work on the later story")

    result = await ActivityEnvironment().run(
        finish_story_git, FinishStoryInput(project_root=str(root), session_id="s1", story_key=later, story_title="Later")
    )

    assert result.merged, result.note
    assert "later.txt" in git(root, "ls-files").split()


# The retry undoes only what is exactly its own merge's: the user's work in the paths the merge changes is never
# thrown away (bso.git_rules.merge_leftovers); the merge is then refused as before, everything left as it is.


def _users_edit(cwd: str, path: str, stage: bool) -> None:
    Path(cwd, path).write_text("# the user's own edit, after the kill\n")
    if stage:
        git(Path(cwd), "add", path)


@pytest.mark.parametrize("stage", [False, True], ids=["edited", "edited-and-staged"])
async def test_the_users_edit_of_a_file_a_killed_merge_commit_staged_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stage: bool
) -> None:
    root, changed = await _done_story(tmp_path)
    (root / "USER_NOTES.md").write_text("the user's own work\n")
    git(root, "add", "USER_NOTES.md")
    git(root, "commit", "-q", "-m", "the user's commit")
    edited = changed[0]

    staged_before: list[str] = []

    def index_written_then_the_user_edits(cwd: str, branch: str) -> None:
        subprocess.run(["git", "-C", cwd, "merge", "--no-ff", "--no-commit", "-q", branch], check=True,
                       capture_output=True)
        for name in ("MERGE_HEAD", "MERGE_MSG", "MERGE_MODE", "AUTO_MERGE"):
            (_git_dir(cwd) / name).unlink(missing_ok=True)
        _users_edit(cwd, edited, stage)
        staged_before.extend(git(Path(cwd), "diff", "--cached", "--name-only").split())

    head_before, result = await _killed_then_retried(root, monkeypatch, "--no-ff", index_written_then_the_user_edits)

    assert not result.merged and "worktree kept" in result.note
    assert git(root, "rev-parse", "HEAD").strip() == head_before
    assert (root / edited).read_text() == "# the user's own edit, after the kill\n"
    assert git(root, "diff", "--cached", "--name-only").split() == staged_before  # nothing of it undone


async def test_the_users_own_file_where_a_killed_fast_forward_wrote_the_storys_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, changed = await _done_story(tmp_path)
    edited = changed[0]

    def files_written_then_the_user_edits(cwd: str, branch: str) -> None:
        for path in git(Path(cwd), "diff", "--name-only", "HEAD", branch).split():
            target = Path(cwd, path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(subprocess.run(["git", "-C", cwd, "show", f"{branch}:{path}"], check=True,
                                              capture_output=True).stdout)
        _users_edit(cwd, edited, stage=False)

    head_before, result = await _killed_then_retried(root, monkeypatch, "--ff-only", files_written_then_the_user_edits)

    assert not result.merged and "would be overwritten" in result.note, result.note
    assert git(root, "rev-parse", "HEAD").strip() == head_before
    assert (root / edited).read_text() == "# the user's own edit, after the kill\n"
    for path in changed[1:]:  # the story's other files, left as they are with it
        assert (root / path).exists(), path


def _users_commit_changing_a_file_of_the_story(root: Path, changed: list[str]) -> str:
    """The user's branch changes a file the story changes too: the story's merge conflicts. (The file.)"""
    clash = next(p for p in changed if p.endswith(".py"))
    (root / clash).parent.mkdir(parents=True, exist_ok=True)
    (root / clash).write_text("# the user's own version\n")
    git(root, "add", clash)
    git(root, "commit", "-q", "-m", "the user's commit")
    return clash


async def _stopped_on_a_conflict_by_a_killed_attempt(root: Path, changed: list[str], monkeypatch: pytest.MonkeyPatch):
    """The merge conflicts on a file the user's branch changed too, and the worker is killed before its abort.
    (The conflicted file, HEAD.)"""
    clash = _users_commit_changing_a_file_of_the_story(root, changed)
    real = git_ops._past_index_lock

    async def killed_before_the_abort(cwd: str, *args: str):
        if "--abort" in args:
            raise git_ops.GitError("the worker was killed (simulated)")
        return await real(cwd, *args)

    monkeypatch.setattr(git_ops, "_past_index_lock", killed_before_the_abort)
    with pytest.raises(git_ops.GitError):
        await finish(root, story_title="Hello")
    monkeypatch.setattr(git_ops, "_past_index_lock", real)
    return clash, git(root, "rev-parse", "HEAD").strip()


@pytest.mark.parametrize("stage", [False, True], ids=["being-resolved", "resolved-and-staged"])
async def test_the_users_resolution_of_a_conflict_a_killed_merge_left_is_not_aborted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stage: bool
) -> None:
    """The user found BSO's merge stopped on its conflict (the worker down a while) and resolves it: the retry
    does not abort it (their resolution would go), it is refused as a merge under way."""
    root, changed = await _done_story(tmp_path)
    clash, head_before = await _stopped_on_a_conflict_by_a_killed_attempt(root, changed, monkeypatch)
    (root / clash).write_text("# resolved by the user\n")
    if stage:
        git(root, "add", clash)

    result = await finish(root, story_title="Hello")

    assert not result.merged and "in the middle of a merge" in result.note, result.note
    assert (_git_dir(str(root)) / "MERGE_HEAD").exists()
    assert git(root, "rev-parse", "HEAD").strip() == head_before
    assert (root / clash).read_text() == "# resolved by the user\n"


async def test_a_merge_of_the_storys_branch_by_the_user_is_not_aborted(tmp_path: Path) -> None:
    """The user merged the story's branch themselves and stopped on its conflict: not BSO's merge (its message is
    git's, not BSO's), left as it is."""
    root, changed = await _done_story(tmp_path)
    clash = _users_commit_changing_a_file_of_the_story(root, changed)
    # The story's branch as finish leaves it before its merge (squashed), then the user's merge of it.
    await finish(root, story_title="Hello")  # conflicts, aborted: the branch back on its original commits
    merged = subprocess.run(["git", "-C", str(root), "merge", "-q", f"bso/s1/{STORY}"], capture_output=True)
    assert merged.returncode != 0 and (_git_dir(str(root)) / "MERGE_HEAD").exists()
    conflicted = (root / clash).read_text()

    result = await finish(root, story_title="Hello")

    assert not result.merged and "in the middle of a merge" in result.note, result.note
    assert (root / clash).read_text() == conflicted


@pytest.mark.parametrize("work", ["a-new-file", "an-edit-of-another-file"])
async def test_what_the_user_staged_outside_the_merge_during_its_killed_conflict_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, work: str
) -> None:
    """The worker down a while after BSO's merge stopped on its conflict, the user works on in the checkout and
    stages a file the merge does not touch. The retry's `git merge --abort` (`git reset --merge`) would reset the
    whole index: the new file deleted, the edit reverted. The merge is refused as one under way instead."""
    root, changed = await _done_story(tmp_path)
    clash, head_before = await _stopped_on_a_conflict_by_a_killed_attempt(root, changed, monkeypatch)
    assert (_git_dir(str(root)) / "MERGE_HEAD").exists()
    staged = "MY_NEW_WORK.md" if work == "a-new-file" else "run_checks.py"
    assert staged not in changed
    (root / staged).write_text("the user's work, staged while BSO's merge was stopped\n")
    git(root, "add", staged)

    result = await finish(root, story_title="Hello")

    assert not result.merged and "in the middle of a merge" in result.note, result.note
    assert (root / staged).read_text() == "the user's work, staged while BSO's merge was stopped\n"
    assert staged in git(root, "diff", "--cached", "--name-only").split()
    assert git(root, "rev-parse", "HEAD").strip() == head_before
    assert "<<<<<<<" in (root / clash).read_text()  # the conflict left as it was, for the user


async def test_a_users_copy_of_a_file_the_story_creates_is_kept_by_a_finish_no_kill_cut_short(tmp_path: Path) -> None:
    """No earlier attempt began the merge: the user's untracked file at a path the story creates, holding the same
    bytes (copied out of the story's worktree to try it), is not taken for a killed merge's leftover and deleted.
    git refuses the merge for it (and here the merge conflicts as well)."""
    root, changed = await _done_story(tmp_path)
    head_files = set(git(root, "ls-files").split())
    clash = _users_commit_changing_a_file_of_the_story(root, changed)
    new = next(p for p in changed if p != clash and p not in head_files)
    copy = subprocess.run(["git", "-C", str(root), "show", f"bso/s1/{STORY}:{new}"], check=True, capture_output=True)
    (root / new).parent.mkdir(parents=True, exist_ok=True)
    (root / new).write_bytes(copy.stdout)

    result = await finish(root, story_title="Hello")

    assert not result.merged
    assert (root / new).read_bytes() == copy.stdout, f"the user's untracked {new} was deleted"
    assert not (_git_dir(str(root)) / git_ops.MERGE_BEGUN_MARKER).exists()  # the merge (and its abort) ended


# A sparse checkout: a path outside its patterns is never on disk, and `git checkout -- <path>` refuses it. The
# undoing is never tried there: a story deleting such a file merges, a killed merge's leftovers are refused as
# before (by git, "would be overwritten by merge").


async def _a_story_deleting_a_file_outside_the_sparse_checkout(tmp_path: Path) -> tuple[Path, str]:
    """(The checkout, the later story that deletes vendor/old.txt, not in the user's sparse checkout.)"""
    root, _ = await _done_story(tmp_path)
    (root / "vendor").mkdir()
    (root / "vendor" / "old.txt").write_text("an old vendored file\n")
    git(root, "add", "vendor/old.txt")
    git(root, "commit", "-q", "-m", "vendor a file")
    later = "1-2-drop-vendored"
    wt = await ensure_worktree(str(root), "s1", later)
    git(Path(wt.path), "rm", "-q", "vendor/old.txt")
    git(Path(wt.path), "commit", "-q", "-m", "drop the vendored file")
    git(root, "sparse-checkout", "set", "--no-cone", "/*", "!/vendor/")  # a monorepo's usual setup
    assert not (root / "vendor" / "old.txt").exists()
    assert git(root, "ls-files", "-t", "vendor/old.txt").startswith("S ")
    return root, later


def _finish_later(root: Path, later: str):
    return ActivityEnvironment().run(
        finish_story_git, FinishStoryInput(project_root=str(root), session_id="s1", story_key=later, story_title="Drop")
    )


async def test_a_story_deleting_a_file_outside_the_sparse_checkout_merges(tmp_path: Path) -> None:
    root, later = await _a_story_deleting_a_file_outside_the_sparse_checkout(tmp_path)

    result = await _finish_later(root, later)

    assert result.merged, result.note
    assert "vendor/old.txt" not in git(root, "ls-files").split()


async def test_a_story_deleting_a_file_outside_the_sparse_checkout_merges_on_the_retry_of_a_killed_merge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed in its fast-forward before git wrote anything (index.lock taken): the retry took the path off the
    disk for the merge's deletion written, and its `git checkout -- vendor/old.txt` failed the finish, every retry."""
    root, later = await _a_story_deleting_a_file_outside_the_sparse_checkout(tmp_path)
    real = git_ops._past_index_lock

    async def killed_in_the_merge(cwd: str, *args: str):
        if "--ff-only" not in args:
            return await real(cwd, *args)
        (_git_dir(cwd) / "index.lock").write_bytes(b"")
        raise git_ops.GitError("the worker was killed with its children (simulated)")

    monkeypatch.setattr(git_ops, "_past_index_lock", killed_in_the_merge)
    monkeypatch.setattr(git_ops, "INDEX_LOCK_PATIENCE_SECONDS", 0.5)
    with pytest.raises(git_ops.GitError):
        await _finish_later(root, later)
    assert (_git_dir(str(root)) / git_ops.MERGE_BEGUN_MARKER).exists()  # left by the kill, as a real one would
    monkeypatch.setattr(git_ops, "_past_index_lock", real)

    result = await _finish_later(root, later)

    assert result.merged, result.note
    assert "vendor/old.txt" not in git(root, "ls-files").split()


async def test_a_merge_killed_once_it_ended_leaves_no_record_of_a_merge_under_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after git's merge ended, before the finish recorded its end: the retry finds the story merged, and
    the record that its merge began goes (a later finish of the story at this tip would take it for a kill's)."""
    root, changed = await _done_story(tmp_path)
    real = git_ops._past_index_lock

    async def killed_after_the_merge(cwd: str, *args: str):
        done = await real(cwd, *args)
        if "--ff-only" in args:
            raise git_ops.GitError("the worker was killed (simulated)")
        return done

    monkeypatch.setattr(git_ops, "_past_index_lock", killed_after_the_merge)
    with pytest.raises(git_ops.GitError):
        await finish(root, story_title="Hello")
    assert (_git_dir(str(root)) / git_ops.MERGE_BEGUN_MARKER).exists()
    monkeypatch.setattr(git_ops, "_past_index_lock", real)

    result = await finish(root, story_title="Hello")

    assert result.merged, result.note
    assert set(changed) <= set(git(root, "ls-files").split())
    assert not (_git_dir(str(root)) / git_ops.MERGE_BEGUN_MARKER).exists()
