"""Git for the command backend: one worktree and branch per story, the Git Exit Gate (P32, P21),
the scope guard (P19), trust-nothing verification, squash (P28) and the local merge back.

All git runs through `git -C <dir> ...` argv lists (no shell). The rules live in bso.git_rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.agent_launcher import signal_marked, write_bytes_atomic
from activities.process import Finished, has_procfs, heartbeating, processes_using, run_command
from activities.session_files import SESSION_DIR, polled_lock, safe_name, session_path, write_json_atomic
from bso.agent_profiles import GitSettings, Verification
from bso.models import DEFAULT_STATUS_FILE
from bso.sprint_status import is_inside, parse_story_file, resolve_inside
from bso.git_rules import (
    MERGE_LEFT_ITS_OWN,
    FinishStoryInput,
    FinishStoryResult,
    MergedPath,
    NOTHING_TO_MERGE,
    REFLOG_FORMAT,
    GitRuleError,
    PRIVATE_KEY_CHANGE,
    PRIVATE_KEY_LINE,
    PRIVATE_KEY_LONGEST_MATCH,
    checkout_moves,
    commit_message,
    in_index,
    holds_private_key,
    index_holds,
    is_bsos_merge_message,
    is_secret_path,
    merge_leftovers,
    on_disk,
    originals_ref,
    parse_porcelain,
    parse_porcelain_entries,
    removal_staged,
    squash_message,
    story_branch,
    work_outside_worktree,
)

WORKTREES_DIR = "worktrees"
_IDENTITY = ["-c", "user.name=BSO", "-c", "user.email=bso@localhost"]


# The project's git hooks never run on BSO's own git: `--no-verify` leaves some running (a worktree's checkout
# runs post-checkout, a commit prepare-commit-msg and post-commit, a merge post-merge, a ref update
# reference-transaction), and a slow or failing hook of the user's would slow or fail BSO's work. A hooks path
# with no hooks in it (set on the command line, it overrides the project's core.hooksPath) turns them all off.
# Nor does BSO sign its commits: a project's commit.gpgsign made every Exit Gate commit ask gpg, which on a worker
# with no key or no terminal fails (five retries, then the story) or waits for a passphrase.
_OWN_GIT_CONFIG = ("-c", "core.hooksPath=/dev/null", "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false")


_GIT_ENV = {"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}  # never a prompt; messages as the code reads them


def git_argv(cwd: str, *args: str) -> list[str]:
    return ["git", "-C", cwd, *_OWN_GIT_CONFIG, *args]


class GitError(RuntimeError):
    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output  # what git said


_GIT_TIMEOUT = 120.0  # seconds a git command may take (a lazy fetch in a partial clone is the slow case)


async def git(cwd: str, *args: str, check: bool = True, timeout: float = _GIT_TIMEOUT, index_file: str | None = None) -> str:
    env = {**os.environ, **_GIT_ENV}
    if index_file is not None:  # an index of BSO's own, beside the worktree's
        env["GIT_INDEX_FILE"] = index_file
    done = await run_command(git_argv(cwd, *args), cwd=cwd, env=env, timeout=timeout)
    if check and done.returncode != 0:
        raise GitError(f"git {' '.join(args)} failed ({done.returncode}): {done.output.strip()[-800:]}", done.output)
    return done.output if done.returncode == 0 else ""


async def identity_args(cwd: str) -> list[str]:
    """Commit as BSO only where the user has no identity configured."""
    email = await git(cwd, "config", "user.email", check=False)
    return [] if email.strip() else list(_IDENTITY)


async def git_dir(wt: str) -> Path:
    """The worktree's own git folder: BSO's records there are nothing the agent sees or a commit could take."""
    return Path((await git(wt, "rev-parse", "--absolute-git-dir")).strip())


def _batches(paths: list[str]) -> Iterator[list[str]]:
    """Paths a git call at a time: thousands of them (a node_modules) would pass the argv limit."""
    for start in range(0, len(paths), _PATHS_PER_CALL):
        yield paths[start:start + _PATHS_PER_CALL]


async def _stage(wt: str, paths: list[str]) -> None:
    """Stage these paths, a deletion too (`git add` refuses a path in neither the tree nor the index: `git rm`'d).
    Literal: a file the agent named `:(top)` or `*` must not stage everything, secrets included."""
    for batch in _batches(paths):
        if present := [p for p in batch if os.path.lexists(os.path.join(wt, p))]:
            await git(wt, "--literal-pathspecs", "add", "-A", "--", *present)
        await _stage_removal(wt, [p for p in batch if p not in present])


async def _stage_removal(wt: str, paths: list[str]) -> None:
    """Stage only these paths' removal from the index; a file of theirs on disk is left there, unstaged."""
    for batch in _batches(paths):
        await git(wt, "--literal-pathspecs", "rm", "-q", "--cached", "--ignore-unmatch", "--", *batch)


async def _commit_only(wt: str, message: str, paths: list[str]) -> None:
    """A commit of BSO's own of these paths alone (a secret the gate refused may be staged)."""
    await git(wt, *await identity_args(wt), "--literal-pathspecs", "commit", "-q", "--no-verify", "-m", message,
              "--", *paths)


async def head(cwd: str) -> str:
    return (await git(cwd, "rev-parse", "HEAD")).strip()


async def repo_problem(project_root: str, session_id: str | None = None) -> str | None:
    """Why the command backend cannot work in this project's repository (for this sprint, given its id), if it
    cannot (checked by `bso sprint start` and before a story's first worktree): each of these failed only after a
    story's first agents ran."""
    if shutil.which("git") is None:
        return "git is not installed"
    if (await git(project_root, "rev-parse", "--is-inside-work-tree", check=False)).strip() != "true":
        return f"{project_root} is not a git repository: the command backend works in git worktrees"
    top = (await git(project_root, "rev-parse", "--show-toplevel", check=False)).strip()
    if top and Path(top).resolve() != Path(project_root).resolve():
        return (
            f"{project_root} is a folder of the git repository {top}, not its top level: agents and verification "
            "would run at the repository's root (start the sprint on the repository, or make the project one)"
        )
    if not (await git(project_root, "rev-parse", "--verify", "-q", "HEAD", check=False)).strip():
        return f"{project_root} has no commit yet: story branches start from HEAD (commit the project first)"
    if (await git(project_root, "rev-parse", "--verify", "-q", "refs/heads/bso", check=False)).strip():
        return "a branch named `bso` exists: git cannot make BSO's story branches bso/<sprint>/<story> beside it (rename it)"
    sprint_branch = f"bso/{session_id}"
    if session_id and (await git(project_root, "rev-parse", "--verify", "-q", f"refs/heads/{sprint_branch}", check=False)).strip():
        return (
            f"a branch named `{sprint_branch}` exists: git cannot make this sprint's story branches "
            f"{sprint_branch}/<story> beside it (rename it, or give the sprint another id)"
        )
    return None


async def require_repo(project_root: str, session_id: str | None = None) -> None:
    if (problem := await repo_problem(project_root, session_id)) is not None:
        raise ApplicationError(problem, type="AgentConfigError", non_retryable=True)


@dataclass
class Worktree:
    path: str
    branch: str
    base: str


def worktree_path(project_root: str, session_id: str, story_key: str) -> Path:
    return Path(project_root, SESSION_DIR, WORKTREES_DIR, safe_name(session_id), story_key)


@asynccontextmanager
async def repo_lock(project_root: str) -> AsyncIterator[None]:
    """One change at a time to the user's checkout and its worktree list: Slaves running at once (stories
    finishing, worktrees made) would otherwise meet on git's index.lock."""
    async with polled_lock(session_path(project_root, "git", "repo.lock")):
        yield


# BSO's own files in the project, kept out of `git status` by the repository's local exclude file (never
# committed, unlike a .gitignore BSO would have to edit): its session directory and the status file's lock.
SESSION_EXCLUDES = (f"{SESSION_DIR}/", "*.yaml.lock")


async def exclude_session_files(project_root: str) -> None:
    """Add SESSION_EXCLUDES to `.git/info/exclude` (the common one of all worktrees), each once. A convenience:
    an exclude file BSO cannot read or write is left as it is (logged), the sprint goes on."""
    exclude = (await _common_dir(project_root)) / "info" / "exclude"
    try:
        text = exclude.read_bytes().decode("utf-8", errors="replace") if exclude.exists() else ""
        missing = [pattern for pattern in SESSION_EXCLUDES if pattern not in text.splitlines()]
        if missing:
            exclude.parent.mkdir(parents=True, exist_ok=True)
            lead = "\n" if text and not text.endswith("\n") else ""
            block = lead + "# BSO (sprint sessions, the status file's lock)\n" + "".join(f"{p}\n" for p in missing)
            with exclude.open("ab") as fh:
                fh.write(block.encode("utf-8"))
    except OSError as err:
        activity.logger.warning("%s not updated (%s): git status will list BSO's files", exclude, err)


async def sprint_base(project_root: str, session_id: str) -> str:
    """The sprint's base commit: the project's HEAD when the sprint first needed a worktree (recorded)."""
    path = session_path(project_root, "git", f"{safe_name(session_id)}.json")
    if path.exists():
        return json.loads(path.read_text(encoding="utf-8"))["base"]
    await exclude_session_files(project_root)
    base = await head(project_root)
    write_json_atomic(path, {"session_id": session_id, "base": base})
    await cleanup_stale_worktrees(project_root, session_id)
    return base


def _story_base_record(project_root: str, session_id: str, story_key: str) -> Path:
    return session_path(project_root, "git", "bases", safe_name(session_id), f"{story_key}.json")


def story_based_on(project_root: str, session_id: str, story_key: str) -> str | None:
    """The branch (`refs/heads/...`) checked out in the project when the story's worktree was made, if recorded."""
    path = _story_base_record(project_root, session_id, story_key)
    return json.loads(path.read_text(encoding="utf-8")).get("branch") if path.exists() else None


async def story_base(project_root: str, session_id: str, story_key: str) -> str:
    """The commit the story's branch started from: the project's HEAD when its worktree was made (recorded), so
    a story that starts after another one merged builds on that work; the sprint's base for a branch made by a
    worker from before it was recorded. With no record, a branch the sprint's base does not hold (older than it:
    `.sprint-session/` cleared, then the sprint id used again) starts where it meets the sprint's base (`git
    merge-base`): squashed onto the sprint's base, its old tree undid every commit the project gained since."""
    path = _story_base_record(project_root, session_id, story_key)
    if path.exists():
        return json.loads(path.read_text(encoding="utf-8"))["base"]
    base = await sprint_base(project_root, session_id)
    tip = await _commit_of(project_root, f"refs/heads/{story_branch(session_id, story_key)}")
    if tip is None or await _is_ancestor(project_root, base, tip):
        return base
    met = (await git(project_root, "merge-base", base, tip, check=False)).strip()
    if not met:
        raise ApplicationError(
            f"the story's branch {story_branch(session_id, story_key)} shares no history with the project's "
            "branch: merge it by hand, or delete it to start the story afresh, then rearm the story",
            type="AgentConfigError",
            non_retryable=True,
        )
    return met


# git's refusals at `worktree add` that no retry changes (the user has to act): what git says, what it means.
# Anything else stays retryable: a lock another git process holds (`index.lock`, a ref's `.lock`), a full disk.
_WORKTREE_REFUSALS = (
    ("exists; cannot create", "a ref is in the way of the story's branch"),  # a branch bso/<session>, say
    ("is not a valid branch name", "git refuses the story's branch name"),
    ("is already checked out at", "the story's branch is checked out elsewhere"),
    ("is already used by worktree at", "the story's branch is checked out elsewhere"),  # git 2.42's words
    ("already registered worktree", "the path is registered as another worktree"),
    ("missing but locked worktree", "the path is registered as another, locked, worktree"),
)


async def _add_worktree(project_root: str, *args: str) -> None:
    """`git worktree add`; a refusal no retry changes is a non-retryable error naming it in git's words."""
    try:
        await git(project_root, "worktree", "add", *args)
    except GitError as err:
        refusal = next((what for words, what in _WORKTREE_REFUSALS if words in err.output), None)
        if refusal is None:
            raise
        said = " ".join(line.strip() for line in err.output.splitlines()
                        if line.strip() and not line.startswith("Preparing worktree"))
        raise ApplicationError(
            f"git cannot make the story's worktree: {refusal} ({said[-600:]}); fix it, then rearm the story",
            type="AgentConfigError",
            non_retryable=True,
        ) from None


async def _clear_half_made_worktree(project_root: str, path: Path) -> None:
    """A `git worktree add` killed before it finished (its worker killed hard) leaves the worktree locked
    `initializing` (git's own word, removed when it is done), its files partly checked out: taken as made, the
    files missing looked deleted to the agent's commit; with no `.git` in it yet, every add after was refused (a
    missing but locked worktree) and the story ended. It is removed, once no git works there any more (the killed
    worker's git may still), and made again; the branch stays."""
    listed = await git(project_root, "worktree", "list", "--porcelain", check=False)
    where = os.path.realpath(path)
    for entry in listed.split("\n\n"):
        lines = entry.splitlines()
        if f"worktree {where}" in lines and "locked initializing" in lines:
            break
    else:
        return
    if users := processes_using([Path(project_root), path], path / ".git", named="git"):
        raise GitError(f"{path}: a `git worktree add` still makes it (processes {users}); trying again")
    await git(project_root, "worktree", "remove", "--force", "--force", str(path))
    activity.logger.warning("%s was left half made by a `git worktree add` killed midway: removed, made again", path)


async def ensure_worktree(project_root: str, session_id: str, story_key: str) -> Worktree:
    """The story's worktree on `bso/<session>/<story key>`, created once from the project's HEAD of that moment."""
    try:
        branch = story_branch(session_id, story_key)
    except GitRuleError as err:
        raise ApplicationError(str(err), type="AgentConfigError", non_retryable=True) from None
    await require_repo(project_root, session_id)
    async with repo_lock(project_root):
        await sprint_base(project_root, session_id)  # recorded once per sprint (and stale worktrees cleared)
        path = worktree_path(project_root, session_id, story_key)
        await _clear_half_made_worktree(project_root, path)
        if (path / ".git").exists():
            return Worktree(str(path), branch, await story_base(project_root, session_id, story_key))
        if path.is_file() or path.is_symlink() or (path.is_dir() and any(path.iterdir())):  # git would refuse it
            raise ApplicationError(
                f"{path} is in the way of the story's worktree (not a worktree): move it away, then rearm the story",
                type="AgentConfigError",
                non_retryable=True,
            )
        await git(project_root, "worktree", "prune", check=False)
        path.parent.mkdir(parents=True, exist_ok=True)
        exists = await git(project_root, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False)
        if exists.strip():
            await _add_worktree(project_root, str(path), branch)
            return Worktree(str(path), branch, await story_base(project_root, session_id, story_key))
        # Recorded before the branch is made: a retry after a crash in between records the HEAD it then uses.
        base = start = await head(project_root)
        if (earlier := await _earlier_sprints_work(project_root, session_id, story_key, base)) is not None:
            # An earlier sprint's work on the story, never merged (it stopped, or a human set the story back):
            # the branch starts from HEAD with that work merged in. From HEAD alone its review found nothing and
            # the story was done without it; from the old branch, the work merged since was missing.
            start = earlier.merged_with_head
            activity.logger.info("%s: goes on from %s (%s), an earlier sprint's work not merged",
                                 story_key, earlier.branch, earlier.tip[:12])
        # The branch checked out then (none on a detached HEAD): the story's work goes back there, never into
        # another branch the user switched the checkout to meanwhile.
        on = (await git(project_root, "symbolic-ref", "-q", "HEAD", check=False)).strip()
        write_json_atomic(_story_base_record(project_root, session_id, story_key),
                          {"story": story_key, "base": base, **({"branch": on} if on else {})})
        await _add_worktree(project_root, "-b", branch, str(path), start)
        return Worktree(str(path), branch, base)


_OBJECT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


@dataclass
class EarlierWork:
    branch: str
    tip: str
    merged_with_head: str  # a merge commit of HEAD and the tip


async def _earlier_sprints_work(project_root: str, session_id: str, story_key: str, base: str) -> EarlierWork | None:
    """The latest branch of another sprint for this story (bso/<sprint>/<story key>) with work the project's HEAD
    (`base`) lacks, merged with it; None when there is none. Its commits alone do not say so: a squash merged them as
    another commit (a later sprint that went on from the branch), so a merge that would change nothing is none.
    One that does not merge cleanly ends the story, naming the branch: a human settles it."""
    refs = await git(project_root, "for-each-ref", "--sort=-committerdate", "--format=%(refname) %(objectname)",
                     "refs/heads/bso/", "refs/bso-originals/")
    branches: list[tuple[str, str]] = []  # (branch, tip) of other sprints, latest first
    originals: list[str] = []  # pre-squash tips: a branch a later sprint took up and squashed is inside one
    for line in refs.splitlines():
        ref, _, commit = line.rpartition(" ")
        kind, _, name = ref.removeprefix("refs/").partition("/")
        sprint, _, key = name.removeprefix("bso/").partition("/") if kind == "heads" else name.partition("/")
        if key != story_key:
            continue
        if kind == "bso-originals":
            originals.append(commit)
        elif sprint != session_id:
            branches.append((name, commit))
    for name, commit in branches:
        if not int((await git(project_root, "rev-list", "--count", f"{base}..{commit}")).strip() or 0):
            continue
        # Taken up already by a later sprint's branch (kept when it stopped, or squashed into its originals): that
        # one holds this work and more, and a merge of this older one alone would undo what came after.
        if any([
            other != commit and await _is_ancestor(project_root, commit, other)
            for other in [tip for _, tip in branches] + originals
        ]):
            continue
        merged = await run_command(git_argv(project_root, "merge-tree", "--write-tree", base, commit),
                                   cwd=project_root, env={**os.environ, **_GIT_ENV}, timeout=_GIT_TIMEOUT)
        tree = next((w for w in merged.output.split() if _OBJECT_ID.fullmatch(w)), None) if merged.returncode == 0 else None
        if merged.returncode not in (0, 1, 129):  # 129: a git without --write-tree (before 2.38), its usage
            raise GitError(f"git merge-tree failed ({merged.returncode}): {merged.output.strip()[-800:]}", merged.output)
        if tree is None:
            why = (
                "does not merge cleanly with the project's HEAD" if merged.returncode == 1
                else "cannot be test-merged by this git (`git merge-tree --write-tree` needs git 2.38 or later)"
            )
            raise ApplicationError(
                f"an earlier sprint's unmerged work on {story_key} (branch {name}) {why}: merge it into your branch "
                f"by hand, or delete it to start the story afresh (`git branch -D {name}`), then rearm the story",
                type="AgentConfigError",
                non_retryable=True,
            )
        if tree == (await git(project_root, "rev-parse", f"{base}^{{tree}}")).strip():
            continue  # merged already (as a squash)
        message = f"Take up {name}: an earlier sprint's work on {story_key}"
        merge_commit = (await git(
            project_root, *await identity_args(project_root), "commit-tree", tree, "-p", base, "-p", commit,
            "-m", message,
        )).strip().splitlines()[-1]
        return EarlierWork(branch=name, tip=commit, merged_with_head=merge_commit)
    return None


async def back_on_story_branch(wt: Worktree) -> str | None:
    """An agent that switched the worktree off its story branch (`git checkout -b feature`, a detached HEAD, as
    coding agents do) left its work where the merge never looks: the story ended done, its work unmerged. When
    the agent's HEAD holds the story branch's commits, the branch is moved up to it and checked out again,
    uncommitted changes and all (the agent's own branch stays as it is). Otherwise the agent's work is named, to
    fail the dispatch. None when the worktree is on its branch (again)."""
    on = (await git(wt.path, "symbolic-ref", "-q", "HEAD", check=False)).strip()
    if on == f"refs/heads/{wt.branch}":
        return None
    on = on.removeprefix("refs/heads/")
    agent_head = await _commit_of(wt.path, "HEAD")
    if agent_head is None:  # `git checkout --orphan`: nothing committed there
        return f"the agent left the story branch {wt.branch} for {on or 'a detached HEAD'}, which has no commit"
    story_tip = await _commit_of(wt.path, f"refs/heads/{wt.branch}")
    # (A story branch the agent deleted or renamed: made again where its work is.)
    if story_tip is None or await _is_ancestor(wt.path, story_tip, agent_head):
        await git(wt.path, "checkout", "-q", "-B", wt.branch, agent_head)
        return None
    where = f"branch {on}" if on else "a detached HEAD"
    return (
        f"the agent left the story branch {wt.branch} for {where} at {agent_head[:12]}, which does not hold the "
        f"branch's commits: BSO merges only the story branch (bring the work onto it in {wt.path}, then rearm the "
        "story)"
    )


def left_ref(dispatch_id: str) -> str:
    """Where BSO keeps what an agent that must change nothing left anyway (never on the user's stash list)."""
    return f"refs/bso-left/{safe_name(dispatch_id)}"


async def set_aside_what_a_reader_left(wt: Worktree, before: str, dispatch_id: str) -> list[str]:
    """A reviewer, an e2e inspector or a plan changes nothing: what one left is set aside, out of the story's
    way, and said. Files (committed or not) go into a commit under left_ref (built in an index of BSO's own:
    `git stash` put it on the user's own stash list, above their entries, for their next `git stash pop`; a
    retry after a crash adds to it, never replaces it); a story branch it moved (a commit, `git reset`) or left
    (`git checkout --detach`) is set back to `before`, its tip and the agent's HEAD kept under left_ref too.
    A git repository it left is named, not set aside. What was said, one line each (none: it changed nothing)."""
    ref = left_ref(dispatch_id)
    said = []
    left = await changed_paths(wt.path)
    if repositories := [p.rstrip("/") for p in left if p.endswith("/")]:
        said.append(f"left git repositories of their own, not set aside (remove them): {', '.join(repositories[:10])}")
    head = await _commit_of(wt.path, "HEAD")
    if files := [p for p in left if not p.endswith("/")]:
        index = str(await git_dir(wt.path) / "bso-set-aside.index")
        try:
            await git(wt.path, "read-tree", *(["HEAD"] if head else ["--empty"]), index_file=index)
            for batch in _batches(files):
                await git(wt.path, "--literal-pathspecs", "add", "-A", "--", *batch, index_file=index)
            tree = (await git(wt.path, "write-tree", index_file=index)).strip()
        finally:
            Path(index).unlink(missing_ok=True)
        parents = [p for p in (head, await _commit_of(wt.path, f"{ref}/files")) if p]
        kept = (await git(wt.path, *await identity_args(wt.path), "commit-tree", tree,
                          *(arg for p in parents for arg in ("-p", p)), "-m", f"bso: left by {dispatch_id}")
                ).strip().splitlines()[-1]
        await git(wt.path, "update-ref", f"{ref}/files", kept)
        said.append(f"changed files (set aside as {ref}/files, not committed): {', '.join(files[:10])}")
    on = (await git(wt.path, "symbolic-ref", "-q", "HEAD", check=False)).strip()
    tip = await _commit_of(wt.path, f"refs/heads/{wt.branch}")
    if on != f"refs/heads/{wt.branch}" or tip != before:
        kept_refs = []
        if head is not None and head != before:
            await git(wt.path, "update-ref", f"{ref}/head", head)
            kept_refs.append(f"its HEAD as {ref}/head")
        if tip is not None and tip not in (before, head):
            await git(wt.path, "update-ref", f"{ref}/branch", tip)
            kept_refs.append(f"the branch's tip as {ref}/branch")
        await git(wt.path, "checkout", "-q", "-f", "-B", wt.branch, before)
        said.append(f"moved or left the story branch: set back to {before[:12]}"
                    + (f" ({', '.join(kept_refs)} kept)" if kept_refs else ""))
    if files:
        await git(wt.path, "reset", "-q", "--hard")
        await git(wt.path, "clean", "-fdq")
    return said


async def changed_paths(wt: str) -> list[str]:
    return parse_porcelain(await _status(wt))


async def _status(wt: str) -> str:
    # (--no-renames: a file untracked and copied under another name is a removal, not a rename, seen for itself)
    return await git(wt, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames")


async def unmerged_commits(wt: str, project_root: str) -> int:
    """Commits of the worktree's branch that the project's checked-out branch does not hold yet (a squashed
    and merged branch is an ancestor of it: none)."""
    return int((await git(wt, "rev-list", "--count", f"{await head(project_root)}..HEAD")).strip() or 0)


async def committed_paths(wt: str, since: str) -> list[str]:
    out = await git(wt, "diff", "--name-only", "-z", since, "HEAD")
    return [p for p in out.split("\x00") if p]


@dataclass
class GateResult:
    committed: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    repositories: list[str] = field(default_factory=list)  # git repositories of their own, never committed
    tracked_again: list[str] = field(default_factory=list)  # untracked but not ignored: `git add` tracks them


# Git rewrites its whole index for every commit: one commit per file cost ~30 ms a file at 3,000 files and grew
# with their number (a node_modules the .gitignore misses would take hours). Past this many, one commit.
GATE_COMMITS_PER_FILE_UP_TO = 500


async def exit_gate(wt: str, settings: GitSettings, *, since: str, agent_type: str, story_key: str,
                    dispatch_id: str) -> GateResult:
    """P32: commit what the agent left, file by file (past GATE_COMMITS_PER_FILE_UP_TO files, all in one
    commit); P21: refuse secret-looking files (left uncommitted and unstaged, and reported also when the agent
    committed them itself; deleting or untracking one is fine: its removal is committed, a file kept on disk
    stays out of the commits). Another file the agent untracked stays out only where it is ignored now (as
    `git rm --cached` then .gitignore does); kept as it was and not ignored, it is tracked again
    (GateResult.tracked_again). A git repository the agent left inside the worktree (a clone)
    is not committed: it would be a gitlink without its files, which go with the worktree."""
    result = GateResult()
    identity = await identity_args(wt)
    statuses: dict[str, list[str]] = {}
    for status, path in parse_porcelain_entries(await _status(wt)):
        statuses.setdefault(path, []).append(status)
    left = []
    removals_only = set()  # the index no longer holds them: their removal is committed, never a file on disk
    # Files untracked and kept (`git rm --cached`, or `git rm -r --cached .` on a whole project), judged at once.
    unchanged = await _unchanged_since_committed(wt, [
        path for path, codes in statuses.items() if removal_staged(codes) and "??" in codes
    ])
    # Files that carry a private key whatever their name (`git mv key.pem notes.txt`): secrets too.
    keys_inside = await _files_holding_keys(wt, [
        path for path in statuses if not path.endswith("/") and not is_secret_path(path, settings.secret_patterns)
    ])
    # A submodule untracked with them: its folder (empty in BSO's worktree, never initialized) shows nothing
    # untracked, and `git add` would not track it again; its removal would take it out of the user's project.
    gitlinks = await _submodules_untracked(wt, [
        path for path, codes in statuses.items() if codes == ["D "] and _is_folder(os.path.join(wt, path))
    ])
    for path, codes in statuses.items():
        if path.endswith("/"):  # how git lists a repository of its own, untracked
            result.repositories.append(path.rstrip("/"))
            continue
        if path in gitlinks:  # HEAD's own gitlink put back: nothing new committed
            result.tracked_again.append(path)
            continue
        secret = is_secret_path(path, settings.secret_patterns) or path in keys_inside
        if secret and path not in unchanged and await _would_commit_content(wt, path, codes):
            result.refused.append(path)
            continue
        if not secret and path in unchanged:
            # Untracked (`git rm --cached`), kept as it was and not ignored: the half of `git rm -r --cached .`
            # without its `git add .` would take the whole project out of the repository. Any next `git add -A`
            # tracks it again; so does the gate, first (a commit of another file would take its removal), and says so.
            result.tracked_again.append(path)
            continue
        left.append(path)
        if secret or removal_staged(codes) and "??" not in codes:  # gone from the disk, or ignored now
            removals_only.add(path)  # `git add` would track an ignored file again, or fail on it
    await _stage(wt, [p for p in result.tracked_again if p not in gitlinks])
    for batch in _batches(sorted(gitlinks)):  # (`git add` of an empty folder adds nothing)
        await git(wt, "--literal-pathspecs", "reset", "-q", "HEAD", "--", *batch)
    for batch in _batches(result.refused):  # one the agent staged stays out of every commit
        await git(wt, "--literal-pathspecs", "reset", "-q", "--", *batch)

    async def commit(path: str) -> None:
        message = commit_message(
            settings.commit_message, agent_type=agent_type, story_key=story_key, path=path, dispatch_id=dispatch_id
        )
        await git(wt, *identity, "commit", "-q", "--no-verify", "-m", message)

    if len(left) <= GATE_COMMITS_PER_FILE_UP_TO:
        for path in left:
            await (_stage_removal if path in removals_only else _stage)(wt, [path])
            if staged := await _staged(wt):  # with what the agent staged itself (a removal, say)
                await commit(path)
                result.committed.extend(p for p in staged if p not in result.committed)
    else:
        await _stage(wt, [p for p in left if p not in removals_only])
        await _stage_removal(wt, [p for p in left if p in removals_only])
        if staged := await _staged(wt):
            await commit(f"{len(left)} files")
            result.committed.extend(staged)
    raw = (await git(wt, "diff", "--raw", "-z", "--no-abbrev", "--no-renames", since, "HEAD")).split("\x00")
    keys_committed = await _keys_committed(wt, f"{since}..HEAD")
    submodules = None
    for meta, path in zip(raw[0::2], raw[1::2]):  # ":old new old-sha new-sha status", then the path
        fields = meta.split()
        if len(fields) < 5:
            continue
        if fields[1] == "160000" and fields[0] != ":160000" and path not in result.repositories:
            # A gitlink the agent committed itself: a submodule (in .gitmodules) is the project's to have.
            if submodules is None:
                listed = await git(wt, "config", "--blob", "HEAD:.gitmodules", "--get-regexp", r"\.path$", check=False)
                submodules = {line.split(" ", 1)[1] for line in listed.splitlines() if " " in line}
            if path not in submodules:
                result.repositories.append(path)
        if fields[4] != "D" and path not in result.refused and (
            is_secret_path(path, settings.secret_patterns) or path in keys_committed
        ):
            result.refused.append(path)
    return result


async def _files_holding_keys(wt: str, paths: list[str]) -> set[str]:
    """Those of these files in the worktree that carry a private key (holds_private_key): git's search finds the
    few with a key's first line (binary files too), and those are read."""
    found: set[str] = set()
    for batch in _batches(paths):
        listed = await git(wt, "--literal-pathspecs", "grep", "-l", "-z", "--untracked", "-E", "-e", PRIVATE_KEY_LINE,
                           "--", *batch, check=False)  # (1: no file has one)
        for path in filter(None, listed.split("\x00")):
            if await asyncio.to_thread(_file_holds_private_key, os.path.join(wt, path)):
                found.add(path)
    return found


_KEY_SCAN_BYTES = 1 << 20
_KEY_SCAN_OVERLAP = PRIVATE_KEY_LONGEST_MATCH  # a key across a block's end is whole in the next block's text


def _file_holds_private_key(path: str) -> bool:
    """holds_private_key over a file of any length."""
    try:
        with open(path, "rb") as fh:
            return _stream_holds_private_key(fh)
    except OSError:  # gone meanwhile: nothing of it committed
        return False


def _blob_holds_private_key(cwd: str, blob: str, timeout: float = _GIT_TIMEOUT) -> bool:
    """holds_private_key over a committed blob of any length, read as git writes it (never held whole: a blob of
    hundreds of MB). A blob git cannot give (missing from a partial clone, or not given within `timeout`: a fetch
    that hangs) is an error, never "no key"."""
    with tempfile.TemporaryFile() as errors, subprocess.Popen(
        git_argv(cwd, "--no-replace-objects", "cat-file", "blob", blob),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors, env={**os.environ, **_GIT_ENV},
        start_new_session=True,  # its group: a lazy fetch it starts holds the pipe open too, and goes with it
    ) as proc:
        timed_out = threading.Event()

        def give_up() -> None:
            timed_out.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

        watchdog = threading.Timer(timeout, give_up)
        watchdog.start()
        try:
            if _stream_holds_private_key(proc.stdout):
                return True
            failed = proc.wait() != 0
        finally:
            watchdog.cancel()
            with contextlib.suppress(ProcessLookupError):  # (a key found early: the rest is not read)
                os.killpg(proc.pid, signal.SIGKILL)
        if timed_out.is_set():
            raise GitError(f"git cat-file blob {blob} gave no answer within {timeout:g} s, so it could not be "
                           "checked for a private key")
        if failed:
            errors.seek(0)
            said = errors.read(800).decode(errors="replace").strip()
            raise GitError(f"git cat-file blob {blob} failed ({proc.returncode}), so it could not be checked for "
                           f"a private key: {said}")
        return False


def _stream_holds_private_key(stream) -> bool:
    """holds_private_key over a binary stream, read in blocks (a key across a block's end found too)."""
    tail = ""
    while block := stream.read(_KEY_SCAN_BYTES):
        text = tail + block.decode("latin-1")  # (every byte a character: the armour is ASCII)
        if holds_private_key(text):
            return True
        tail = text[-_KEY_SCAN_OVERLAP:]
    return False


async def _keys_committed(cwd: str, revisions: str) -> set[str]:
    """The files to which a commit of `revisions` (`base..tip`) brought a private key, under any name: git's
    search finds the commits whose changes touch a key's first line or its body (binary files too: `--text`; a
    merge by what it holds that none of its parents did: `--cc`), and those blobs are read by their ids (a path
    git's output cannot spell is still read). Objects as the commits hold them: a `git replace` would show
    another text in the key's place."""
    logged = await git(cwd, "--no-replace-objects", "log", f"-G{PRIVATE_KEY_CHANGE}", "--text", "--cc", "--raw",
                       "--no-abbrev", "--format=", "-z", "--no-renames", "--diff-filter=d", revisions)
    found: set[str] = set()
    read: set[str] = set()
    words = logged.split("\x00")  # ":mode(s) id(s) status", its path, ... (a merge's: "::modes ids statuses")
    at = 0
    while at + 1 < len(words):
        meta = words[at].lstrip("\n")
        if not meta.startswith(":"):
            at += 1
            continue
        path, at = words[at + 1], at + 2
        blob = [word for word in meta.split() if _OBJECT_ID.fullmatch(word)][-1:]  # (the commit's side: the last)
        if not blob or blob[0] in read or path in found:
            continue
        read.add(blob[0])
        if await asyncio.to_thread(_blob_holds_private_key, cwd, blob[0]):
            found.add(path)
    return found


async def _would_commit_content(wt: str, path: str, statuses: list[str]) -> bool:
    """Would committing this path put content into the branch? Decided on the index, not the disk: a file the
    index no longer holds (`git rm --cached key.pem`, maybe listed in .gitignore then) is the agent taking it out
    of the repository, its file kept on disk, unless those bytes are not the ones the repository last had there
    (a new key written after the untracking, a file rewritten after `git rm`). A file gone from the disk is a
    removal."""
    on_disk = os.path.join(wt, path)
    if not os.path.lexists(on_disk):
        return False
    if index_holds(statuses) or os.path.islink(on_disk) or not os.path.isfile(on_disk):
        return True
    committed = await _last_committed_content(wt, path)
    return committed is None or (await _hashes_on_disk(wt, [path]))[-1:] != [committed]


_OBJECT_ID = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")


async def _hashes_on_disk(wt: str, paths: list[str]) -> list[str]:
    """The blob ids `git add` would give these files, in order. git's output is read with its stderr: what a
    clean filter of .gitattributes says there is no id."""
    return [word for word in (await git(wt, "hash-object", "--", *paths)).split() if _OBJECT_ID.fullmatch(word)]


async def _unchanged_since_committed(wt: str, paths: list[str]) -> set[str]:
    """Those of these paths, untracked and kept on disk, whose content is the one the repository last had there
    (_would_commit_content false): a few git calls for hundreds of paths, not three a path (2,000 took 11 s). A
    symlink is judged by where it leads, as git stores it (untracked unchanged, it was tracked again unsaid)."""
    unchanged = set()
    links = {p for p in paths if os.path.islink(os.path.join(wt, p))}
    for batch in _batches([p for p in paths if p in links or os.path.isfile(os.path.join(wt, p))]):
        listed = await git(wt, "--literal-pathspecs", "ls-tree", "-r", "-z", "--full-tree", "HEAD", "--", *batch)
        in_head = {}
        for entry in listed.split("\x00"):
            meta, _, path = entry.partition("\t")
            if path and len(meta.split()) == 3:
                in_head[path] = (meta.split()[0] == "120000", meta.split()[2])
        files = [p for p in batch if p not in links]
        on_disk = dict(zip(files, await _hashes_on_disk(wt, files))) if files else {}
        if len(on_disk) != len(files):  # nothing to pair them by: none is said unchanged (a secret judged alone)
            on_disk = {}
        for path in (p for p in batch if p in links):
            if path in in_head:  # (the id's length says the repository's hash: SHA-1 or SHA-256)
                on_disk[path] = _link_blob(os.readlink(os.fsencode(os.path.join(wt, path))), in_head[path][1])
        # (HEAD holds each: its removal from the index is staged.)
        unchanged.update(p for p, blob in on_disk.items() if in_head.get(p) == (p in links, blob))
    return unchanged


def _link_blob(target: bytes, like: str) -> str:
    """The blob id git gives a symlink (its target's bytes), in the hash of the object id `like`."""
    digest = hashlib.sha256 if len(like) == 64 else hashlib.sha1
    return digest(b"blob %d\x00" % len(target) + target).hexdigest()


def _is_folder(path: str) -> bool:
    return os.path.isdir(path) and not os.path.islink(path)


async def _submodules_untracked(wt: str, paths: list[str]) -> set[str]:
    """Those of these folders, their removal from the index staged, that are a gitlink in HEAD (a submodule)
    and are not ignored now."""
    found = set()
    for batch in _batches(paths):
        listed = await git(wt, "--literal-pathspecs", "ls-tree", "-z", "--full-tree", "HEAD", "--", *batch)
        links = [path for meta, _, path in (e.partition("\t") for e in listed.split("\x00"))
                 if path and meta.split()[:1] == ["160000"]]
        for link in links:  # (few: a project's submodules; check-ignore takes no pathspec magic, `./` keeps a `:` out)
            ignored = await run_command(git_argv(wt, "check-ignore", "-q", "--", f"./{link}"), cwd=wt)
            if ignored.returncode == 1:  # not ignored (0: ignored; 128: git could not tell, left out)
                found.add(link)
    return found


async def _staged(wt: str) -> list[str]:
    return [p for p in (await git(wt, "diff", "--cached", "--name-only", "-z")).split("\x00") if p]


async def _last_committed_content(wt: str, path: str) -> str | None:
    """The blob `path` last had in HEAD's history: in HEAD, or before the commit that removed it; None if never."""
    if in_head := await _blob_of(wt, f"HEAD:{path}"):
        return in_head
    removed_by = (await git(wt, "--literal-pathspecs", "log", "-1", "--format=%H", "--diff-filter=D", "HEAD", "--",
                            path)).strip()
    return await _blob_of(wt, f"{removed_by}^:{path}") if removed_by else None


async def _blob_of(wt: str, rev_and_path: str) -> str | None:
    return (await git(wt, "rev-parse", "--verify", "--quiet", rev_and_path, check=False)).strip() or None


def status_file_in_project(project_root: str, status_file: str | None) -> list[str]:
    """The sprint's status file, relative to the project (the repository's top level): its path as given and,
    when that is a symlink, where it leads (an agent's save may replace the link or write through it); the
    ones outside the project left out."""
    given = status_file or DEFAULT_STATUS_FILE
    root_real = os.path.realpath(project_root)
    path = given if os.path.isabs(given) else os.path.join(project_root, given)
    # As given: the root resolved, the file's own name not (a symlink stays itself).
    lexical = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(path))), os.path.basename(path))
    found = [
        Path(os.path.relpath(p, root_real)).as_posix()
        for p in (lexical, os.path.realpath(path)) if is_inside(root_real, p)
    ]
    return list(dict.fromkeys(found))


async def undo_status_file_change(wt: Worktree, status_files: list[str], *, agent_type: str, dispatch_id: str) -> bool:
    """BSO alone writes the status file (U4); BMAD's dev agents set their story's status in it themselves. Their
    change, committed in the worktree (by them or the Exit Gate), would be merged into the project's checkout,
    where BSO's own writes wait uncommitted: the merge would fail and the story's work stay unmerged. It is
    undone by a commit of its own (of those paths only: a secret the gate refused may be staged), back to the
    file as the story's branch began. True when there was one."""
    changed = (await git(
        wt.path, "--literal-pathspecs", "diff", "--name-only", "-z", wt.base, "HEAD", "--", *status_files
    )).split("\x00")
    changed = [p for p in changed if p]
    if not changed:
        return False
    for path in changed:
        if (await git(wt.path, "ls-tree", "--name-only", wt.base, "--", path)).strip():
            await git(wt.path, "--literal-pathspecs", "checkout", wt.base, "--", path)
        else:  # the agent added it: the project does not track it
            await git(wt.path, "--literal-pathspecs", "rm", "-q", "-f", "--", path)
    await _commit_only(
        wt.path, f"bso: {', '.join(changed)} is BSO's to write; the {agent_type}'s change to it undone ({dispatch_id})",
        changed,
    )
    return True


@dataclass
class StoryFileMoved:
    """The agent's story file went to the checkout's copy: the text that copy had before is kept under `kept_as`
    (None: the checkout had none)."""

    kept_as: str | None
    written: str  # sha256 of the bytes written to the checkout


def story_file_before_ref(dispatch_id: str) -> str:
    return f"{left_ref(dispatch_id)}/story-file"


async def move_story_file_out(wt: Worktree, story_path: str, project_story_file: str, *, agent_type: str,
                              dispatch_id: str) -> StoryFileMoved | None:
    """BMAD's dev-story updates the story file (Status, Dev Agent Record, File List). One the project does not
    track (BSO's story-creator wrote it in the checkout) that the agent wrote in its worktree instead, at the
    same path, would be merged over the checkout's untracked copy: git refuses that, and the story's work
    stayed unmerged. Its text goes to the checkout's copy; the worktree's is removed by a commit of its own.
    The checkout's text from before, which nothing else keeps (the copy is untracked), is kept first under
    story_file_before_ref. None when nothing was moved."""
    if (await git(wt.path, "ls-tree", "--name-only", wt.base, "--", story_path)).strip():
        return None  # tracked: merged as any other file
    if not (await git(wt.path, "--literal-pathspecs", "ls-tree", "--name-only", "HEAD", "--", story_path)).strip():
        return None
    agents_copy = Path(wt.path, story_path)  # as committed (by the Exit Gate, or by the agent)
    kept_as, written = None, ""
    if agents_copy.is_file() and not agents_copy.is_symlink():  # bytes as they are: a cp1252 story stays one
        kept_as = await _keep_story_text(wt, story_path, Path(project_story_file), dispatch_id)
        text = agents_copy.read_bytes()
        write_bytes_atomic(Path(project_story_file), text)
        written = hashlib.sha256(text).hexdigest()
    await git(wt.path, "--literal-pathspecs", "rm", "-q", "-f", "--", story_path)
    await _commit_only(
        wt.path, f"bso: {story_path} lives in the project's checkout; the {agent_type}'s copy moved there ({dispatch_id})",
        [story_path],
    )
    return StoryFileMoved(kept_as, written)


async def _keep_story_text(wt: Worktree, story_path: str, checkouts_copy: Path, dispatch_id: str) -> str | None:
    """The checkout's story file as a commit of that one file under story_file_before_ref (`git show
    <ref>:<path>`); a retry keeps the first (by then the checkout holds the agent's text). One an earlier run of
    the same sprint id left (its dispatch ids are the same; the run id in the commit tells) is no retry's: the
    text is kept anew over it (its parent). The ref, if kept."""
    ref = story_file_before_ref(dispatch_id)
    run = f"run {_workflow_run_id()}"
    earlier = await _commit_of(wt.path, ref)
    if earlier is not None and run in await git(wt.path, "log", "-1", "--format=%B", earlier):
        return ref
    if not checkouts_copy.is_file() or checkouts_copy.is_symlink():
        return None
    blob = (await git(wt.path, "hash-object", "-w", "--no-filters", "--", str(checkouts_copy))).strip()
    index = str(await git_dir(wt.path) / "bso-story-file.index")
    try:
        await git(wt.path, "read-tree", "--empty", index_file=index)
        await git(wt.path, "update-index", "--add", "--cacheinfo", f"100644,{blob},{story_path}", index_file=index)
        tree = (await git(wt.path, "write-tree", index_file=index)).strip()
    finally:
        Path(index).unlink(missing_ok=True)
    kept = (await git(wt.path, *await identity_args(wt.path), "commit-tree", tree,
                      *(["-p", earlier] if earlier else []), "-m",
                      f"bso: {story_path} in the checkout before the agent's copy replaced it ({dispatch_id}, {run})")
            ).strip().splitlines()[-1]
    await git(wt.path, "update-ref", ref, kept)
    return ref


def _workflow_run_id() -> str:
    try:
        return activity.info().workflow_run_id
    except RuntimeError:  # not in an activity
        return ""


async def put_story_text_back(wt: Worktree, story_path: str, project_story_file: str, moved: StoryFileMoved) -> bool:
    """The work the agent's story text describes was rolled back: the checkout's copy gets its text from before
    again, unless someone changed it since it was written. Whether it was put back."""
    copy = Path(project_story_file)
    if moved.kept_as is None or not copy.is_file() or hashlib.sha256(copy.read_bytes()).hexdigest() != moved.written:
        return False
    write_bytes_atomic(copy, await _blob_bytes(wt.path, f"{moved.kept_as}:{story_path}"))
    return True


async def _blob_bytes(cwd: str, rev: str) -> bytes:
    """A blob as it is (git() decodes its output: a cp1252 story would lose its bytes)."""
    return await _git_bytes(cwd, "cat-file", "blob", rev)


async def _git_bytes(cwd: str, *args: str, ok: tuple[int, ...] = (0,)) -> bytes:
    """git's output as it is (git() decodes it, a non-UTF-8 byte replaced); another exit code than `ok` fails."""
    proc = await asyncio.create_subprocess_exec(
        *git_argv(cwd, *args), env={**os.environ, **_GIT_ENV}, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    if proc.returncode not in ok:
        raise GitError(f"git {' '.join(args)} failed ({proc.returncode}): {err.decode(errors='replace')[-800:]}")
    return out


@dataclass
class VerificationResult:
    ok: bool
    output: str


async def verify(wt: str, verification: Verification, env: dict[str, str], owner: str = "") -> VerificationResult:
    """Trust nothing: run the project's own checks in the worktree; any failing command fails the dispatch.
    `timeout_seconds` is for all the commands together: the Slave's deadline for a command agent's activity
    leaves that much for one run of them (and as much for the fix snapshot), however many there are. What the
    checks leave is undone after them, also when they are cut short; `owner` (the dispatch, its workflow run and
    host) names them in their record, for the retry of a worker killed during them."""
    chunks: list[str] = []
    deadline = time.monotonic() + verification.timeout_seconds
    left_before = set(await changed_paths(wt))
    mark = f"checks:{uuid.uuid4().hex}"
    record = await _checks_record(wt)
    write_json_atomic(record, {"owner": owner, "left_before": sorted(left_before), "mark": mark})
    try:
        ok = await _run_checks(wt, verification, env, deadline, chunks, mark)
    finally:  # (a cancel too: its commands are killed by then)
        await _undo_what_checks_left(wt, left_before)
        record.unlink(missing_ok=True)
    text = "\n\n".join(chunks)
    return VerificationResult(ok, text[-verification.output_tail_chars:])


async def _checks_record(wt: str) -> Path:
    return await git_dir(wt) / "bso-checks-running.json"


async def undo_interrupted_checks(wt: str, owner: str) -> bool:
    """Checks cut short by a worker killed during them: what they still run on this host is killed and, for the
    retry of the same dispatch (`owner`), what they left is undone before anything else works in the worktree
    (the next Exit Gate would commit it as the agent's work). Another dispatch's record is only dropped: a
    person may have worked in the worktree since. True when there was a record."""
    record = await _checks_record(wt)
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return False
    except (OSError, ValueError):  # (written atomically: only a hand-edited one)
        data = {}
    data = data if isinstance(data, dict) else {}
    if isinstance(data.get("mark"), str):
        signal_marked(data["mark"], signal.SIGKILL)
    left_before = data.get("left_before")
    if owner and data.get("owner") == owner and isinstance(left_before, list):
        await _undo_what_checks_left(wt, {str(p) for p in left_before})
    record.unlink(missing_ok=True)
    return True


# The worktree's own locks: the index's (`git add`, `git commit`) and HEAD's (a commit, a checkout moving it).
# (The story branch's ref lock, in the repository's common folder, goes too: a stale one failed every commit on the
# branch. The user's checkout shares that folder, so it goes only when no git works there either.)
_WORKTREE_LOCKS = ("index.lock", "HEAD.lock")


def _story_ref_lock(common: Path, branch: str) -> Path:
    """The lock of the story's branch: `<common git folder>/refs/heads/<branch>.lock`, shared by all the
    repository's checkouts (a commit in the worktree moves the branch under it, as the squash does)."""
    return common / "refs" / "heads" / f"{branch}.lock"


async def _main_checkouts(wt: str, project_root: str) -> list[Path]:
    """Where the user's git works: the project's root and every checkout of the repository, as `git worktree
    list` gives them: the main one (another folder when the project is a linked worktree itself; git names the
    common folder there when that is not a checkout's `.git`, as with `git init --separate-git-dir`) and the
    user's linked worktrees elsewhere (`git worktree add ../feature`), which share the common folder too."""
    listed = (await git(wt, "worktree", "list", "--porcelain", check=False)).splitlines()
    return [Path(project_root), *(Path(line.removeprefix("worktree ")) for line in listed if line.startswith("worktree "))]


async def _common_dir(checkout: str) -> Path:
    """The repository's common git folder, which all its checkouts share (refs, the main index's folder)."""
    return Path(checkout, (await git(checkout, "rev-parse", "--git-common-dir")).strip())


def _remove_killed_gits_lock(lock: Path) -> None:
    lock.unlink(missing_ok=True)
    activity.logger.warning("%s was left by a git killed in the middle of its work: removed", lock)


async def remove_stale_locks(wt: Worktree, project_root: str) -> list[Path]:
    """Locks no living process can hold: a git killed with SIGKILL (its worker, or the agent, killed hard in the
    middle of a `git add` or a commit) left them, and every git that writes the index, moves HEAD or commits on
    the story's branch failed on them, attempt after attempt. Called before a dispatch works in the worktree,
    once its earlier attempts' processes are killed (on a first attempt too: an earlier dispatch may have left
    one). The worktree's own (_WORKTREE_LOCKS, in its git folder) go when procfs shows no live process working
    in the worktree or its git folder (a git run there, `-C` or from a shell, has its directory there) nor
    holding the lock open (a git run from elsewhere with --git-dir): git holds a lock only while running, so a
    lock none of them holds is nobody's.
    The story branch's ref lock (_story_ref_lock) is in the repository's common git folder, which the user's
    checkout shares: a git of the user's there may hold it (`git gc` and `git pack-refs` lock every loose ref
    they prune), so it goes only when, besides, no git works in the common folder or the user's checkout
    (_main_checkouts, BSO's worktrees under it included): a git, not any process (the user's shell, an editor,
    another story's agent often work there and hold no ref lock; a git they start does). Only that one lock:
    never another ref's (the user's branch, another story's), never packed-refs.lock. Without procfs nothing
    tells: they stay. Called again before the story's squash (finish_story_git), which moves the branch. The
    locks removed."""
    folder = await git_dir(wt.path)
    common = await _common_dir(wt.path)
    removed = []
    for lock in [*(folder / name for name in _WORKTREE_LOCKS), _story_ref_lock(common, wt.branch)]:
        if not lock.exists():
            continue
        users = processes_using([Path(wt.path), folder], lock)
        if users is not None and lock.parent != folder:  # the branch's: a git of the user's may hold it too
            wider = processes_using([common, *await _main_checkouts(wt.path, project_root)], lock, named="git")
            users = None if wider is None else users + wider
        if users is None or users:
            unknown = "unknown, no procfs" if not has_procfs() else "unknown, another user's git runs, its folder unseen"
            activity.logger.warning("%s is held or may be (processes working there: %s): left alone", lock,
                                    users if users is not None else unknown)
            continue
        _remove_killed_gits_lock(lock)
        removed.append(lock)
    return removed


async def _undo_what_checks_left(wt: str, left_before: set[str]) -> None:
    """The checks' own files (a junit or coverage report) are not the agent's work: left in the worktree, the
    next Exit Gate committed and merged them, and the PO gate blocked the story for a change nobody authorized."""
    new = [path for path in await changed_paths(wt) if path not in left_before]
    for paths in _batches(new):
        await git(wt, "--literal-pathspecs", "reset", "-q", "--", *paths, check=False)  # what a check staged
        in_head = (await git(wt, "--literal-pathspecs", "ls-tree", "-z", "--name-only", "HEAD", "--", *paths)).split("\x00")
        if tracked := {p for p in in_head if p}:
            await git(wt, "--literal-pathspecs", "checkout", "-q", "HEAD", "--", *sorted(tracked))
        if untracked := [p for p in paths if p not in tracked]:
            await git(wt, "--literal-pathspecs", "clean", "-fq", "--", *untracked)


_PATHS_PER_CALL = 500


async def _run_checks(
    wt: str, verification: Verification, env: dict[str, str], deadline: float, chunks: list[str], mark: str
) -> bool:
    """Each command in turn until one fails or the time is spent, its output in `chunks`; whether all passed."""
    for argv in verification.commands:
        if not argv:
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            chunks.append(f"$ {' '.join(argv)}  (not run: the checks' {verification.timeout_seconds} s were spent)")
            return False
        exe = argv[0]
        if shutil.which(exe, path=env.get("PATH")) is None and not Path(wt, exe).is_file():
            chunks.append(f"$ {' '.join(argv)}\n{exe}: command not found")
            return False
        done = await run_command(argv, cwd=wt, env=env, timeout=left, mark=mark)
        status = "timed out" if done.timed_out else f"exit {done.returncode}"
        chunks.append(f"$ {' '.join(argv)}  ({status})\n{done.output.strip()}")
        if done.timed_out or done.returncode != 0:
            return False
    return True


async def cleanup_stale_worktrees(project_root: str, current_session: str) -> list[str]:
    """Remove clean worktrees of other (finished) sprints whose branch is merged; failed stories' stay."""
    removed: list[str] = []
    root = Path(project_root, SESSION_DIR, WORKTREES_DIR)
    if not root.is_dir():
        return removed
    current = safe_name(current_session)
    for session_dir in root.iterdir():
        if not session_dir.is_dir() or session_dir.name == current:
            continue
        for wt in session_dir.iterdir():
            if not (wt / ".git").exists():
                continue
            # Its commit, not its branch's name: a detached worktree's was `HEAD`, the project's own, always merged,
            # and its commits were removed with it.
            commit = (await git(str(wt), "rev-parse", "--verify", "--quiet", "HEAD", check=False)).strip()
            merged = await run_command(
                git_argv(project_root, "merge-base", "--is-ancestor", commit, "HEAD"), cwd=project_root
            )
            dirty = (await git(str(wt), "status", "--porcelain", check=False)).strip()
            if commit and merged.returncode == 0 and not dirty:
                await git(project_root, "worktree", "remove", "--force", str(wt), check=False)
                removed.append(str(wt))
    await git(project_root, "worktree", "prune", check=False)
    return removed


def _git_settings(project_root: str) -> GitSettings:
    from activities.agent_config import load_agents_file

    return load_agents_file(project_root).git


def _title(inp: FinishStoryInput) -> str:
    """The story file's title as it is now (the story-creator may have named it), else the planned one."""
    if inp.story_path:
        try:
            path = Path(resolve_inside(inp.project_root, inp.story_path))
        except ValueError:
            return inp.story_title
        if path.is_file():
            return parse_story_file(path.read_text(encoding="utf-8", errors="replace")).title or inp.story_title
    return inp.story_title


def _merged_record(project_root: str, session_id: str, story_key: str) -> Path:
    return session_path(project_root, "git", "merged", safe_name(session_id), f"{story_key}.json")


async def clear_story_track(project_root: str, session_id: str, story_key: str, branch: str) -> list[str]:
    """auto_clear_git_track (the Slave's Track Cleanup): a merged story's worktree, its branch and its
    scratch files under `.sprint-session/` (the last verification output; the process files of its
    dispatches: pid, exit, raw result) go. Transcripts (prompt, command, stdout/stderr, the checked
    AGENT_COMPLETE) and the pre-squash originals (refs/bso-originals) stay. What was removed."""
    removed: list[str] = []
    path = worktree_path(project_root, session_id, story_key)
    if (path / ".git").exists():
        await git(project_root, "worktree", "remove", "--force", str(path), check=False)
        removed.append(os.path.relpath(path, project_root))
    await git(project_root, "worktree", "prune", check=False)
    if (await git(project_root, "branch", "--list", branch)).strip():
        await git(project_root, "branch", "-D", branch)  # merged: its commits are reachable from HEAD
        removed.append(f"branch {branch}")
    scratch = session_path(project_root, "agents", "stories", story_key)
    if scratch.is_dir():
        shutil.rmtree(scratch)
        removed.append(os.path.relpath(scratch, project_root))
    agents = Path(project_root, SESSION_DIR, "agents")
    for command_file in sorted(agents.glob("*/command.json")) if agents.is_dir() else []:
        try:
            env = json.loads(command_file.read_text(encoding="utf-8")).get("env", {})
        except ValueError:
            continue
        if env.get("BSO_STORY_KEY") != story_key:
            continue
        for name in ("pid.json", "exit.json", "result.json"):
            target = command_file.with_name(name)
            if target.exists():
                target.unlink()
                removed.append(os.path.relpath(target, project_root))
    return removed


@activity.defn
async def finish_story_git(inp: FinishStoryInput) -> FinishStoryResult:
    """The story is done: squash its commits into `feat: Story N.M: <title>` (P28) and merge the branch
    into the project's checked-out branch (ff or merge commit), then clear its track (auto_clear_git_track).
    Idempotent (a merge is recorded before the track is cleared; a retry after a failure at any step finishes
    the squash and the merge); on conflict nothing changes (the original commits stay) and the worktree is kept."""
    try:  # the key names paths and a branch: checked before anything uses it
        story_branch(inp.session_id, inp.story_key)
    except GitRuleError as err:
        raise ApplicationError(str(err), type="AgentConfigError", non_retryable=True) from None
    async with heartbeating(lambda: f"squash and merge {inp.story_key}", FINISH_GIT_HEARTBEAT / 6):
        # A cancel (it now arrives with a heartbeat) must not kill git in the middle of a merge into the user's
        # checkout (a half-written tree, index.lock left): the merge ends, then the cancel is taken.
        work = asyncio.ensure_future(_finish_story_git(inp))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            await work
            raise


# The Slave's heartbeat timeout for finish_story_git: a worker killed mid-merge is noticed within it, and another
# worker retries the (idempotent) merge then, not at the 10-minute start-to-close timeout.
FINISH_GIT_HEARTBEAT = 30


async def _finish_story_git(inp: FinishStoryInput) -> FinishStoryResult:
    record = _merged_record(inp.project_root, inp.session_id, inp.story_key)
    branch = story_branch(inp.session_id, inp.story_key)
    async with repo_lock(inp.project_root):
        path = worktree_path(inp.project_root, inp.session_id, inp.story_key)
        if (path / ".git").exists():  # a git killed in the middle of a commit there left its locks: none holds them
            await remove_stale_locks(Worktree(str(path), branch, base=""), inp.project_root)
        # Under the lock: another call for the story (an attempt left running by a Slave that ended, the Master
        # finishing its merge) may have merged it and cleared its branch meanwhile.
        if record.exists() and await _merge_recorded_holds(inp):
            # Merged before: by an attempt that stopped before its track was cleared, or in an earlier run of
            # a reused sprint id (this run added nothing). Its track is cleared as after the merge itself.
            result = FinishStoryResult.model_validate(json.loads(record.read_text(encoding="utf-8")))
        else:
            result = await _squash_and_merge(inp)
            if not result.merged:
                return result
            write_json_atomic(record, result.model_dump(mode="json"))
        if inp.clear_track:
            cleared = await clear_story_track(inp.project_root, inp.session_id, inp.story_key, branch)
            activity.logger.info("track of %s cleared: %s", inp.story_key, ", ".join(cleared) or "nothing left")
        elif (tip := await _commit_of(inp.project_root, f"refs/heads/{branch}")) is not None:
            # The kept branch is merged up to here: the story run again on it (a reused sprint id) squashes
            # and merges only what it adds, not this work a second time (a conflict with itself).
            on = story_based_on(inp.project_root, inp.session_id, inp.story_key)
            write_json_atomic(_story_base_record(inp.project_root, inp.session_id, inp.story_key),
                              {"story": inp.story_key, "base": tip, **({"branch": on} if on else {})})
    return result


async def _merge_recorded_holds(inp: FinishStoryInput) -> bool:
    """The story's recorded merge still covers its branch: the branch is gone (its track cleared) or merged.
    A branch with work the merge did not take is the story run again (a sprint id reused after a failed or
    terminated run, the story set back by hand): that work is merged, not answered by the old record."""
    tip = await _commit_of(inp.project_root, f"refs/heads/{story_branch(inp.session_id, inp.story_key)}")
    return tip is None or await _is_ancestor(inp.project_root, tip, "HEAD")


async def _commit_of(cwd: str, rev: str) -> str | None:
    return (await git(cwd, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)).strip() or None


async def _is_ancestor(root: str, commit: str, of: str) -> bool:
    done = await run_command(git_argv(root, "merge-base", "--is-ancestor", commit, of), cwd=root)
    return done.returncode == 0


async def _same_tree(root: str, a: str, b: str) -> bool:
    trees = (await git(root, "rev-parse", f"{a}^{{tree}}", f"{b}^{{tree}}")).split()
    return len(trees) == 2 and trees[0] == trees[1]


async def _recover_reset_branch(root: str, worktree: Path, branch: str, base: str, originals: str | None) -> bool:
    """A worker before the squash by commit-tree squashed with `reset --soft <base>` then `commit`; stopped
    between the two, it left the branch at the base with the story's tree staged in its worktree, the work
    only under refs/bso-originals. Put the branch back on the originals (the staged tree is theirs, so the
    worktree stays clean). Whether it did."""
    if originals is None or not (worktree / ".git").exists():
        return False
    staged_is_originals = await run_command(
        git_argv(str(worktree), "diff", "--cached", "--quiet", originals), cwd=str(worktree)
    )
    if staged_is_originals.returncode != 0:
        return False
    await git(root, "update-ref", f"refs/heads/{branch}", originals, base)
    return True


# A git operation of the user's under way in the project's checkout: a merge into it would mix with theirs, and
# BSO's `merge --abort` after a failed merge would throw away their resolution.
_OPERATIONS_UNDER_WAY = (
    ("MERGE_HEAD", "a merge"),
    ("CHERRY_PICK_HEAD", "a cherry-pick"),
    ("REVERT_HEAD", "a revert"),
    ("rebase-merge", "a rebase"),
    ("rebase-apply", "a rebase (or git am)"),
)


async def _checkout_unfit_for_merge(root: str, based_on: str | None = None) -> str | None:
    """Why the project's checkout cannot take a story's work now, if it cannot: a detached HEAD (the merge
    would land on no branch, and the story's branch then be cleared), another branch than the one the story's
    branch was made from (`based_on`, recorded: the merge pulled that branch's commits into the one the user
    switched to, and the story never reached its own) or an operation of the user's under way.
    The story's branch and worktree stay; the user merges it once the checkout is back on a branch."""
    on = (await git(root, "symbolic-ref", "-q", "HEAD", check=False)).strip()
    if not on:
        return "the project's HEAD is detached (check out the branch the story's work should go to)"
    # (Only while the story's branch of origin is there: renamed, `master` -> `main`, or deleted, the user has
    # nothing to check out again, and the story goes where the checkout is.)
    if based_on and on != based_on and await _commit_of(root, based_on) is not None:
        return (f"the project's checkout is on branch {on.removeprefix('refs/heads/')}, the story's branch was made "
                f"from {based_on.removeprefix('refs/heads/')} (check that branch out again, or merge the story's "
                "branch by hand where it should go)")
    git_dir = Path(root, (await git(root, "rev-parse", "--git-dir")).strip())
    for marker, operation in _OPERATIONS_UNDER_WAY:
        if (git_dir / marker).exists():
            return f"the project's checkout is in the middle of {operation} (finish or abort it first)"
    return None


# A user's own git (an IDE's `git status`) holds the checkout's index.lock for a moment: BSO's merge waits it out.
INDEX_LOCK_PATIENCE_SECONDS = 10.0


async def _past_index_lock(root: str, *args: str) -> Finished:
    """`git <args>` in the user's checkout, run again while another git holds its index.lock (up to
    INDEX_LOCK_PATIENCE_SECONDS). Refused for the lock, the ff merge fell through to a merge commit that stopped
    half-way ("fix conflicts" where there were none) and the abort failed on the same lock: MERGE_HEAD stayed,
    and every later story said the checkout was in the middle of a merge."""
    waited, removed = 0.0, False
    while True:
        done = await run_command(git_argv(root, *args), cwd=root)
        if done.returncode == 0 or "index.lock" not in done.output:
            return done
        if waited >= INDEX_LOCK_PATIENCE_SECONDS:
            if removed or not await _remove_stale_index_lock(root):
                return done
            waited, removed = 0.0, True  # (once: a new lock of another git is waited out, then said)
        await asyncio.sleep(0.25)
        waited += 0.25


async def _remove_stale_index_lock(root: str) -> bool:
    """The user's checkout's index.lock when no git holds it: a git killed with SIGKILL left it (a container
    stopped, the worker killed with its children in the middle of the merge), and every merge after it failed,
    the user's own git too. Only once no git works in the checkout or holds the lock (procfs; without it, left)."""
    lock = (await git_dir(root)) / "index.lock"
    users = processes_using([Path(root), await _common_dir(root)], lock, named="git")
    if users is None or users or not lock.exists():
        return False
    _remove_killed_gits_lock(lock)
    return True


# In the user's checkout's own git folder (a linked worktree's, for a checkout that is one), while a finish runs its
# merge there: {story branch: the tip it merges}. Written right before the merge command(s), removed once the merge
# (or its abort) has ended: left only by an attempt that stopped in between (a kill), it is what tells the retry
# that the story's files in the checkout may be that merge's leftovers, never a file of the user's.
MERGE_BEGUN_MARKER = "bso-merge-in-progress"


def _merges_begun(folder: Path) -> dict[str, str]:
    try:
        begun = json.loads((folder / MERGE_BEGUN_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(begun, dict):
        return {}
    return {k: v for k, v in begun.items() if isinstance(k, str) and isinstance(v, str)}


def _mark_merge_begun(folder: Path, branch: str, tip: str) -> None:
    write_json_atomic(folder / MERGE_BEGUN_MARKER, {**_merges_begun(folder), branch: tip})


def _mark_merge_ended(folder: Path, branch: str) -> None:
    begun = _merges_begun(folder)
    if branch not in begun:
        return
    del begun[branch]
    if begun:  # another story's merge a kill cut short: its retry still undoes it
        write_json_atomic(folder / MERGE_BEGUN_MARKER, begun)
    else:
        (folder / MERGE_BEGUN_MARKER).unlink(missing_ok=True)


async def _undo_killed_merge(root: str, folder: Path, branch: str, tip: str, merge_message: str) -> str | None:
    """This story's merge into the user's checkout (its git folder `folder`), cut short by a kill in an earlier
    attempt, is undone, so that the merge runs again as if it had never begun (what was undone is said; None:
    nothing). Only when an earlier attempt is known to have begun this merge (MERGE_BEGUN_MARKER names the branch
    at this tip): else a file of the user's holding the story's bytes would pass for the merge's leftover. Stopped on
    its conflict before its `git merge --abort` (MERGE_HEAD the branch's tip, MERGE_MSG BSO's message): aborted,
    and the conflict is reported as the attempt would have; not when anything else is staged (the abort resets the
    whole index: a file the user added since would go). Killed while git wrote the result (no MERGE_HEAD: a
    fast-forward's files written and not its index, a merge commit's index and files not committed): the paths the
    merge changes go back to HEAD's, the files it made removed; they blocked the same merge run again ("would be
    overwritten by merge") and stayed in the checkout as if the user's work. Only when the paths the merge
    changes are exactly as the merge leaves them (bso.git_rules.merge_leftovers): anything else there, the
    user's work, stays, and the merge is refused as before. Other paths are never touched. Never in a sparse
    checkout (a path outside it is not on disk, and cannot be checked out)."""
    if _merges_begun(folder).get(branch) != tip:
        return None
    if not (await git(root, "symbolic-ref", "-q", "HEAD", check=False)).strip():
        return None  # BSO merges into no detached HEAD
    if (await git(root, "config", "--bool", "core.sparseCheckout", check=False)).strip() == "true":
        return None
    stopped = (folder / "MERGE_HEAD").exists()
    if stopped:
        try:
            merge_head = (folder / "MERGE_HEAD").read_text(encoding="ascii", errors="replace").split()
            merge_msg = (folder / "MERGE_MSG").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
        if merge_head != [tip] or not is_bsos_merge_message(merge_msg, merge_message):
            return None  # the user's merge (or another story's): refused as a merge under way
    elif any((folder / marker).exists() for marker, _ in _OPERATIONS_UNDER_WAY) or (folder / "SQUASH_MSG").exists():
        return None  # an operation of the user's (a `git merge --squash` of theirs leaves SQUASH_MSG)
    paths = await _merge_paths_in_checkout(root, branch)
    if paths is None or merge_leftovers(paths, stopped=stopped) != MERGE_LEFT_ITS_OWN:
        return None
    for batch in _batches(list(paths)):  # a path git keeps off the disk (skip-worktree) cannot be checked out
        listed = await _git_bytes(root, "--literal-pathspecs", "ls-files", "-t", "-z", "--", *batch)
        if any(entry.startswith(b"S ") for entry in listed.split(b"\x00")):
            return None
    if stopped:
        staged = await _git_bytes(root, "diff-index", "--cached", "--name-only", "-z", "--no-renames", "HEAD")
        if any(os.fsdecode(name) not in paths for name in staged.split(b"\x00") if name):
            return None  # staged since, outside the merge: `merge --abort` would throw it away
        _must(await _past_index_lock(root, "merge", "--abort"))
        return "its merge stopped on a conflict and left in the checkout by a killed attempt was aborted"
    staged = [p for p, state in paths.items() if sorted(state.index) != sorted(in_index(state.head))]
    for batch in _batches(staged):
        _must(await _past_index_lock(root, "--literal-pathspecs", "reset", "-q", "--", *batch))
    written = [p for p, state in paths.items() if state.disk != on_disk(state.head)]
    for batch in _batches([p for p in written if paths[p].head is not None]):
        _must(await _past_index_lock(root, "--literal-pathspecs", "checkout", "-q", "--", *batch))
    for path in (p for p in written if paths[p].head is None):
        target = Path(root, path)
        if os.path.lexists(target):
            target.unlink()
            _remove_emptied_folders(root, target.parent)
    return (f"its merge cut short by a killed attempt ({len(paths)} path(s) as the merge leaves them, "
            f"{len(staged)} staged) was undone in the checkout")


def _must(done: Finished) -> None:
    if done.returncode != 0:
        raise GitError(f"git failed ({done.returncode}): {done.output.strip()[-800:]}", done.output)


def _remove_emptied_folders(root: str, folder: Path) -> None:
    """The folders a merge made for its files, emptied: up to the checkout's own, never past a folder not empty."""
    top = Path(root).resolve()
    while folder.resolve() != top and is_inside(str(top), str(folder.resolve())):
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


async def _merge_paths_in_checkout(root: str, branch: str) -> dict[str, MergedPath] | None:
    """Each path the merge of `branch` into HEAD changes, as HEAD, the merge (`git merge-tree --write-tree`, git
    2.38 or later; labelled as `git merge` labels its conflicts) and the checkout have it. None: not known (an
    older git, a name git gave twice)."""
    try:
        merged = (await _git_bytes(root, "merge-tree", "-z", "--write-tree", "HEAD", branch, ok=(0, 1))).split(b"\x00")
        result_tree = merged[0].decode("ascii").strip()
        merge_index = _staged_entries(itertools.takewhile(bool, merged[1:]))  # a conflict's stages, up to an empty entry
        changed = await _git_bytes(root, "diff-tree", "-r", "-z", "--name-only", "--no-renames", "HEAD", result_tree)
    except (GitError, UnicodeDecodeError, ValueError):
        return None
    names = list(dict.fromkeys([*(os.fsdecode(n) for n in changed.split(b"\x00") if n), *merge_index]))
    in_head, in_result, in_the_index = {}, {}, {}
    for batch in _batches(names):
        in_head.update(await _tree_entries(root, "HEAD", batch))
        in_result.update(await _tree_entries(root, result_tree, batch))
        listed = await _git_bytes(root, "--literal-pathspecs", "ls-files", "-s", "-z", "--", *batch)
        in_the_index.update(_staged_entries(filter(None, listed.split(b"\x00"))))
    disk = await _on_disk_as_blobs(root, names, like=result_tree)
    return {
        name: MergedPath(
            head=in_head.get(name), result=in_result.get(name),
            merge_index=tuple(merge_index.get(name) or in_index(in_result.get(name))),
            index=tuple(in_the_index.get(name, ())), disk=disk[name],
        )
        for name in names
    }


def _staged_entries(entries: Iterable[bytes]) -> dict[str, list[tuple[str, str, int]]]:
    """`<mode> <object> <stage>\t<path>` entries (`ls-files -s -z`, `merge-tree -z`'s conflicts): each path's stages."""
    staged: dict[str, list[tuple[str, str, int]]] = {}
    for entry in entries:
        meta, _, name = entry.partition(b"\t")
        mode, oid, stage = meta.decode("ascii").split()
        staged.setdefault(os.fsdecode(name), []).append((mode, oid, int(stage)))
    return staged


async def _tree_entries(root: str, tree: str, names: list[str]) -> dict[str, tuple[str, str]]:
    """(mode, object id) of each of these paths in `tree` that it holds."""
    listed = await _git_bytes(root, "--literal-pathspecs", "ls-tree", "-r", "-z", "--full-tree", tree, "--", *names)
    entries = {}
    for entry in filter(None, listed.split(b"\x00")):
        meta, _, name = entry.partition(b"\t")
        mode, _kind, oid = meta.decode("ascii").split()
        entries[os.fsdecode(name)] = (mode, oid)
    return entries


async def _on_disk_as_blobs(root: str, names: list[str], like: str) -> dict[str, tuple[bool, str] | None | str]:
    """Each of the checkout's files at these paths as git would store it: (a symlink?, its blob id); None: not
    there; "other": a folder, or a file git could not hash (a clean filter that failed)."""
    found: dict[str, tuple[bool, str] | None | str] = {}
    files = []
    for name in names:
        target = os.path.join(root, name)
        if os.path.islink(target):
            found[name] = (True, _link_blob(os.readlink(os.fsencode(target)), like))
        elif not os.path.lexists(target):
            found[name] = None
        elif os.path.isfile(target):
            files.append(name)
        else:
            found[name] = "other"
    for batch in _batches(files):
        try:
            hashed = await _hashes_on_disk(root, batch)
        except GitError:
            hashed = []
        if len(hashed) != len(batch):  # nothing to pair them by
            found.update(dict.fromkeys(batch, "other"))
        else:
            found.update((name, (False, blob)) for name, blob in zip(batch, hashed))
    return found


async def _squash_and_merge(inp: FinishStoryInput) -> FinishStoryResult:
    """Safe to retry after a failure at any step: the squash commit is built aside (commit-tree) and the
    branch moves to it in one ref update, so the branch always holds the story's whole work."""
    settings = _git_settings(inp.project_root)
    path = worktree_path(inp.project_root, inp.session_id, inp.story_key)
    try:
        branch = story_branch(inp.session_id, inp.story_key)
        saved_originals = originals_ref(inp.session_id, inp.story_key)
    except GitRuleError as err:
        raise ApplicationError(str(err), type="AgentConfigError", non_retryable=True) from None
    root = inp.project_root
    tip = await _commit_of(root, f"refs/heads/{branch}")
    if tip is None:
        return FinishStoryResult(story_key=inp.story_key, merged=False, note=NOTHING_TO_MERGE[0])
    base = await story_base(root, inp.session_id, inp.story_key)
    originals = await _commit_of(root, saved_originals)
    if tip == base and await _recover_reset_branch(root, path, branch, base, originals):
        activity.logger.info("%s: an interrupted squash left %s at the base; restored from %s",
                             inp.story_key, branch, saved_originals)
        tip = originals
    # An earlier attempt squashed, then failed before (or while) merging: the originals are what a conflict
    # restores, and the result still says squashed.
    squashed_before = bool(
        originals and originals != tip and await _commit_of(root, f"{tip}^") == base
        and await _same_tree(root, tip, originals)
    )
    # A branch still at the base carries nothing of its own: never "already merged" (it is an ancestor of
    # anything built on the base), which would clear the track of a story whose work never arrived.
    if tip != base and await _is_ancestor(root, tip, "HEAD"):
        _put_back_untracked(root, _untracked_aside(root, inp.session_id, inp.story_key))  # a crash after the merge
        _mark_merge_ended(await git_dir(root), branch)
        return FinishStoryResult(story_key=inp.story_key, merged=True, squashed=squashed_before, commit=tip,
                                 note="already merged")
    count = int((await git(root, "rev-list", "--count", f"{base}..{tip}")).strip() or 0)
    if count == 0:
        return FinishStoryResult(story_key=inp.story_key, merged=False, note=NOTHING_TO_MERGE[1])
    # An agent may have committed a secret itself (the Exit Gate refused the dispatch, a human may still have
    # let the story through): such a branch is never merged into the user's branch.
    # Every commit's files, not the net diff: a secret committed then deleted is still in the branch's history.
    # (Not a deletion: removing a key the project had committed is what it should do.) A merge commit's files:
    # those it holds unlike each of its parents (`--cc`; git shows none for a merge unless asked).
    logged = await git(root, "log", "--name-only", "--cc", "-z", "--format=", "--no-renames", "--diff-filter=d",
                       f"{base}..{tip}")
    changed = dict.fromkeys(p for p in logged.split("\x00") if p)  # once each, in order (a name may end in "\n")
    keys_committed = await _keys_committed(root, f"{base}..{tip}")
    secrets = [p for p in changed if is_secret_path(p, settings.secret_patterns) or p in keys_committed]
    if secrets:
        return FinishStoryResult(
            story_key=inp.story_key, merged=False,
            note=f"the story's commits carry secret-looking files ({', '.join(secrets[:10])}); "
                 "worktree kept",
        )
    message = squash_message(settings.squash_message, story_key=inp.story_key, title=_title(inp))
    folder = await git_dir(root)
    if (undone := await _undo_killed_merge(root, folder, branch, tip, f"Merge {message}")) is not None:
        activity.logger.info("%s: %s", inp.story_key, undone)
    based_on = story_based_on(root, inp.session_id, inp.story_key)
    if (unfit := await _checkout_unfit_for_merge(root, based_on)) is not None:
        return FinishStoryResult(story_key=inp.story_key, merged=False, note=f"{unfit}; worktree kept")
    squashed = squashed_before
    restore_on_conflict = originals if squashed_before else tip
    identity = await identity_args(root)
    if inp.squash:
        subject = (await git(root, "log", "-1", "--format=%s", tip)).strip()
        if count > 1 or subject != message:
            await git(root, "update-ref", saved_originals, tip)
            squash_commit = (await git(
                root, *identity, "commit-tree", f"{tip}^{{tree}}", "-p", base, "-m", message
            )).strip().splitlines()[-1]
            # The branch moves only from the tip we read; its worktree's index already holds this tree.
            await git(root, "update-ref", f"refs/heads/{branch}", squash_commit, tip)
            squashed, restore_on_conflict = True, tip
    new_tip = (await git(root, "rev-parse", branch)).strip()
    aside = _untracked_aside(root, inp.session_id, inp.story_key)
    await _set_aside_files_the_story_untracked(root, path, base, new_tip, aside)
    merged_ff = False
    _mark_merge_begun(folder, branch, new_tip)  # (a kill from here on: the retry may undo what the merge left)
    if settings.merge == "ff":
        ff = await _past_index_lock(root, "merge", "--ff-only", "-q", branch)
        merged_ff = ff.returncode == 0
    if not merged_ff:  # `merge`, or histories diverged (another story merged first): a merge commit
        merge = await _past_index_lock(
            root, *identity, "merge", "--no-ff", "--no-verify", "-q", "-m", f"Merge {message}", branch
        )
        if merge.returncode != 0:
            aborted = (await _past_index_lock(root, "merge", "--abort")).returncode == 0
            left = not aborted and (folder / "MERGE_HEAD").exists()  # the abort failed: git's words hold
            _mark_merge_ended(folder, branch)
            _put_back_untracked(root, aside)  # (still in the checkout: the copies set aside go)
            if squashed:  # the original commits stay (P28)
                await git(root, "update-ref", f"refs/heads/{branch}", restore_on_conflict, new_tip)
            return FinishStoryResult(
                story_key=inp.story_key,
                merged=False,
                note=f"merge of {branch} failed; worktree kept: {_merge_failure_said(merge.output, branch, aborted, left)}",
            )
    _mark_merge_ended(folder, branch)
    merged_head = (await head(root)).strip()
    kept = [os.fsencode(n).decode(errors="replace") for n in _put_back_untracked(root, aside)]  # said: valid text
    if kept:
        activity.logger.info("%s untracked %s, kept on disk: put back in the checkout after the merge",
                             inp.story_key, ", ".join(kept))
    return FinishStoryResult(
        story_key=inp.story_key, merged=True, squashed=squashed, commit=merged_head or new_tip,
        note=f"{branch} merged" + (" (squashed)" if squashed else "")
        + (f"; untracked by the story, kept on disk: {', '.join(kept[:10])}" if kept else ""),
    )


def _merge_failure_said(output: str, branch: str, aborted: bool, left: bool) -> str:
    """git's words on a story's failed merge, and what is left to do: not git's own advice to fix the conflicts
    and commit (BSO aborted that merge: the checkout holds no conflict), but the merge to make by hand. `left`:
    the abort failed, the merge is still under way in the checkout (git's words hold)."""
    if left:
        return output.strip()[-500:]
    said = "\n".join(line for line in output.strip().splitlines() if not line.startswith("Automatic merge failed"))
    state = ("the merge was undone (git merge --abort): the checkout is as it was, with no conflict to fix"
             if aborted else "the merge was not made: the checkout is as it was")
    return f"{said.strip()[-500:]} ({state}; to bring the story's work in by hand: git merge {branch})"


async def checkout_work_since(root: str, since: float, bsos_own: list[str]) -> str | None:
    """What else happened in the user's checkout since `since` (a Unix time), said (bso.git_rules.
    work_outside_worktree): its branch moved other than by BSO's merges, files changed and not committed
    (but `bsos_own`: paths, or folders ending in `/`, BSO writes there itself). None: nothing did."""
    ref = (await git(root, "symbolic-ref", "-q", "HEAD", check=False)).strip()
    reflog = await git(root, "reflog", "show", "-n", "200", "--date=unix", f"--format={REFLOG_FORMAT}", ref or "HEAD",
                       "--", check=False)
    status = await git(root, "status", "--porcelain=v1", "-z", check=False)

    def changed_since(path: str) -> bool:
        try:
            return os.lstat(os.path.join(root, path)).st_mtime >= since
        except OSError:
            return False  # deleted: when is not known (the user's own deletion may be older)

    files = [
        p for p in parse_porcelain(status)
        if not any(p == own or (own.endswith("/") and p.startswith(own)) for own in bsos_own) and changed_since(p)
    ]
    return work_outside_worktree(ref.removeprefix("refs/heads/") or "HEAD", checkout_moves(reflog, int(since)), files)  # whole seconds


def _untracked_aside(root: str, session_id: str, story_key: str) -> Path:
    return session_path(root, "git", "untracked", safe_name(session_id), story_key)


async def _set_aside_files_the_story_untracked(root: str, worktree: Path, base: str, tip: str, aside: Path) -> None:
    """The files the story's commits remove that its worktree still holds on disk (`git rm --cached key.pem`,
    then .gitignore): the agent took them out of the repository, not off the disk, and the merge would delete
    the checkout's copies. Each is linked (else copied) into `aside` before the merge, to be put back after it.
    (A file removed from the disk too, `git rm`, goes from the checkout as well.)"""
    if not (worktree / ".git").exists():
        return
    # Names as bytes (git() decodes with errors="replace": a non-UTF-8 name would match no file, and go).
    removed = await _git_bytes(root, "diff", "--name-only", "-z", "--no-renames", "--diff-filter=D", base, tip)
    for name in filter(None, (os.fsdecode(n) for n in removed.split(b"\x00"))):
        kept, ours = worktree / name, Path(root, name)
        if not (kept.is_file() and not kept.is_symlink() and ours.is_file() and not ours.is_symlink()):
            continue
        copy = aside / name
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.unlink(missing_ok=True)
        try:
            os.link(ours, copy)  # the same bytes and mode, at no cost: git's merge unlinks the checkout's name
        except OSError:
            shutil.copy2(ours, copy)


def _put_back_untracked(root: str, aside: Path) -> list[str]:
    """The files set aside before the merge that it deleted from the checkout go back there; the others' copies
    go. Which were put back."""
    if not aside.is_dir():
        return []
    put_back = []
    for copy in sorted(p for p in aside.rglob("*") if p.is_file()):
        name = copy.relative_to(aside).as_posix()
        target = Path(root, name)
        if os.path.lexists(target):  # the merge did not take it (it failed), or it is there again
            copy.unlink()
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(copy, target)
        put_back.append(name)
    shutil.rmtree(aside, ignore_errors=True)
    return put_back
