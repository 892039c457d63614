"""The command backend through the real activity code, with a real fake agent CLI in a real git repo."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

import activities.git_ops as git_ops
import activities.process as process
from activities.backends import command
from activities.git_ops import ensure_worktree, finish_story_git, worktree_path
from activities.process import Finished, machine_id, run_command
from bso.dispatch import VERIFICATION_FAILED
from bso.agent_profiles import GitSettings
from bso.git_rules import FinishStoryInput, FinishStoryResult, MergeOutcome, checkout_moves, work_outside_worktree
from bso.messages import AgentComplete, TaskAssignment
from bso.states import AgentMode, AgentStatus, AgentType, Severity
from tests.fake_agent.project import STORY, git, make_git_project
from tests.workflow.helpers import poll_until

STORY_PATH = f"_bmad-output/implementation-artifacts/{STORY}.md"
STORY_TEXT = (
    "# Story 1.1: Hello world\n\nStatus: ready-for-dev\n\nFile scope: src/**, tests/**\n\n"
    "## Acceptance Criteria\n\n1. greet() says hello\n2. tests cover it\n"
)


def assignment(root: Path, n: int = 1, agent: AgentType = AgentType.DEV_RUNNER, mode: AgentMode = AgentMode.DEV,
               **kw) -> TaskAssignment:
    return TaskAssignment(
        dispatch_id=f"s1/batch-1/1-1/{n}", agent_type=agent, mode=mode, story_key=STORY, story_path=STORY_PATH,
        session_id="s1", batch_id=1, report_to="s1/batch-1", project_root=str(root), backend="command", **kw,
    )


def dev_project(tmp_path: Path, agents_toml: str = "", **env: str) -> Path:
    root = make_git_project(tmp_path / "proj", agents_toml=agents_toml, FAKE_AGENT_LEDGER=str(tmp_path / "ledger.jsonl"), **env)
    (root / STORY_PATH).write_text(STORY_TEXT)
    return root


async def dev_gate(wt: git_ops.Worktree, n: int = 1) -> git_ops.GateResult:
    """The Git Exit Gate over what the `n`th dev-runner of STORY left in `wt` since the worktree was made."""
    return await git_ops.exit_gate(wt.path, GitSettings(), since=wt.base, agent_type="dev-runner", story_key=STORY,
                                   dispatch_id=f"s1/batch-1/1-1/{n}")


def runs(tmp_path: Path) -> list[dict]:
    path = tmp_path / "ledger.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its reaper is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


async def gone(*pids: int, seconds: float = 5.0) -> bool:
    """Wait until none of `pids` is alive (a killed group takes a moment); whether they are all gone."""
    for _ in range(int(seconds * 10)):
        if not any(alive(p) for p in pids):
            return True
        await asyncio.sleep(0.1)
    return not any(alive(p) for p in pids)


async def test_dev_dispatch_commits_verifies_and_records(tmp_path: Path) -> None:
    root = dev_project(tmp_path)
    a = assignment(root)
    done = await ActivityEnvironment().run(command.run, a)
    assert done.status is AgentStatus.SUCCESS, done.error
    assert done.tokens_used == 1000 + 200 + 500  # cache reads weighted 0.1
    wt = worktree_path(str(root), "s1", STORY)
    log = git(wt, "log", "--format=%s", "main..HEAD").splitlines()
    assert log == [f"bso(dev-runner): {STORY}: src/story_1_1_hello_world_extra.py", f"implement {STORY}"]
    assert git(wt, "status", "--porcelain") == ""
    assert git(root, "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
    assert f"bso/s1/{STORY}" in git(root, "branch", "--list")
    run_dir = command.run_dir_for(str(root), a.dispatch_id)
    prompt = (run_dir / "prompt.md").read_text()
    assert "greet() says hello" in prompt and "BSO_RESULT_FILE" in prompt and "src/**" in prompt
    assert "sha256:" in done.summary and "stdout.log" in done.summary
    assert not done.findings

    # A retry (the worker died after the agent finished and committed) reports, never reruns.
    again = await ActivityEnvironment().run(command.run, a)
    assert again == done
    assert len(runs(tmp_path)) == 1

    # The worker died after the agent exited but before BSO finished checking its work (no marker yet):
    # the retry checks the work again and still never reruns the agent.
    marker = Path(git(wt, "rev-parse", "--absolute-git-dir").strip(), "bso-dispatches")
    for path in marker.iterdir():
        path.unlink()
    assert (run_dir / "exit.json").exists()
    checked_again = await ActivityEnvironment().run(command.run, a)
    assert checked_again.status is AgentStatus.SUCCESS and checked_again.tokens_used == done.tokens_used
    assert len(runs(tmp_path)) == 1
    # Another run of a workflow with the same id (a session id used again) is a new dispatch: the agent runs,
    # whatever the first run's marker and exit.json say.
    assert list(marker.iterdir()) and (run_dir / "exit.json").exists()
    other = ActivityEnvironment()
    other.info = dataclasses.replace(other.info, workflow_run_id="another-run")
    await other.run(command.run, a)
    assert len(runs(tmp_path)) == 2


async def test_a_cli_reporting_implausible_tokens_has_its_work_kept_and_the_count_not_counted(tmp_path: Path) -> None:
    """10^30 output tokens in the CLI's usage: the Slave would refuse such an answer and wait out the agent's time,
    so the backend reports the work with no tokens and a finding saying why."""
    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="garbled-usage")
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.SUCCESS and done.tokens_used == 0, done
    (finding,) = done.findings  # the count as the cache weights made it (a float's digits past the 17th)
    assert re.fullmatch(r"the agent reported 1\d{30} tokens, more than any run uses: not counted", finding.summary)


async def test_the_uncounted_tokens_finding_survives_an_answer_full_of_findings(tmp_path: Path) -> None:
    """An answer keeps its first 200 findings: BSO's note that the tokens were not counted comes first, where it
    came after the agent's 200 and was cut."""
    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="garbled-usage,many-findings")
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.SUCCESS and done.tokens_used == 0, done
    assert len(done.findings) == 200 and done.findings[0].summary.endswith("not counted"), done.findings[:2]


async def test_an_answer_of_megabytes_goes_into_history_fitted_and_stays_whole_on_disk(tmp_path: Path) -> None:
    """A review of 200 long findings with 7,000-character paths (1.8 MB): the agent activity returns it fitted
    (bso.answer_size), the most severe findings and a note naming the file that holds the whole answer. Every
    review round of a fix loop put the whole answer in the batch's history, and each fix's input its findings
    again: a few rounds took the batch past Temporal's history limit."""
    from activities.agents import run_agent
    from activities.session_files import dispatch_answer_path
    from bso.answer_size import MAX_ANSWER_HISTORY_BYTES
    from bso.messages import AgentComplete

    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="huge-findings")
    a = assignment(root, agent=AgentType.REVIEW_RUNNER, mode=AgentMode.REVIEW, answer_in_result=True)
    receipt = await ActivityEnvironment().run(run_agent, a)
    assert len(json.dumps(receipt.model_dump(mode="json"))) <= MAX_ANSWER_HISTORY_BYTES + 500
    answer = AgentComplete.model_validate(receipt.answer)
    whole = json.loads(dispatch_answer_path(str(root), a.dispatch_id).read_text())["answer"]
    assert len(whole["findings"]) == 200 and len(json.dumps(whole)) > 1_500_000
    *kept, note = answer.findings
    assert [f.summary for f in kept] == [f["summary"] for f in whole["findings"][: len(kept)]]
    assert note.summary.endswith(f"the whole answer: {dispatch_answer_path(str(root), a.dispatch_id)}")


PRIVATE_KEY = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nkey-body-with-é-and-more-secret\n-----END PRIVATE KEY-----"


@pytest.mark.parametrize("secret", ["tok-very-secret-123", PRIVATE_KEY], ids=["one-line", "several-lines"])
async def test_secrets_are_redacted_from_files_on_disk_and_the_answer(tmp_path: Path, secret: str) -> None:
    """The agent prints the secret on stdout (as it is, and JSON-escaped as a CLI printing JSON lines writes
    it) and stderr, and puts it in its summary and a finding. A value of several lines, or written
    JSON-escaped, was redacted nowhere: it reached the transcripts, the answer in history and the heartbeats."""
    root = dev_project(tmp_path, MY_API_TOKEN=secret, FAKE_AGENT_BEHAVIOR="echo-secret")
    a = assignment(root)
    done = await ActivityEnvironment().run(command.run, a)
    run_dir = command.run_dir_for(str(root), a.dispatch_id)
    assert "using token ***" in (run_dir / "stdout.log").read_text()
    secret_parts = [secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1], *secret.splitlines()[1:3]]
    answer = done.model_dump_json()  # what goes into workflow history
    for text, where in [*((p.read_text(), p) for p in run_dir.iterdir()), (answer, "the answer")]:
        for part in secret_parts:
            assert part not in text, where
    assert "done with token ***" in done.summary
    assert any("token *** is hard-coded" in f.summary for f in done.findings)
    assert json.loads((run_dir / "command.json").read_text())["env"]["MY_API_TOKEN"] == "***"


async def test_a_secret_that_is_an_everyday_word_leaves_the_agents_prompt_whole(tmp_path: Path) -> None:
    """A password "hello" (or POSTGRES_PASSWORD=postgres) turned the story's paths and text in the prompt into
    `1-1-***-world`: the agent was sent to folders that do not exist."""
    root = dev_project(tmp_path, APP_PASSWORD="hello")
    a = assignment(root)
    done = await ActivityEnvironment().run(command.run, a)
    assert done.status is AgentStatus.SUCCESS, done.error
    prompt = (command.run_dir_for(str(root), a.dispatch_id) / "prompt.md").read_text()
    assert "1-1-hello-world" in prompt and "***" not in prompt


async def test_leaked_env_file_is_refused(tmp_path: Path) -> None:
    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="leak-env")
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.FAILURE
    assert ".env" in done.error and "secret" in done.error
    wt = worktree_path(str(root), "s1", STORY)
    assert ".env" not in git(wt, "log", "--name-only", "--format=", "main..HEAD")


async def test_a_file_named_like_a_pathspec_stages_only_itself(tmp_path: Path) -> None:
    """A file the agent left named `:(top)` made the Exit Gate's `git add -A -- :(top)` stage the whole tree,
    the .env it refused included, on the story branch."""
    root = dev_project(tmp_path)
    wt = await ensure_worktree(str(root), "s1", STORY)
    (Path(wt.path) / ".env").write_text("OPENAI_API_KEY=sk-fake\n")
    (Path(wt.path) / ":(top)").write_text("odd name\n")
    gate = await dev_gate(wt)
    assert gate.refused == [".env"] and gate.committed == [":(top)"]
    assert ".env" not in git(wt.path, "log", "--name-only", "--format=", f"{wt.base}..HEAD").split()


async def test_a_secret_the_agent_staged_stays_out_of_the_gates_commits(tmp_path: Path) -> None:
    """`git add .env` left staged: the gate's first commit took the whole index, and BSO itself put the secret
    in the branch's history, under another file's name."""
    root = dev_project(tmp_path)
    wt = await ensure_worktree(str(root), "s1", STORY)
    (Path(wt.path) / ".env").write_text("OPENAI_API_KEY=sk-fake\n")
    git(wt.path, "add", "-f", ".env")
    (Path(wt.path) / "work.py").write_text("x = 1\n")
    gate = await dev_gate(wt)
    assert gate.refused == [".env"] and gate.committed == ["work.py"]
    assert git(wt.path, "log", "--name-only", "--format=", f"{wt.base}..HEAD").split() == ["work.py"]
    assert git(wt.path, "status", "--porcelain").splitlines() == ["?? .env"]


KEY = ("-----BEGIN OPENSSH PRIVATE KEY-----\n"
       "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n-----END OPENSSH PRIVATE KEY-----\n")


PUTTY_KEY = ("PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: k\nPublic-Lines: 1\n"
             "AAAAC3NzaC1lZDI1NTE5AAAAIOb6r8z9N1o2b3c4d5e6f7g8h9i0j1k2l3m4n5o6p7q8\nPrivate-Lines: 1\n"
             "AAAAIFh4Yw1bYzR0c3VwZXJzZWNyZXRrZXlfbm90X3JlYWxseV9idXRfbG9uZw==\nPrivate-MAC: 0123abcd\n")


@pytest.mark.parametrize("key", [KEY, PUTTY_KEY], ids=["openssh", "putty"])
async def test_a_key_under_a_name_that_does_not_look_secret_is_refused(tmp_path: Path, key: str) -> None:
    """`git mv key.pem deploy.txt`, a key pasted into notes.txt: P21 went by the name alone, and committed both.
    Code that only names a key's first line is committed as any other."""
    root = dev_project(tmp_path)
    wt = await ensure_worktree(str(root), "s1", STORY)
    (Path(wt.path) / "key.pem").write_text(key)
    git(wt.path, "add", "-f", "key.pem")
    git(wt.path, "mv", "key.pem", "deploy.txt")
    (Path(wt.path) / "notes.txt").write_text("the server's key, for later:\n" + key)
    (Path(wt.path) / "parser.py").write_text('MARKER = "-----BEGIN OPENSSH PRIVATE KEY-----"\n')
    (Path(wt.path) / "work.py").write_text("x = 1\n")
    gate = await dev_gate(wt)
    assert gate.refused == ["deploy.txt", "notes.txt"] and gate.committed == ["parser.py", "work.py"], gate
    assert git(wt.path, "log", "--name-only", "--format=", f"{wt.base}..HEAD").split() == ["work.py", "parser.py"]
    assert sorted(git(wt.path, "status", "--porcelain").splitlines()) == ["?? deploy.txt", "?? notes.txt"]


async def test_a_key_the_agent_committed_inside_a_config_file_is_never_merged(tmp_path: Path) -> None:
    """A key in a JSON config's string, committed by the agent itself: refused by the gate, and the story's branch
    (which carries it) is never merged, even if a human lets the story through."""
    root = dev_project(tmp_path)
    base = git(root, "rev-parse", "HEAD").strip()
    wt = await ensure_worktree(str(root), "s1", STORY)
    (Path(wt.path) / "config.json").write_text(json.dumps({"tls": {"key": KEY}}))
    git(wt.path, "add", "config.json")
    git(wt.path, "-c", "user.email=a@b", "-c", "user.name=agent", "commit", "-qm", "config")
    (Path(wt.path) / "config.json").write_text("{}")  # gone from the last commit: still in the branch's history
    gate = await dev_gate(wt)
    assert gate.refused == ["config.json"], gate
    result = await finish(root)
    assert not result.merged and "secret-looking files (config.json)" in result.note, result
    assert git(root, "rev-parse", "HEAD").strip() == base


async def test_a_key_in_a_binary_file_is_refused(tmp_path: Path) -> None:
    """git's search skipped files it takes for binary (a NUL byte): a key packed into one was committed."""
    root = dev_project(tmp_path)
    wt = await ensure_worktree(str(root), "s1", STORY)
    (Path(wt.path) / "bundle.bin").write_bytes(b"\x00\x01packed\x00" + KEY.encode() + b"\x00")
    (Path(wt.path) / "work.py").write_text("x = 1\n")
    gate = await dev_gate(wt)
    assert gate.refused == ["bundle.bin"] and gate.committed == ["work.py"], gate


def agent_commit(wt: str, message: str, files: dict[bytes, bytes]) -> None:
    for name, content in files.items():
        Path(os.fsdecode(os.path.join(os.fsencode(wt), name))).write_bytes(content)
    git(wt, "add", "-A")
    git(wt, "-c", "user.email=a@b", "-c", "user.name=agent", "commit", "-qm", message)


def key_in_a_binary_file(root: Path, wt: str) -> None:
    agent_commit(wt, "bundle", {b"bundle.bin": b"\x00" + KEY.encode()})


def key_body_under_a_begin_line_committed_before(root: Path, wt: str) -> None:
    """The BEGIN line (a placeholder in the docs) came before the story: the agent's commit adds only the body."""
    begin, body = KEY.split("\n", 1)
    agent_commit(wt, "the body", {b"docs.txt": (begin + "\n" + body).encode()})


def key_body_indented_under_a_begin_line_committed_before(root: Path, wt: str) -> None:
    """A YAML template (`key: |`) whose body the agent fills in: git's search saw no line starting with a body."""
    begin, body = KEY.split("\n", 1)
    agent_commit(wt, "the body", {b"docs.txt": (begin + "\n" + "".join(f"    {line}\n" for line in body.splitlines())).encode()})


def key_under_a_name_ending_with_a_newline(root: Path, wt: str) -> None:
    """The name read from git's list of changed files lost its last newline, and matched no file with a key."""
    agent_commit(wt, "notes", {b"notes\n": KEY.encode()})


def key_added_by_a_merge_commit(root: Path, wt: str) -> None:
    """A merge whose result holds a file none of its parents has: git shows no change for a merge unless asked."""
    branch = git(wt, "rev-parse", "--abbrev-ref", "HEAD").strip()
    git(wt, "checkout", "-qb", "side")
    agent_commit(wt, "side", {b"side.py": b"y = 2\n"})
    git(wt, "checkout", "-q", branch)
    agent_commit(wt, "main", {b"main.py": b"x = 1\n"})
    git(wt, "merge", "-q", "--no-ff", "--no-commit", "side")
    agent_commit(wt, "merge side", {b"notes.txt": KEY.encode()})


def key_under_a_name_git_cannot_spell(root: Path, wt: str) -> None:
    """A file name that is no UTF-8: the file was looked up by its name as decoded, not found, and merged."""
    agent_commit(wt, "notes", {b"notes-\xff.txt": KEY.encode()})


def putty_private_line_written_after_its_header(root: Path, wt: str) -> None:
    """An ed25519 key's private part is one line of 48 characters: git's search for a change of body alone
    wanted 60."""
    ppk = PUTTY_KEY.split("Private-Lines: 1\n")[0] + "Private-Lines: 1\n"
    agent_commit(wt, "a key file, to fill in", {b"notes.txt": (ppk + "(its private line comes later)\n").encode()})
    agent_commit(wt, "filled in", {b"notes.txt": (ppk + "AAAAIFh4Yw1bYzR0c3VwZXJzZWNyZXRrZXlfbm90X3JlYWxs\n").encode()})


def key_hidden_behind_a_replacement(root: Path, wt: str) -> None:
    """`git replace <key's blob> <an innocent one>`: git's log and cat-file showed the innocent text, while the
    commit (and what a push sends) still held the key."""
    agent_commit(wt, "notes", {b"notes.txt": KEY.encode()})
    (Path(wt) / "innocent.txt").write_text("nothing here\n")
    innocent = git(wt, "hash-object", "-w", "innocent.txt").strip()
    (Path(wt) / "innocent.txt").unlink()
    git(wt, "replace", git(wt, "rev-parse", "HEAD:notes.txt").strip(), innocent)


@pytest.mark.parametrize("commit", [key_in_a_binary_file, key_body_under_a_begin_line_committed_before,
                                    key_body_indented_under_a_begin_line_committed_before, key_added_by_a_merge_commit,
                                    key_under_a_name_git_cannot_spell, key_under_a_name_ending_with_a_newline,
                                    putty_private_line_written_after_its_header, key_hidden_behind_a_replacement],
                         ids=["binary-file", "body-under-an-old-begin-line", "indented-body", "merge-commit",
                              "undecodable-name", "name-ending-with-a-newline", "putty-private-line-after",
                              "git-replace"])
async def test_a_key_the_agent_committed_where_git_would_not_show_it_is_never_merged(tmp_path: Path, commit) -> None:
    root = dev_project(tmp_path)
    (root / "docs.txt").write_text(KEY.split("\n", 1)[0] + "\n")
    git(root, "add", "docs.txt")
    git(root, "commit", "-qm", "docs: what a key's first line looks like")
    base = git(root, "rev-parse", "HEAD").strip()
    wt = await ensure_worktree(str(root), "s1", STORY)
    commit(root, wt.path)
    result = await finish(root)
    assert not result.merged and "secret-looking files" in result.note, result
    assert git(root, "rev-parse", "HEAD").strip() == base


async def test_a_key_at_the_end_of_a_large_committed_file_is_seen_the_file_never_held(tmp_path: Path) -> None:
    """Each committed file git's search named was read whole into the worker (and decoded): one of hundreds of MB
    was held twice over."""
    root = dev_project(tmp_path)
    wt = await ensure_worktree(str(root), "s1", STORY)
    agent_commit(wt.path, "data", {b"data.txt": b"-----BEGIN PRIVATE KEY-----\n" + b"x" * (48 << 20) + KEY.encode()})
    tracemalloc.start()
    try:
        found = await git_ops._keys_committed(wt.path, f"{wt.base}..HEAD")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert found == {"data.txt"}
    assert peak < 8 << 20, peak  # the file is 48 MB


def test_a_key_across_the_blocks_a_file_is_read_in_is_seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("x" * 1000 + KEY + "y" * 1000)
    for block in (1, 7, 64, 1000, 1030):
        monkeypatch.setattr(git_ops, "_KEY_SCAN_BYTES", block)
        assert git_ops._file_holds_private_key(str(path)), block
    path.write_text("x" * 1000 + KEY.replace("PRIVATE", "PUBLIC"))
    assert not git_ops._file_holds_private_key(str(path))


def test_a_key_at_its_longest_across_a_blocks_end_is_seen() -> None:
    """Its BEGIN line, separators and headers (~50 KB at their longest) before a block's end, its body after."""
    from bso.git_rules import PRIVATE_KEY_LONGEST_MATCH

    between = "\\\\\\n" * 256
    header = "Comment: " + '\\\\\\"' * 512 + "\\\\\\n" + between
    start = "-----BEGIN PRIVATE KEY-----" + between + header * 16
    body = "\\\\\\/" * 40
    assert 0.9 * PRIVATE_KEY_LONGEST_MATCH < len(start + body) <= PRIVATE_KEY_LONGEST_MATCH
    for cut in (1, len(start) // 2, len(start), len(start) + 50):
        text = ("x" * (git_ops._KEY_SCAN_BYTES - cut) + start + body).encode()
        assert git_ops._stream_holds_private_key(io.BytesIO(text)), cut


def test_a_blob_git_cannot_give_is_an_error_not_no_key(tmp_path: Path) -> None:
    """(A blob missing from a partial clone, say.) Taken as "no key", a key in it would be merged unchecked."""
    root = make_git_project(tmp_path)
    with pytest.raises(git_ops.GitError, match="could not be checked for a private key"):
        git_ops._blob_holds_private_key(str(root), "0" * 40)
    for text, holds in (("-----BEGIN PRIVATE KEY-----\n" + "A" * 64 + "\n", True), ("no key\n", False)):
        (tmp_path / "blob").write_text(text)
        blob = git(root, "hash-object", "-w", str(tmp_path / "blob")).strip()
        assert git_ops._blob_holds_private_key(str(root), blob) is holds


def test_a_blob_git_never_gives_is_an_error_within_its_timeout(tmp_path: Path, monkeypatch) -> None:
    """(A lazy fetch of a partial clone that hangs, say.) cat-file had no timeout: the check waited forever."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "git").write_text("#!/bin/sh\nexec sleep 60\n")
    (fake_bin / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}{os.pathsep}{os.environ['PATH']}")
    started = time.monotonic()
    with pytest.raises(git_ops.GitError, match="gave no answer within 0.5 s, so it could not be checked"):
        git_ops._blob_holds_private_key(str(tmp_path), "0" * 40, timeout=0.5)
    assert time.monotonic() - started < 30  # (the sleep's 60 s not waited for: it was killed)


def test_a_lazy_fetch_that_hangs_is_ended_with_the_blobs_read(tmp_path: Path) -> None:
    """(From a review.) In a partial clone cat-file starts a fetch, which held the pipe open once cat-file alone
    was killed: the check still read 10 s after a 1 s timeout. The whole process group goes now."""
    origin, clone = tmp_path / "origin", tmp_path / "clone"
    origin.mkdir()
    git(origin, "init", "-q")
    (origin / "f.txt").write_text("data\n")
    git(origin, "add", "f.txt")
    git(origin, "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "x")
    git(origin, "config", "uploadpack.allowFilter", "true")
    subprocess.run(["git", "clone", "-q", "--filter=blob:none", "--no-checkout", f"file://{origin}", str(clone)],
                   check=True, capture_output=True)
    git(clone, "config", "protocol.ext.allow", "always")
    git(clone, "config", "remote.origin.url", "ext::sh -c sleep% 30")  # the fetch hangs
    blob = git(clone, "rev-parse", "HEAD:f.txt").strip()
    started = time.monotonic()
    with pytest.raises(git_ops.GitError, match="within 1 s"):
        git_ops._blob_holds_private_key(str(clone), blob, timeout=1)
    assert time.monotonic() - started < 10


async def test_deleting_a_committed_key_is_no_secret_to_refuse(tmp_path: Path) -> None:
    """A story that removes the key the project had committed failed every dispatch, and could never merge."""
    from activities.git_ops import finish_story_git
    from bso.git_rules import FinishStoryInput

    root = dev_project(tmp_path)
    (root / "config").mkdir()
    (root / "config" / "test.pem").write_text("-----BEGIN PRIVATE KEY-----\n")
    git(root, "add", "-f", "config/test.pem")
    git(root, "commit", "-qm", "a key, committed long ago")
    wt = await ensure_worktree(str(root), "s1", STORY)
    git(wt.path, "rm", "-q", "config/test.pem")
    (Path(wt.path) / "work.py").write_text("x = 1\n")
    gate = await dev_gate(wt)
    assert gate.refused == [] and sorted(gate.committed) == ["config/test.pem", "work.py"], gate
    done = await ActivityEnvironment().run(
        finish_story_git, FinishStoryInput(project_root=str(root), session_id="s1", story_key=STORY)
    )
    assert done.merged, done
    assert not (root / "config" / "test.pem").exists()


async def test_untracking_a_committed_key_is_no_secret_to_refuse_and_its_file_stays_out(tmp_path: Path) -> None:
    """`git rm --cached key.pem` (the file kept on disk, then listed in .gitignore) was refused as a secret, the
    gate deciding on the disk, and its `git reset` put the key back in the index: the story could never take the
    key out of the repository. A key written anew, or changed while tracked, is still refused."""
    root = dev_project(tmp_path)
    (root / "key.pem").write_text("-----BEGIN PRIVATE KEY----- old\n")
    (root / "config.pem").write_text("-----BEGIN PRIVATE KEY----- kept\n")
    git(root, "add", "-f", "key.pem", "config.pem")
    git(root, "commit", "-qm", "keys, committed long ago")
    wt = await ensure_worktree(str(root), "s1", STORY)
    settings = GitSettings()

    async def gate():
        return await git_ops.exit_gate(wt.path, settings, since=git(wt.path, "rev-parse", "HEAD").strip(),
                                       agent_type="dev-runner", story_key=STORY, dispatch_id="s1/batch-1/1-1/1")

    git(wt.path, "rm", "-q", "--cached", "key.pem", "config.pem")
    (Path(wt.path) / ".gitignore").write_text(".sprint-session/\nkey.pem\n")  # config.pem: left untracked
    done = await gate()
    assert done.refused == [] and sorted(done.committed) == [".gitignore", "config.pem", "key.pem"], done
    assert git(wt.path, "ls-files", "key.pem", "config.pem") == ""
    assert (Path(wt.path) / "key.pem").read_text() == "-----BEGIN PRIVATE KEY----- old\n"
    assert git(wt.path, "status", "--porcelain").splitlines() == ["?? config.pem"]
    # The next dispatch's gate finds the untracked key as it was: nothing new, nothing refused.
    (Path(wt.path) / "work.py").write_text("x = 1\n")
    assert (await gate()).refused == []
    # A new key where the old one was, or a tracked one changed: refused, never committed.
    (Path(wt.path) / "config.pem").write_text("-----BEGIN PRIVATE KEY----- new\n")
    (Path(wt.path) / "run_checks.py").unlink()
    assert (await gate()).refused == ["config.pem"]
    assert "config.pem" not in git(wt.path, "ls-files")
    done = await ActivityEnvironment().run(
        finish_story_git, FinishStoryInput(project_root=str(root), session_id="s1", story_key=STORY)
    )
    assert done.merged, done
    assert git(root, "ls-files", "key.pem", "config.pem") == ""
    # Untracked, not deleted: the merge took the checkout's copies away, BSO put them back.
    assert (root / "key.pem").read_text() == "-----BEGIN PRIVATE KEY----- old\n"
    assert (root / "config.pem").read_text() == "-----BEGIN PRIVATE KEY----- kept\n"
    assert "kept on disk: config.pem, key.pem" in done.note, done.note


async def test_a_file_the_agent_untracked_stays_untracked_where_it_is_ignored_now(tmp_path: Path) -> None:
    """`git rm --cached build.log` and build.log in .gitignore: the gate's `git add` of the path, ignored now,
    failed the gate (every attempt). notes.txt, untracked but not ignored, is tracked again, as any `git add -A`
    would: the same rule took a whole project out of the repository (next test)."""
    root = dev_project(tmp_path)
    for name in ("build.log", "notes.txt"):
        (root / name).write_text("kept\n")
    git(root, "add", "build.log", "notes.txt")
    git(root, "commit", "-qm", "logs")
    wt = await ensure_worktree(str(root), "s1", STORY)
    git(wt.path, "rm", "-q", "--cached", "build.log", "notes.txt")
    (Path(wt.path) / ".gitignore").write_text(".sprint-session/\nbuild.log\n")
    gate = await dev_gate(wt)
    assert sorted(gate.committed) == [".gitignore", "build.log"] and gate.tracked_again == ["notes.txt"], gate
    assert git(wt.path, "ls-files", "build.log", "notes.txt") == "notes.txt\n"
    assert (Path(wt.path) / "build.log").exists() and (Path(wt.path) / "notes.txt").exists()


async def test_a_file_untracked_and_copied_under_another_name_is_seen_for_itself(tmp_path: Path) -> None:
    """`git rm --cached notes.txt`, the same text added as copy.txt: git's status showed a rename to copy.txt,
    notes.txt only untracked, and the gate tracked it again without saying so."""
    root = dev_project(tmp_path)
    (root / "notes.txt").write_text("kept\n")
    git(root, "add", "notes.txt")
    git(root, "commit", "-qm", "notes")
    wt = await ensure_worktree(str(root), "s1", STORY)
    git(wt.path, "rm", "-q", "--cached", "notes.txt")
    (Path(wt.path) / "copy.txt").write_text("kept\n")
    git(wt.path, "add", "copy.txt")
    gate = await dev_gate(wt)
    assert gate.tracked_again == ["notes.txt"] and gate.committed == ["copy.txt"], gate
    assert git(wt.path, "ls-files", "notes.txt", "copy.txt").split() == ["copy.txt", "notes.txt"]


async def test_a_symlink_the_agent_untracked_unchanged_is_tracked_again_and_said(tmp_path: Path) -> None:
    """`git rm --cached` of a symlink kept as it was, not ignored: tracked again like a file, but unsaid (a link
    was never judged unchanged). One that leads elsewhere now is the agent's change, committed as any other."""
    root = dev_project(tmp_path)
    (root / "notes.txt").write_text("kept\n")
    for name in ("same-link", "moved-link"):
        (root / name).symlink_to("notes.txt")
    git(root, "add", "notes.txt", "same-link", "moved-link")
    git(root, "commit", "-qm", "links")
    wt = await ensure_worktree(str(root), "s1", STORY)
    git(wt.path, "rm", "-q", "--cached", "same-link", "moved-link")
    (Path(wt.path) / "moved-link").unlink()
    (Path(wt.path) / "moved-link").symlink_to("elsewhere.txt")
    gate = await dev_gate(wt)
    assert gate.tracked_again == ["same-link"] and gate.committed == ["moved-link"], gate
    assert git(wt.path, "ls-files", "same-link", "moved-link").split() == ["moved-link", "same-link"]
    assert os.readlink(Path(wt.path) / "moved-link") == "elsewhere.txt"


async def test_untracking_the_whole_project_without_adding_it_back_takes_nothing_out(tmp_path: Path) -> None:
    """`git rm -r --cached .` without the `git add .` that re-applies .gitignore: the gate committed every file's
    removal, and the story's merge took the whole project out of the user's repository (its files left on disk,
    untracked). Now they are tracked again, the agent's own work committed, and a finding says so."""
    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="untrack-all")
    tracked = set(git(root, "ls-files").splitlines())
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.SUCCESS, done.error
    [said] = [f for f in done.findings if "git rm --cached" in f.summary]
    # The project's files and the agent's two it had committed before untracking them all.
    assert said.summary.startswith(f"untracked {len(tracked) + 2} file(s) with `git rm --cached` without ignoring them")
    merged = await ActivityEnvironment().run(
        finish_story_git, FinishStoryInput(project_root=str(root), session_id="s1", story_key=STORY)
    )
    assert merged.merged, merged
    after = set(git(root, "ls-files").splitlines())
    assert tracked <= after and "src/story_1_1_hello_world_extra.py" in after, sorted(tracked - after)
    assert git(root, "status", "--porcelain", "--untracked-files=no") == ""


async def test_files_untracked_are_judged_whatever_a_clean_filter_says(tmp_path: Path) -> None:
    """A clean filter (.gitattributes) that talks on stderr while `git hash-object` runs it: what it said came
    with the object ids (git's output is read merged), and every id after it was paired with the wrong file."""
    root = dev_project(tmp_path)
    (root / ".gitattributes").write_text("*.txt filter=noisy\n*.pem filter=noisy\n")
    git(root, "config", "filter.noisy.clean", "echo cleaning >&2; cat")
    for name in ("a.txt", "b.txt", "c.txt", "key.pem"):
        (root / name).write_text(f"{name}\n")
    git(root, "add", ".gitattributes", "a.txt", "b.txt", "c.txt", "key.pem")
    git(root, "commit", "-qm", "texts")
    wt = await ensure_worktree(str(root), "s1", STORY)
    git(wt.path, "rm", "-q", "--cached", "a.txt", "b.txt", "c.txt", "key.pem")
    gate = await dev_gate(wt)
    # The key untracked as it was: its removal committed, not refused (as without the filter).
    assert gate.tracked_again == ["a.txt", "b.txt", "c.txt"] and gate.committed == ["key.pem"], gate
    assert gate.refused == [] and git(wt.path, "ls-files", "key.pem") == ""


@pytest.mark.parametrize("ignored", [False, True])
async def test_untracking_the_whole_project_takes_no_submodule_out(tmp_path: Path, ignored: bool) -> None:
    """`git rm -r --cached .` in a project with a submodule: its gitlink (an empty folder in the story's worktree,
    which BSO never initializes) is untracked too, and not ignored. Tracked again like the project's files, not
    its removal committed (the merge would take the submodule out of the user's repository)."""
    root = dev_project(tmp_path)
    commit = git(root, "rev-parse", "HEAD").strip()
    (root / ".gitmodules").write_text('[submodule "lib"]\n\tpath = vendor/lib\n\turl = https://example.com/lib\n')
    git(root, "update-index", "--add", "--cacheinfo", f"160000,{commit},vendor/lib")
    git(root, "add", ".gitmodules")
    git(root, "commit", "-qm", "submodule")
    wt = await ensure_worktree(str(root), "s1", STORY)
    assert (Path(wt.path) / "vendor" / "lib").is_dir()
    git(wt.path, "rm", "-r", "-q", "--cached", ".")
    if ignored:  # the agent's choice, as for a file: it stays out
        (Path(wt.path) / ".gitignore").write_text(".sprint-session/\nvendor/\n")
    gate = await dev_gate(wt)
    if ignored:
        assert git(wt.path, "ls-tree", "HEAD", "vendor/lib") == "" and "vendor/lib" not in gate.tracked_again, gate
        return
    assert git(wt.path, "ls-tree", "HEAD", "vendor/lib").split()[:3] == ["160000", "commit", commit], gate
    assert "vendor/lib" in gate.tracked_again and "vendor/lib" not in gate.committed, gate


async def test_a_tracked_key_changed_then_untracked_or_staged_is_refused(tmp_path: Path) -> None:
    root = dev_project(tmp_path)
    (root / "key.pem").write_text("-----BEGIN PRIVATE KEY----- old\n")
    git(root, "add", "-f", "key.pem")
    git(root, "commit", "-qm", "a key")
    wt = await ensure_worktree(str(root), "s1", STORY)
    (Path(wt.path) / "key.pem").write_text("-----BEGIN PRIVATE KEY----- new\n")
    gate = await dev_gate(wt)
    assert gate.refused == ["key.pem"] and git(wt.path, "rev-parse", "HEAD").strip() == wt.base


async def test_a_repository_the_agent_left_in_the_worktree_is_not_committed_as_a_gitlink(tmp_path: Path) -> None:
    """A clone or `git init` inside the worktree: the gate committed a gitlink with no .gitmodules, the story
    merged, the worktree went with the track, and the repository's files with it."""
    root = dev_project(tmp_path)
    wt = await ensure_worktree(str(root), "s1", STORY)
    lib = Path(wt.path, "vendor", "lib")
    lib.mkdir(parents=True)
    git(lib, "init", "-q")
    (lib / "lib.py").write_text("LIB = 1\n")
    git(lib, "add", "lib.py")
    git(lib, "commit", "-qm", "lib")
    gate = await dev_gate(wt)
    assert gate.repositories == ["vendor/lib"] and gate.committed == [], gate
    git(wt.path, "add", "vendor/lib")  # the agent commits it itself
    git(wt.path, "commit", "-qm", "vendor lib")
    again = await dev_gate(wt, 2)
    assert again.repositories == ["vendor/lib"], again
    # Made a submodule (in .gitmodules), it is the project's to have, and so is a move of its pointer.
    (Path(wt.path) / ".gitmodules").write_text('[submodule "lib"]\n\tpath = vendor/lib\n\turl = ./vendor/lib\n')
    git(wt.path, "add", ".gitmodules")
    git(wt.path, "commit", "-qm", "a submodule")
    (lib / "lib.py").write_text("LIB = 2\n")
    git(lib, "commit", "-qam", "lib 2")
    git(wt.path, "add", "vendor/lib")
    git(wt.path, "commit", "-qm", "lib moved on")
    submodule = await dev_gate(wt, 3)
    assert submodule.repositories == [], submodule


async def test_thousands_of_files_left_are_committed_at_once_secrets_still_refused(tmp_path: Path) -> None:
    """A node_modules the .gitignore misses: one commit per file rewrote git's whole index every time (~30 ms a
    file at 3,000 files, growing with their number: hours for 30,000)."""
    root = dev_project(tmp_path)
    wt = await ensure_worktree(str(root), "s1", STORY)
    many = git_ops.GATE_COMMITS_PER_FILE_UP_TO + 100
    for n in range(many):
        path = Path(wt.path, "node_modules", f"pkg{n % 7}", f"index {n}.js")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"module.exports = {n}\n")
    (Path(wt.path) / ".env").write_text("OPENAI_API_KEY=sk-fake\n")
    (Path(wt.path) / ":(top)").write_text("odd name\n")
    git(wt.path, "rm", "-q", "run_checks.py")  # a deletion staged by the agent: `git add` refuses its path
    began = time.monotonic()
    gate = await dev_gate(wt)
    took = time.monotonic() - began
    assert gate.refused == [".env"] and len(gate.committed) == many + 2 and ":(top)" in gate.committed
    assert "run_checks.py" in gate.committed
    assert git(wt.path, "log", "--format=%s", f"{wt.base}..HEAD").splitlines() == [
        f"bso(dev-runner): {STORY}: {many + 2} files"
    ]
    assert git(wt.path, "status", "--porcelain").splitlines() == ["?? .env"]
    print(f"{many + 1} files committed in {took:.1f} s")


async def test_a_prompt_too_long_for_an_argument_is_a_setup_error_saying_what_to_change(tmp_path: Path) -> None:
    """A story long enough (or fix findings long enough) made the prompt, given as an argument, over what one
    argument can carry: the agent's start failed with "Argument list too long", retried five times."""
    root = dev_project(tmp_path, agents_toml="")
    criteria = "".join(f"{n}. the form accepts input number {n} and shows it back to the user\n" for n in range(1, 2500))
    (root / STORY_PATH).write_text(STORY_TEXT + criteria)
    agents = root / ".bso" / "agents.toml"
    as_argument = agents.read_text().replace('"--prompt-file", "{prompt_file}"', '"--prompt", "{prompt}"')
    agents.write_text(as_argument.replace('prompt_via = "file"', 'prompt_via = "arg"'))
    with pytest.raises(ApplicationError) as refused:
        await ActivityEnvironment().run(command.run, assignment(root))
    assert refused.value.type == "AgentConfigError" and refused.value.non_retryable
    assert 'prompt_via = "file"' in refused.value.message
    assert runs(tmp_path) == []  # no agent started


async def finish(root: Path, **kw) -> FinishStoryResult:
    return await ActivityEnvironment().run(
        finish_story_git, FinishStoryInput(project_root=str(root), session_id="s1", story_key=STORY, **kw)
    )


async def test_a_hostile_story_key_is_refused_before_finish_touches_anything(tmp_path: Path) -> None:
    root = dev_project(tmp_path)
    before = sorted(p.relative_to(root) for p in root.rglob("*") if ".git" not in p.parts)
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(
            finish_story_git, FinishStoryInput(project_root=str(root), session_id="s1", story_key="../../etc")
        )
    assert err.value.non_retryable and err.value.type == "AgentConfigError"
    assert sorted(p.relative_to(root) for p in root.rglob("*") if ".git" not in p.parts) == before


async def test_a_secret_the_agent_committed_itself_is_never_merged(tmp_path: Path) -> None:
    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="commit-env")
    base = git(root, "rev-parse", "HEAD").strip()
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.FAILURE and ".env" in done.error
    # Even if the story were let through (a human's force_pass), finishing it merges nothing.
    result = await finish(root)
    assert not result.merged and "secret-looking files (.env)" in result.note
    assert git(root, "rev-parse", "HEAD").strip() == base
    assert ".env" not in git(root, "log", "--name-only", "--format=", "HEAD").split()  # the user's branch
    assert worktree_path(str(root), "s1", STORY).exists()


async def test_a_secret_committed_then_deleted_is_still_never_merged(tmp_path: Path) -> None:
    root = dev_project(tmp_path)
    wt = await ensure_worktree(str(root), "s1", STORY)
    (Path(wt.path) / ".env").write_text("OPENAI_API_KEY=sk-fake\n")
    git(wt.path, "add", "-f", ".env")
    git(wt.path, "commit", "-q", "-m", "oops")
    git(wt.path, "rm", "-q", ".env")
    (Path(wt.path) / "feature.py").write_text("X = 1\n")
    git(wt.path, "add", "feature.py")
    git(wt.path, "commit", "-q", "-m", "remove it, add the feature")
    result = await finish(root, squash=False)  # no squash: the branch's commits would land as they are
    assert not result.merged and "(.env)" in result.note


async def test_a_merge_conflict_keeps_the_original_commits_and_the_worktree(tmp_path: Path) -> None:
    root = dev_project(tmp_path)
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.SUCCESS, done.error
    branch = f"bso/s1/{STORY}"
    tip = git(root, "rev-parse", branch).strip()
    originals = git(root, "rev-list", f"main..{branch}").split()
    assert len(originals) >= 2  # the agent's commit and the Exit Gate's
    # Meanwhile the user changed the same file on their branch.
    (root / "src").mkdir(exist_ok=True)
    (root / "src" / "story_1_1_hello_world.py").write_text("def greet():\n    return 'hi'\n")
    git(root, "add", "src")
    git(root, "commit", "-q", "-m", "user's own greet")
    user_head, user_status = git(root, "rev-parse", "HEAD").strip(), git(root, "status", "--porcelain")
    result = await finish(root)
    assert not result.merged and "failed; worktree kept" in result.note
    assert git(root, "rev-parse", "HEAD").strip() == user_head and git(root, "status", "--porcelain") == user_status
    # BSO aborted the merge: no conflict in the checkout to fix, nothing to commit. The note said git's own
    # "fix conflicts and then commit the result" all the same; it names the merge to make by hand.
    assert not (root / ".git" / "MERGE_HEAD").exists()
    assert "fix conflicts and then commit the result" not in result.note, result.note
    assert "the merge was undone" in result.note and f"git merge {branch}" in result.note, result.note
    assert git(root, "rev-parse", branch).strip() == tip  # the original commits stay, not the squash
    assert worktree_path(str(root), "s1", STORY).exists()


@pytest.mark.parametrize("in_the_way", ["file", "folder"])
async def test_something_in_the_way_of_a_worktree_is_named_at_once_and_kept(tmp_path: Path, in_the_way: str) -> None:
    """A file, or a folder with files, where the story's worktree goes failed with git's words, retried five
    times; nothing of it was clobbered, and nothing is now."""
    root = dev_project(tmp_path)
    path = worktree_path(str(root), "s1", STORY)
    path.parent.mkdir(parents=True)
    if in_the_way == "file":
        path.write_text("mine\n")
    else:
        path.mkdir()
        (path / "notes.txt").write_text("mine\n")
    with pytest.raises(ApplicationError) as refused:
        await ensure_worktree(str(root), "s1", STORY)
    assert "is in the way of the story's worktree" in refused.value.message and refused.value.non_retryable
    assert (path if in_the_way == "file" else path / "notes.txt").read_text() == "mine\n"


@pytest.mark.parametrize("refusal", ["ref-in-the-way", "checked-out-elsewhere", "locked-worktree", "invalid-name"])
async def test_a_worktree_git_refuses_for_good_is_named_at_once_in_gits_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refusal: str
) -> None:
    """A branch below the story's branch in the way of it, the story's branch checked out elsewhere, the
    worktree's path registered as another (locked) worktree: `git worktree add` failed the same way five times
    (the activity's retries) before the story ended."""
    root = dev_project(tmp_path)
    branch, path = f"bso/s1/{STORY}", worktree_path(str(root), "s1", STORY)
    if refusal == "ref-in-the-way":
        # A packed ref below the story's branch: bso/s1/<story> cannot be made beside bso/s1/<story>/old. (A branch
        # bso/s1 itself is named earlier, by repo_problem.)
        git(root, "branch", f"{branch}/old")
        git(root, "pack-refs", "--all")
        expected, words = "a ref is in the way of the story's branch", f"'refs/heads/{branch}/old' exists; cannot create"
    elif refusal == "checked-out-elsewhere":
        git(root, "branch", branch)
        git(root, "worktree", "add", "-q", str(tmp_path / "elsewhere"), branch)
        expected, words = "the story's branch is checked out elsewhere", str(tmp_path / "elsewhere")
    elif refusal == "locked-worktree":
        git(root, "worktree", "add", "-q", "-b", "mine", str(path))
        git(root, "worktree", "lock", str(path))
        subprocess.run(["rm", "-rf", str(path)], check=True)  # gone, still registered (locked: never pruned)
        expected, words = "the path is registered as another, locked, worktree", "is a missing but locked worktree"
    else:  # the branch name rules (bso.git_rules) let through a name git refuses
        monkeypatch.setattr(git_ops, "story_branch", lambda session, key: f"bso/{session}/bad..{key}")
        expected, words = "git refuses the story's branch name", "is not a valid branch name"
    with pytest.raises(ApplicationError) as refused:
        await ensure_worktree(str(root), "s1", STORY)
    assert refused.value.non_retryable and refused.value.type == "AgentConfigError"
    assert expected in refused.value.message and words in refused.value.message, refused.value.message
    assert "Preparing worktree" not in refused.value.message  # git's refusal, not its progress


def _pids_running(*words: str) -> list[int]:
    """Processes (by procfs) whose command line holds every one of `words`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\x00")
        except OSError:
            continue
        if all(word in argv for word in words):
            found.append(int(pid))
    return found


@pytest.mark.parametrize("left", ["checked-out-in-part", "no-git-file-yet"])
async def test_a_worktree_whose_making_was_killed_midway_is_made_again_whole(tmp_path: Path, left: str) -> None:
    """A worker killed hard inside `git worktree add` left the worktree locked `initializing`: with its `.git`
    there, it was taken as made, the files not checked out yet missing (the agent's commit would delete them);
    without, every attempt after was refused (`missing but locked worktree`) and the story ended."""
    root = dev_project(tmp_path)
    flag, reached = tmp_path / "slow-checkout", tmp_path / "checking-out"
    # A smudge filter holds the checkout in the middle (a.txt written, z.txt not yet) while the flag is there.
    git(root, "config", "filter.slow.smudge", f"sh -c 'if [ -e {flag} ]; then touch {reached}; sleep 60; fi; cat'")
    (root / ".gitattributes").write_text("m-slow.txt filter=slow\n")
    for name in ("a.txt", "m-slow.txt", "z.txt"):
        (root / name).write_text(f"{name}\n")
    git(root, "add", ".gitattributes", "a.txt", "m-slow.txt", "z.txt")
    git(root, "commit", "-qm", "files to check out")
    path = worktree_path(str(root), "s1", STORY)
    flag.touch()
    first = asyncio.create_task(ensure_worktree(str(root), "s1", STORY))
    async def checking_out() -> bool:
        return reached.exists()

    await poll_until(checking_out, "the checkout to reach the slow file", timeout=30)
    [adding] = _pids_running("worktree", "add")
    os.killpg(adding, signal.SIGKILL)  # the worker killed hard, its git with it: no clean-up of git's own
    with pytest.raises(git_ops.GitError):
        await first
    flag.unlink()
    assert (path / ".git").exists() and not (path / "z.txt").exists()  # as git left it
    if left == "no-git-file-yet":
        subprocess.run(["rm", "-rf", str(path)], check=True)  # killed before git wrote the worktree's .git
    wt = await ensure_worktree(str(root), "s1", STORY)  # the activity's retry
    assert (Path(wt.path) / "z.txt").read_text() == "z.txt\n"
    assert git(Path(wt.path), "status", "--porcelain") == ""
    assert "locked" not in git(root, "worktree", "list", "--porcelain")
    assert git(Path(wt.path), "rev-parse", "--abbrev-ref", "HEAD").strip() == f"bso/s1/{STORY}"


async def test_a_worktree_a_git_still_makes_is_left_to_it(tmp_path: Path) -> None:
    """The killed worker's `git worktree add` may still run (only the worker was killed): its worktree, locked
    `initializing` meanwhile, is not removed under it; the attempt is retried."""
    root = dev_project(tmp_path)
    wt = await ensure_worktree(str(root), "s1", STORY)
    admin = Path(git(wt.path, "rev-parse", "--absolute-git-dir").strip())
    (admin / "locked").write_text("initializing")  # as git keeps it while it makes the worktree
    still = subprocess.Popen(["git", "hash-object", "--stdin"], cwd=wt.path, stdin=subprocess.PIPE)
    try:
        with pytest.raises(git_ops.GitError, match="a `git worktree add` still makes it"):
            await ensure_worktree(str(root), "s1", STORY)
        assert (Path(wt.path) / ".git").exists()
    finally:
        still.communicate(b"")
    (admin / "locked").unlink()  # git is done with it
    assert (await ensure_worktree(str(root), "s1", STORY)).path == wt.path


async def test_a_lock_another_git_process_holds_at_the_worktrees_creation_is_retried(tmp_path: Path) -> None:
    """`cannot lock ref` is also git's word for a ref's lock held by another git process: that one passes."""
    root = dev_project(tmp_path)
    lock = root / ".git" / "refs" / "heads" / "bso" / "s1" / f"{STORY}.lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    with pytest.raises(git_ops.GitError, match="File exists"):  # not an ApplicationError: retried
        await ensure_worktree(str(root), "s1", STORY)
    lock.unlink()  # the other process is done
    wt = await ensure_worktree(str(root), "s1", STORY)
    assert git(Path(wt.path), "rev-parse", "--abbrev-ref", "HEAD").strip() == f"bso/s1/{STORY}"


@pytest.mark.parametrize("name", ["index.lock", "HEAD.lock"])
async def test_a_stale_lock_in_the_worktree_is_removed_and_said(tmp_path: Path, name: str) -> None:
    """A git killed with SIGKILL (its worker or the agent killed hard in the middle of a `git add` or a commit)
    left the worktree's index.lock or HEAD.lock: every attempt after it failed on it, the agent's git and the
    Exit Gate's alike."""
    root = dev_project(tmp_path)
    wt = await ensure_worktree(str(root), "s1", STORY)
    lock = Path(git(wt.path, "rev-parse", "--absolute-git-dir").strip(), name)
    lock.write_bytes(b"")  # as git left it
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.SUCCESS, done.error
    assert not lock.exists()
    [said] = [f for f in done.findings if name in f.summary]
    assert said.severity is Severity.LOW and said.file == os.path.relpath(lock, root)


async def test_an_index_lock_a_live_process_may_hold_is_left_alone(tmp_path: Path) -> None:
    """A git still running holds its lock: one working in the worktree (its directory there), or one holding the
    lock open from elsewhere (--git-dir). Only once none is left does the lock go."""
    root = dev_project(tmp_path)
    wt = await ensure_worktree(str(root), "s1", STORY)
    lock = Path(git(wt.path, "rev-parse", "--absolute-git-dir").strip(), "index.lock")
    lock.write_bytes(b"")
    holding = "import sys, time; f = open(sys.argv[1], 'rb'); print('held', flush=True); time.sleep(60)"
    working_there = subprocess.Popen(["sleep", "60"], cwd=Path(wt.path, "_bmad-output"))
    holding_open = subprocess.Popen([sys.executable, "-c", holding, str(lock)], cwd=tmp_path, stdout=subprocess.PIPE)
    try:
        assert holding_open.stdout.readline() == b"held\n"
        for still_running in (working_there, holding_open):
            assert await ActivityEnvironment().run(git_ops.remove_stale_locks, wt, str(root)) == []
            assert lock.exists()
            still_running.kill()
            still_running.wait()
    finally:
        for process in (working_there, holding_open):
            process.kill()
            process.wait()
    assert await ActivityEnvironment().run(git_ops.remove_stale_locks, wt, str(root)) == [lock]
    assert not lock.exists()


def ref_lock(root: Path, branch: str) -> Path:
    return root / ".git" / "refs" / "heads" / f"{branch}.lock"


async def test_a_stale_lock_of_the_storys_branch_is_removed_and_said(tmp_path: Path) -> None:
    """A git killed with SIGKILL in the middle of a commit on the story's branch left the branch's ref lock in the
    repository's common git folder: every attempt's commit on the branch failed on it (the agent's, the Exit
    Gate's), and the squash at the story's end."""
    root = dev_project(tmp_path)
    wt = await ensure_worktree(str(root), "s1", STORY)
    lock = ref_lock(root, wt.branch)
    lock.write_bytes(b"")  # as git left it
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.SUCCESS, done.error
    assert not lock.exists()
    [said] = [f for f in done.findings if f"refs/heads/{wt.branch}.lock" in f.summary]
    assert said.severity is Severity.LOW and said.file == os.path.relpath(lock, root)
    assert int(git(Path(wt.path), "rev-list", "--count", f"{wt.base}..{wt.branch}")) > 0  # the work committed


@pytest.mark.parametrize("git_folder", ["in-the-checkout", "elsewhere"])
async def test_a_lock_of_the_storys_branch_a_git_in_the_users_checkout_may_hold_is_left_alone(
    tmp_path: Path, git_folder: str
) -> None:
    """The branch's lock is in the common git folder, which the user's checkout shares: a git of the user's (`git
    gc`, `git pack-refs` locking the loose refs it prunes) works in the checkout or in the git folder itself (one
    outside the checkout too, `git init --separate-git-dir`). Only once none is left does the lock go; a shell
    or an editor there, which holds no ref lock, does not keep it (one almost always works in the checkout)."""
    root = dev_project(tmp_path)
    common = root / ".git"
    if git_folder == "elsewhere":
        common = tmp_path / "repo.git"
        git(root, "init", "-q", f"--separate-git-dir={common}")  # moved there, `.git` a file naming it
    wt = await ensure_worktree(str(root), "s1", STORY)
    lock = common / "refs" / "heads" / f"{wt.branch}.lock"
    lock.write_bytes(b"")
    a_shell = subprocess.Popen(["sleep", "60"], cwd=root)
    try:
        for there in (root, common / "refs"):  # one at a time: each keeps it alone by itself
            a_git = subprocess.Popen(["git", "hash-object", "--stdin"], cwd=there, stdin=subprocess.PIPE)  # waits
            try:
                assert await ActivityEnvironment().run(git_ops.remove_stale_locks, wt, str(root)) == [], there
                assert lock.exists()
            finally:
                a_git.kill()
                a_git.wait()
        assert await ActivityEnvironment().run(git_ops.remove_stale_locks, wt, str(root)) == [lock]
    finally:
        a_shell.kill()
        a_shell.wait()
    assert not lock.exists()


async def test_a_lock_of_the_storys_branch_a_git_in_another_checkout_of_the_user_may_hold_is_left_alone(
    tmp_path: Path,
) -> None:
    """The user's other linked worktrees (`git worktree add ../feature`) share the common git folder too: a git
    there (a `git gc --auto` a commit started, `git pack-refs` locking the loose refs it prunes) may hold the
    story branch's lock, as one in the main checkout may."""
    root = dev_project(tmp_path)
    feature = tmp_path / "feature"
    git(root, "worktree", "add", "-q", "-b", "feature", str(feature))
    wt = await ensure_worktree(str(root), "s1", STORY)
    lock = ref_lock(root, wt.branch)
    lock.write_bytes(b"")
    a_git = subprocess.Popen(["git", "hash-object", "--stdin"], cwd=feature, stdin=subprocess.PIPE)  # waits
    try:
        assert await ActivityEnvironment().run(git_ops.remove_stale_locks, wt, str(root)) == []
        assert lock.exists()
    finally:
        a_git.kill()
        a_git.wait()
    assert await ActivityEnvironment().run(git_ops.remove_stale_locks, wt, str(root)) == [lock]


async def test_a_stale_lock_of_the_storys_branch_is_removed_before_its_squash(tmp_path: Path) -> None:
    """A git killed in the middle of the story's last commit: the squash's move of the branch failed on its lock,
    every retry of the finish alike."""
    root = dev_project(tmp_path)
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.SUCCESS, done.error
    wt = await ensure_worktree(str(root), "s1", STORY)
    lock = ref_lock(root, wt.branch)
    lock.write_bytes(b"")
    merged = await ActivityEnvironment().run(
        finish_story_git, FinishStoryInput(project_root=str(root), session_id="s1", story_key=STORY)
    )
    assert merged.merged and merged.squashed, merged
    assert not lock.exists()


def test_another_users_git_keeps_only_the_branchs_lock_its_directory_unseen(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """procfs shows another user's process by name, not its directory (a worker that is not root): a git of
    theirs may be working in the checkout they may share, so nothing tells for the story branch's lock
    (`named="git"`); their other processes count for nothing. BSO's worktree is no other user's to work in: their
    git anywhere on the machine (a `git daemon`, a `git log` in a pager) keeps none of its own locks."""
    with another_users_process(monkeypatch, tmp_path) as seen:
        assert process.processes_using([tmp_path], tmp_path / "x.lock", named="git") == []
        monkeypatch.setattr(process, "_command_name", lambda pid: "git-daemon" if pid == str(seen.pid) else "")
        assert process.processes_using([tmp_path], tmp_path / "x.lock", named="git") is None
        assert process.processes_using([tmp_path], tmp_path / "index.lock") == []


@contextmanager
def another_users_process(monkeypatch: pytest.MonkeyPatch, cwd: Path) -> Iterator[subprocess.Popen]:
    """A process working in `cwd` whose folder procfs hides, as another user's from a worker that is not root."""
    theirs = subprocess.Popen(["sleep", "60"], cwd=cwd)
    readlink = os.readlink

    def unseen(path, *args, **kw):
        if path == f"/proc/{theirs.pid}/cwd":
            raise PermissionError(path)
        return readlink(path, *args, **kw)

    monkeypatch.setattr(os, "readlink", unseen)
    try:
        yield theirs
    finally:
        theirs.kill()
        theirs.wait()


async def test_a_branch_lock_kept_for_another_users_git_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The lock kept because another user's git runs (its folder unseen) was logged as kept for want of procfs,
    which sent the operator looking for the wrong cause."""
    root = dev_project(tmp_path)
    wt = await ensure_worktree(str(root), "s1", STORY)
    lock = ref_lock(root, wt.branch)
    lock.write_bytes(b"")
    with another_users_process(monkeypatch, tmp_path) as theirs, caplog.at_level(logging.WARNING):
        monkeypatch.setattr(process, "_command_name", lambda pid: "git" if pid == str(theirs.pid) else "")
        assert await ActivityEnvironment().run(git_ops.remove_stale_locks, wt, str(root)) == []
    assert lock.exists()
    assert "unknown, another user's git runs, its folder unseen" in caplog.text and "no procfs" not in caplog.text


async def test_no_other_refs_lock_is_touched(tmp_path: Path) -> None:
    """Only the story's own branch is BSO's: the user's branch, another story's, packed-refs are not, stale or not."""
    root = dev_project(tmp_path)
    wt = await ensure_worktree(str(root), "s1", STORY)
    other = await ensure_worktree(str(root), "s1", "1-2-other")
    users = git(root, "symbolic-ref", "--short", "HEAD").strip()
    theirs = [ref_lock(root, users), ref_lock(root, other.branch), ref_lock(root, f"{wt.branch}-2"),
              root / ".git" / "packed-refs.lock", root / ".git" / "refs" / "tags" / f"{wt.branch}.lock"]
    for lock in [ref_lock(root, wt.branch), *theirs]:
        lock.parent.mkdir(parents=True, exist_ok=True)
        lock.write_bytes(b"")
    assert await ActivityEnvironment().run(git_ops.remove_stale_locks, wt, str(root)) == [ref_lock(root, wt.branch)]
    assert all(lock.exists() for lock in theirs)


@pytest.mark.parametrize("repo", ["folder-of-a-repo", "no-commit", "bso-branch", "sprint-branch"])
async def test_a_repository_the_backend_cannot_work_in_is_named_before_its_first_worktree(tmp_path: Path, repo: str) -> None:
    """A project in a folder of a repository (a monorepo) ran agents and verification at the repository's root
    and spent every fix round; no commit yet, or a branch named `bso`, failed with git's words after retries."""
    if repo == "folder-of-a-repo":
        outer = make_git_project(tmp_path / "mono")
        root = outer / "apps" / "web"
        root.mkdir(parents=True)
        expected = "is a folder of the git repository"
    elif repo == "no-commit":
        root = tmp_path / "fresh"
        root.mkdir()
        git(root, "init", "-q")
        expected = "has no commit yet"
    elif repo == "bso-branch":
        root = dev_project(tmp_path)
        git(root, "branch", "bso")
        expected = "a branch named `bso` exists"
    else:  # in the way of this sprint's branches only: found by `bso sprint start`, before the story-creator ran
        root = dev_project(tmp_path)
        git(root, "branch", "bso/s1")
        expected = "a branch named `bso/s1` exists: git cannot make this sprint's story branches bso/s1/<story>"
        assert await git_ops.repo_problem(str(root)) is None and await git_ops.repo_problem(str(root), "s2") is None
        assert expected in (await git_ops.repo_problem(str(root), "s1") or "")
    with pytest.raises(ApplicationError) as refused:
        await ensure_worktree(str(root), "s1", STORY)
    assert expected in refused.value.message and refused.value.non_retryable
    assert refused.value.type == "AgentConfigError"


async def test_a_merge_of_the_users_under_way_is_left_alone(tmp_path: Path) -> None:
    """The user was resolving a conflicted merge of their own when the story finished: BSO's merge failed on it,
    and its `merge --abort` then threw away the user's merge and their resolution."""
    root = dev_project(tmp_path)
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.SUCCESS, done.error
    (root / "notes.txt").write_text("base\n")
    git(root, "add", "notes.txt")
    git(root, "commit", "-q", "-m", "notes")
    git(root, "checkout", "-q", "-b", "feature")
    (root / "notes.txt").write_text("feature\n")
    git(root, "commit", "-q", "-am", "feature notes")
    git(root, "checkout", "-q", "main")
    (root / "notes.txt").write_text("mainline\n")
    git(root, "commit", "-q", "-am", "main notes")
    assert subprocess.run(["git", "-C", str(root), "merge", "-q", "feature"], capture_output=True).returncode != 0
    (root / "notes.txt").write_text("my careful resolution\n")
    tip = git(root, "rev-parse", f"bso/s1/{STORY}").strip()
    result = await finish(root)
    assert not result.merged and "in the middle of a merge" in result.note
    assert (root / ".git" / "MERGE_HEAD").exists()
    assert (root / "notes.txt").read_text() == "my careful resolution\n"
    assert git(root, "rev-parse", f"bso/s1/{STORY}").strip() == tip and worktree_path(str(root), "s1", STORY).exists()


async def test_a_detached_head_takes_no_story_work(tmp_path: Path) -> None:
    """On a detached HEAD the story's work was merged onto no branch and its branch then cleared: the sprint said
    complete, and the work was left only in the reflog."""
    root = dev_project(tmp_path)
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.SUCCESS, done.error
    git(root, "checkout", "-q", "--detach", "HEAD")
    head_before, tip = git(root, "rev-parse", "HEAD").strip(), git(root, "rev-parse", f"bso/s1/{STORY}").strip()
    result = await finish(root, squash=False)
    assert not result.merged and "HEAD is detached" in result.note
    assert MergeOutcome.of(result).note == f"not merged: {result.note}"  # the story's error says it once
    assert MergeOutcome.of(result).note.count("not merged") == 1
    assert git(root, "rev-parse", "HEAD").strip() == head_before
    assert git(root, "rev-parse", f"bso/s1/{STORY}").strip() == tip


async def test_the_projects_merge_hooks_do_not_run_on_the_storys_merge(tmp_path: Path) -> None:
    root = dev_project(tmp_path, agents_toml='\n[git]\nmerge = "merge"\n')
    hook = root / ".git" / "hooks" / "pre-merge-commit"
    hook.write_text("#!/bin/sh\necho refusing >&2\nexit 1\n")
    hook.chmod(0o755)
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.SUCCESS, done.error
    result = await finish(root)
    assert result.merged, result.note


# Every hook BSO's own git could run: its commits (--no-verify leaves prepare-commit-msg and post-commit), the
# worktree's checkout, the merge, ref updates, index writes (the fix rollback's reset, the reviewer's set-aside).
USER_HOOKS = (
    "pre-commit", "prepare-commit-msg", "commit-msg", "post-commit", "pre-merge-commit", "post-merge",
    "post-checkout", "reference-transaction", "post-index-change", "pre-auto-gc", "post-rewrite",
)


def failing_hooks(root: Path, log: Path) -> None:
    """The user's hooks, each logging its name and failing; an agent's own git (it has BSO_STORY_KEY) runs them
    as usual, and they let it through."""
    for name in USER_HOOKS:
        hook = root / ".git" / "hooks" / name
        hook.write_text(f'#!/bin/sh\n[ -n "$BSO_STORY_KEY" ] && exit 0\necho {name} >> {log}\nexit 1\n')
        hook.chmod(0o755)


async def test_a_failing_post_checkout_hook_does_not_stop_the_storys_worktree(tmp_path: Path) -> None:
    """`git worktree add` ran the project's post-checkout hook: a failing one failed the worktree, five times."""
    root, log = dev_project(tmp_path), tmp_path / "hooks.log"
    failing_hooks(root, log)
    wt = await ensure_worktree(str(root), "s1", STORY)
    assert (Path(wt.path) / ".git").exists() and not log.exists(), log.read_text() if log.exists() else ""


@pytest.mark.parametrize("merge", ["ff", "merge"])
async def test_the_projects_hooks_run_on_none_of_bsos_own_git(tmp_path: Path, merge: str) -> None:
    """A dev dispatch (the worktree, the Exit Gate's commits), a fix rolled back (P20), a review whose edit is
    set aside, the squash, the merge and the track's clean-up run none of the user's hooks."""
    root, log = dev_project(tmp_path, agents_toml=f'\n[git]\nmerge = "{merge}"\n'), tmp_path / "hooks.log"
    failing_hooks(root, log)
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.SUCCESS, done.error
    toml = root / ".bso" / "agents.toml"
    toml.write_text(toml.read_text().replace("[profiles.fake.env]\n", '[profiles.fake.env]\nFAKE_AGENT_BEHAVIOR = "break-tests"\n'))
    fix = await ActivityEnvironment().run(command.run, assignment(root, 2, mode=AgentMode.FIX))
    assert fix.status is AgentStatus.FAILURE and "rolled back" in fix.error, fix.error
    wt = worktree_path(str(root), "s1", STORY)
    (wt / "src" / "sneaky.py").write_text("x = 1\n")  # as if the reviewer had written it
    review = await ActivityEnvironment().run(
        command.run, assignment(root, 3, AgentType.REVIEW_RUNNER, AgentMode.REVIEW)
    )
    assert any("set aside" in f.summary for f in review.findings), review
    result = await finish(root, story_title="Hello")
    assert result.merged and result.squashed, result.note
    assert not log.exists(), f"the user's hooks ran: {log.read_text().split()}"


async def test_a_project_that_signs_its_commits_does_not_make_bso_sign_its_own(tmp_path: Path) -> None:
    """commit.gpgsign with a gpg that fails (no key on the worker): the Exit Gate's commit failed, retried five
    times, and the story ended needs-intervention. BSO's own commits, squash and merge are not signed."""
    root = dev_project(tmp_path)
    git(root, "config", "commit.gpgsign", "true")
    git(root, "config", "gpg.program", "/bin/false")
    toml = root / ".bso" / "agents.toml"
    toml.write_text(toml.read_text().replace("[profiles.fake.env]\n", '[profiles.fake.env]\nFAKE_AGENT_BEHAVIOR = "no-commit"\n'))
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.SUCCESS, done.error
    result = await finish(root, story_title="Hello")
    assert result.merged and result.squashed, result.note


async def _done_story(tmp_path: Path) -> tuple[Path, list[str]]:
    """A project whose story's dev dispatch succeeded: (root, the files its branch changes)."""
    root = dev_project(tmp_path)
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.SUCCESS, done.error
    changed = git(root, "diff", "--name-only", "HEAD", f"bso/s1/{STORY}").split()
    assert changed, "the story branch carries the agent's work"
    return root, changed


@pytest.mark.parametrize("crash_after", range(21))  # a clean finish runs 21 git commands
async def test_a_finish_retried_after_a_crash_at_any_step_merges_the_story(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash_after: int
) -> None:
    """The worker dies right after the n-th git command of finish_story_git; Temporal's retry must still land
    the story's work on the user's branch (not answer "already merged" for a branch reset to the base)."""
    root, changed = await _done_story(tmp_path)
    real_git, calls = git_ops.git, [0]

    async def crashing_git(cwd: str, *args: str, **kw) -> str:
        out = await real_git(cwd, *args, **kw)
        calls[0] += 1
        if calls[0] == crash_after + 1:
            raise git_ops.GitError("simulated crash")
        return out

    monkeypatch.setattr(git_ops, "git", crashing_git)
    with pytest.raises(git_ops.GitError):
        await finish(root, story_title="Hello")
    monkeypatch.setattr(git_ops, "git", real_git)
    result = await finish(root, story_title="Hello")
    assert result.merged and result.squashed, result.note
    assert set(changed) <= set(git(root, "ls-files").split())
    assert git(root, "log", "-1", "--format=%s", "--no-merges").strip() == "feat: Story 1.1: Hello"
    # Its track is cleared, even when the crash came after the merge was recorded (the retry was answered by
    # the record and left the worktree and the branch behind).
    assert not worktree_path(str(root), "s1", STORY).exists()
    assert git(root, "branch", "--list", f"bso/s1/{STORY}").strip() == ""
    # Nothing says a merge of the story is under way (the retry answered "already merged" clears it too).
    assert not Path(root, git(root, "rev-parse", "--git-dir").strip(), git_ops.MERGE_BEGUN_MARKER).exists()


async def test_a_squash_an_older_worker_left_half_done_is_finished_from_the_originals(tmp_path: Path) -> None:
    """Before commit-tree, the squash was `reset --soft <base>` then `commit`: a worker stopped between the two
    left the branch at the base, the work staged in the worktree and kept under refs/bso-originals."""
    root, changed = await _done_story(tmp_path)
    wt, branch = worktree_path(str(root), "s1", STORY), f"bso/s1/{STORY}"
    tip, base = git(root, "rev-parse", branch).strip(), git(root, "rev-parse", "HEAD").strip()
    git(root, "update-ref", f"refs/bso-originals/s1/{STORY}", tip)
    git(wt, "reset", "-q", "--soft", base)
    result = await finish(root, story_title="Hello")
    assert result.merged and result.squashed, result.note
    assert set(changed) <= set(git(root, "ls-files").split())
    assert git(root, "rev-parse", f"refs/bso-originals/s1/{STORY}").strip() == tip


async def test_merge_mode_always_makes_a_merge_commit(tmp_path: Path) -> None:
    root = dev_project(tmp_path, agents_toml='\n[git]\nmerge = "merge"\n')
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.SUCCESS, done.error
    result = await finish(root)
    assert result.merged and result.squashed
    parents = git(root, "log", "-1", "--format=%P").split()
    assert len(parents) == 2 and git(root, "log", "-1", "--format=%s").startswith("Merge feat: Story 1.1")


async def test_stories_finishing_at_once_all_merge(tmp_path: Path) -> None:
    """Slaves run in parallel: their merges into the user's checkout take turns (one repo lock), none fails
    on git's index.lock."""
    root = dev_project(tmp_path)
    keys = [f"1-{n}-story-{n}" for n in range(1, 7)]
    for key in keys:
        wt = await ensure_worktree(str(root), "s1", key)
        (Path(wt.path) / f"{key}.txt").write_text(key)
        git(wt.path, "add", f"{key}.txt")
        git(wt.path, "commit", "-q", "-m", f"work on {key}")
    results = await asyncio.gather(*(
        ActivityEnvironment().run(
            finish_story_git, FinishStoryInput(project_root=str(root), session_id="s1", story_key=key, story_title=key)
        )
        for key in keys
    ))
    assert all(r.merged for r in results), [r.note for r in results]
    files = git(root, "ls-files").split()
    assert all(f"{key}.txt" in files for key in keys)


async def test_verification_overrides_a_false_success(tmp_path: Path) -> None:
    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="break-tests")
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.FAILURE
    assert "verification failed" in done.error and "FAIL" in done.error
    assert done.error_type == VERIFICATION_FAILED and done.recoverable  # bso.dispatch routes it to a fix
    # ... and the output goes into the next fix assignment's prompt.
    fix = assignment(root, n=2, mode=AgentMode.FIX)
    (root / ".bso" / "agents.toml").write_text(
        (root / ".bso" / "agents.toml").read_text().replace('FAKE_AGENT_BEHAVIOR = "break-tests"', "")
    )
    fixed = await ActivityEnvironment().run(command.run, fix)
    prompt = (command.run_dir_for(str(root), fix.dispatch_id) / "prompt.md").read_text()
    assert "the last verification run failed" in prompt and "FAIL" in prompt
    assert fixed.status is AgentStatus.SUCCESS, fixed.error


async def test_out_of_scope_changes_are_findings(tmp_path: Path) -> None:
    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="out-of-scope")
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.SUCCESS, done.error
    assert [f.file for f in done.findings] == ["docs/notes.md"]


async def test_dev_without_changes_fails(tmp_path: Path) -> None:
    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="no-changes")
    time.sleep(1.1)  # the project's first commit, a second before the agent (git's reflog keeps whole seconds)
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.FAILURE and "empty diff" in done.error
    assert "meanwhile" not in done.error, done.error  # nothing else happened in the checkout


@pytest.mark.parametrize("commits", [True, False], ids=["commits", "leaves-files"])
async def test_a_dev_agent_that_works_in_the_project_root_is_told_where_its_work_is(tmp_path: Path, commits) -> None:
    """It worked in $BSO_PROJECT_ROOT instead of its worktree, committing onto the user's branch or not: BSO said
    only "empty diff". It now says what changed in the checkout meanwhile, BSO's own writes and merges aside,
    and leaves it there."""
    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="in-project-root" + ("" if commits else ",no-commit"))
    time.sleep(1.1)  # as above
    merged_before = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.FAILURE and "empty diff" in done.error, done.error
    assert "$BSO_PROJECT_ROOT instead of its worktree" in done.error, done.error
    if commits:
        assert "main moved 1 time(s) (" in done.error and " commit: implement 1-1" in done.error, done.error
        assert "uncommitted changes to src/story_1_1_" in done.error, done.error  # its last file, left
    else:
        assert "main moved" not in done.error and "uncommitted changes to src/, tests/" in done.error, done.error
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD~1" if commits else "HEAD"], capture_output=True, text=True)
    assert head.stdout == merged_before  # left as it is


def test_a_checkouts_moves_are_read_from_its_reflog_bsos_merges_and_older_ones_aside() -> None:
    reflog = "\n".join([
        "c3\x1fmain@{200}\x1fcommit: fix tests",
        "m2\x1fmain@{150}\x1fmerge bso/s1/1-2-logout: Fast-forward",
        "c1\x1fmain@{120}\x1freset: moving to HEAD~1",
        "c0\x1fmain@{99}\x1fcommit: older than the dispatch",
        "garbled line",
    ])
    assert checkout_moves(reflog, 100) == [("c1", "reset: moving to HEAD~1"), ("c3", "commit: fix tests")]
    assert work_outside_worktree("main", [], []) is None
    said = work_outside_worktree("main", [(f"c{i}", f"commit: {i}") for i in range(4)], [f"f{i}" for i in range(6)])
    assert said is not None and "main moved 4 time(s) (c0 commit: 0; c1 commit: 1; c2 commit: 2; ...)" in said
    assert "uncommitted changes to f0, f1, f2, f3, f4, ..." in said


async def test_a_rearmed_storys_dev_run_that_finds_the_work_on_its_branch_is_not_an_empty_diff(tmp_path: Path) -> None:
    """A story rearmed after its work was committed (it failed later on) runs in the same worktree: a dev-runner
    that finds the work done changes nothing, and the story goes on to its checks and review. It failed with
    "empty diff" (the workaround was a rearm to review)."""
    root = dev_project(tmp_path)
    first = await ActivityEnvironment().run(command.run, assignment(root, n=1))
    assert first.status is AgentStatus.SUCCESS, first.error
    toml = root / ".bso" / "agents.toml"
    toml.write_text(toml.read_text().replace("FAKE_AGENT_LEDGER", 'FAKE_AGENT_BEHAVIOR = "no-changes"\nFAKE_AGENT_LEDGER', 1))
    again = await ActivityEnvironment().run(command.run, assignment(root, n=2))
    assert [r["dispatch_id"] for r in runs(tmp_path)] == ["s1/batch-1/1-1/1", "s1/batch-1/1-1/2"]
    assert again.status is AgentStatus.SUCCESS, again.error


async def test_a_story_an_earlier_sprint_left_unmerged_goes_on_from_that_work(tmp_path: Path) -> None:
    """Sprint s0 stopped (shutdown) with the story at review, its code committed on bso/s0/<story>. The next
    sprint's branch started from HEAD: its review found nothing, the story was done, "sprint-complete", and
    the code never reached the project. It starts from HEAD with that work merged in now (from the old branch
    alone, a dependency merged since was missing), and its squash carries it."""
    root = dev_project(tmp_path)
    earlier = await ensure_worktree(str(root), "s0", STORY)
    agent_commit(earlier.path, "feat: the story's code", {b"feature.py": b"x = 1\n"})
    agent_commit(earlier.path, "fix: review", {b"feature.py": b"x = 2\n"})
    agent_commit(str(root), "a dependency merged since", {b"dep.py": b"y = 1\n"})
    now = git(root, "rev-parse", "HEAD").strip()
    wt = await ensure_worktree(str(root), "s1", STORY)
    assert (Path(wt.path) / "feature.py").read_text() == "x = 2\n" and (Path(wt.path) / "dep.py").exists()
    assert wt.base == now, wt
    result = await finish(root)
    assert result.merged and result.squashed, result
    assert git(root, "show", "HEAD:feature.py") == "x = 2\n" and git(root, "show", "HEAD:dep.py") == "y = 1\n"
    # Its commits are still not in HEAD (squashed), but a later sprint does not take them up again.
    assert git(root, "branch", "--list", earlier.branch).strip()
    third = await ensure_worktree(str(root), "s2", STORY)
    assert git(third.path, "rev-parse", "HEAD").strip() == git(root, "rev-parse", "HEAD").strip()


async def test_an_earlier_sprints_work_merged_as_a_squash_is_not_taken_again(tmp_path: Path) -> None:
    """Its commits are not in HEAD (a squash merged them as another), but a merge of it would change nothing."""
    root = dev_project(tmp_path)
    earlier = await ensure_worktree(str(root), "s0", STORY)
    agent_commit(earlier.path, "feat", {b"feature.py": b"x = 1\n"})
    git(root, "merge", "-q", "--squash", earlier.branch)
    git(root, "-c", "user.email=a@b", "-c", "user.name=u", "commit", "-qm", "squashed by hand")
    now = git(root, "rev-parse", "HEAD").strip()
    wt = await ensure_worktree(str(root), "s1", STORY)
    assert wt.base == now and git(wt.path, "rev-parse", "HEAD").strip() == now


@pytest.mark.parametrize("git_says", ["conflict", "old-git"])
async def test_an_earlier_sprints_work_that_does_not_merge_ends_the_story_naming_its_branch(
    tmp_path: Path, monkeypatch, git_says: str
) -> None:
    """Work git cannot merge with HEAD (or a git too old to try it aside) is left to a human, named: never dropped
    (the story done without it), never taken over HEAD's own changes."""
    root = dev_project(tmp_path)
    earlier = await ensure_worktree(str(root), "s0", STORY)
    agent_commit(earlier.path, "feat", {b"feature.py": b"x = 1\n"})
    agent_commit(str(root), "the same file, otherwise", {b"feature.py": b"x = 42\n"})
    if git_says == "old-git":
        agent_commit(str(root), "no conflict", {b"feature.py": b"x = 1\n"})
        agent_commit(str(root), "no conflict", {b"other.py": b"z = 1\n"})
        original = git_ops.run_command

        async def git_2_37(argv, *args, **kwargs):
            if "merge-tree" in argv:
                return Finished(returncode=129, output="usage: git merge-tree <base-tree> <branch1> <branch2>", timed_out=False)
            return await original(argv, *args, **kwargs)

        monkeypatch.setattr(git_ops, "run_command", git_2_37)
    with pytest.raises(ApplicationError) as refused:
        await ensure_worktree(str(root), "s1", STORY)
    assert refused.value.non_retryable and refused.value.type == "AgentConfigError"
    said = str(refused.value)
    assert f"an earlier sprint's unmerged work on {STORY} (branch {earlier.branch})" in said, said
    assert ("does not merge cleanly" if git_says == "conflict" else "needs git 2.38 or later") in said, said
    assert f"`git branch -D {earlier.branch}`" in said


async def test_an_earlier_sprints_merged_work_is_not_taken_again(tmp_path: Path) -> None:
    """Only work the project lacks is carried over: a branch already merged (an ancestor of HEAD) is not."""
    root = dev_project(tmp_path)
    earlier = await ensure_worktree(str(root), "s0", STORY)
    agent_commit(earlier.path, "feat", {b"feature.py": b"x = 1\n"})
    git(root, "merge", "-q", "--ff-only", earlier.branch)
    now = git(root, "rev-parse", "HEAD").strip()
    wt = await ensure_worktree(str(root), "s1", STORY)
    assert wt.base == now and git(wt.path, "rev-parse", "HEAD").strip() == now


async def test_a_story_set_back_after_its_merge_still_needs_new_work_from_its_dev_run(tmp_path: Path) -> None:
    """Merged, then set back by hand: its branch holds nothing the project lacks, so a dev run that changes
    nothing is still an empty diff (the story would be done again with no new work)."""
    root = dev_project(tmp_path)
    first = await ActivityEnvironment().run(command.run, assignment(root, n=1))
    assert first.status is AgentStatus.SUCCESS, first.error
    merged = await finish(root, clear_track=False)
    assert merged.merged, merged
    toml = root / ".bso" / "agents.toml"
    toml.write_text(toml.read_text().replace("FAKE_AGENT_LEDGER", 'FAKE_AGENT_BEHAVIOR = "no-changes"\nFAKE_AGENT_LEDGER', 1))
    again = await ActivityEnvironment().run(command.run, assignment(root, n=2))
    assert again.status is AgentStatus.FAILURE and "empty diff" in again.error, again


async def test_crash_is_a_failure_and_cli_json_is_parsed_without_result_file(tmp_path: Path) -> None:
    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="crash")
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.FAILURE and "no AGENT_COMPLETE" in done.error
    # Why it crashed, from its stderr (the reason said only `last output: ''`).
    assert done.error.endswith("(exit code 3; last output: ''; last error output: 'Traceback: fake crash')"), done.error

    root2 = dev_project(tmp_path / "b", FAKE_AGENT_BEHAVIOR="no-result-file")
    done2 = await ActivityEnvironment().run(command.run, assignment(root2))
    assert done2.status is AgentStatus.SUCCESS, done2.error
    assert done2.summary.startswith("fake dev-runner/dev")


async def test_a_cli_that_echoes_its_prompt_is_answered_by_its_own_words_never_the_prompts_example(
    tmp_path: Path,
) -> None:
    """A plain-text CLI that repeats its prompt, which shows an example AGENT_COMPLETE (`success`), and ends with
    no answer had the example taken for its answer: a success it never claimed. It is no answer, said so."""
    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="echo-prompt,no-answer")
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.FAILURE, done
    assert done.error.startswith(
        "no AGENT_COMPLETE of the agent's own: its output only repeats the example answer of its prompt (exit code 0;"
    ), done.error

    root2 = dev_project(tmp_path / "b", FAKE_AGENT_BEHAVIOR="echo-prompt,no-result-file")  # its answer after the echo
    done2 = await ActivityEnvironment().run(command.run, assignment(root2))
    assert done2.status is AgentStatus.SUCCESS, done2.error
    assert done2.summary.startswith("fake dev-runner/dev")


async def test_the_agents_output_is_parsed_while_the_event_loop_runs_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI's output was read and parsed on the worker's event loop: 100 MB took 27 s, in which no heartbeat
    and no other activity of the worker ran. Here the parse waits until a coroutine of the loop has run: on the
    loop itself it never could (it waits 10 s in vain)."""
    import hashlib
    import threading

    from bso import agent_output

    loop = asyncio.get_running_loop()
    waited: list[bool] = []
    usage_of = agent_output._usage_of

    def usage_once_the_loop_has_run(doc: dict) -> agent_output.TokenUse:
        if not waited:
            ran = threading.Event()

            async def concurrent() -> None:
                ran.set()

            asyncio.run_coroutine_threadsafe(concurrent(), loop)
            waited.append(ran.wait(10))
        return usage_of(doc)

    monkeypatch.setattr(agent_output, "_usage_of", usage_once_the_loop_has_run)
    root = dev_project(tmp_path)
    a = assignment(root)
    done = await ActivityEnvironment().run(command.run, a)
    assert waited == [True], "the output was parsed on the event loop: no coroutine ran meanwhile"
    assert done.status is AgentStatus.SUCCESS and done.tokens_used == 1000 + 200 + 500, done
    stdout = (command.run_dir_for(str(root), a.dispatch_id) / "stdout.log").read_bytes()
    assert f"sha256:{hashlib.sha256(stdout).hexdigest()[:16]}]" in done.summary  # the transcript's, as sha256sum says


async def test_a_long_output_is_read_line_by_line_holding_only_its_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An output of hundreds of MB was held whole, then copied to hash it. Past WHOLE_OUTPUT_BYTES it is read line
    by line, its end alone held: what it says and its hash are those of the whole."""
    import hashlib

    monkeypatch.setattr(command, "WHOLE_OUTPUT_BYTES", 2**20)  # (8 MB: smaller outputs keep the test quick)

    example = {"msg_type": "AGENT_COMPLETE", "status": "success", "summary": "one paragraph: what you did"}
    (tmp_path / "prompt.md").write_text("Answer like this:\n```json\n" + json.dumps(example, indent=2) + "\n```\n")
    turn = json.dumps({"type": "turn.completed", "usage": {"input_tokens": 10, "output_tokens": 2}})
    command_output = json.dumps({"type": "item.completed", "item": {"type": "command_execution", "aggregated_output": "x" * 400}})
    answer = json.dumps({"type": "item.completed", "item": {"type": "agent_message", "text": '{"status": "success"}'}})
    outputs = {
        "json-lines": "\n".join([turn, command_output] * 8_000 + [answer, ""]),
        "plain text, its prompt echoed last": "build step ok\n" * 400_000 + (tmp_path / "prompt.md").read_text(),
    }
    for kind, text in outputs.items():
        (tmp_path / "stdout.log").write_text(text)
        size = (tmp_path / "stdout.log").stat().st_size
        assert size > command.WHOLE_OUTPUT_BYTES, kind
        tracemalloc.start()
        try:
            streamed = command._read_output(tmp_path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < size / 4, (kind, peak, size)
        assert streamed[1] == hashlib.sha256(text.encode()).hexdigest()
        with monkeypatch.context() as m:
            m.setattr(command, "WHOLE_OUTPUT_BYTES", size)
            assert command._read_output(tmp_path) == streamed, kind
        print(f"\n{kind}: {size / 1e6:.0f} MB read holding at most {peak / 1e6:.1f} MB")
    assert streamed[0].complete is None and streamed[0].echoed_prompt
    (tmp_path / "stdout.log").write_text(outputs["json-lines"])
    read = command._read_output(tmp_path)[0]
    assert read.complete == {"status": "success"} and read.tokens.weighted(1.0) == 8_000 * 12

    longest_stall = 0.0  # a figure to look at, not to assert on: how long the loop waited at most meanwhile
    reading = asyncio.ensure_future(asyncio.to_thread(command._read_output, tmp_path))
    started = last = time.monotonic()
    while not reading.done():
        await asyncio.sleep(0.01)
        longest_stall, last = max(longest_stall, time.monotonic() - last), time.monotonic()
    await reading
    print(f"read in a thread in {time.monotonic() - started:.2f} s; the event loop waited {longest_stall * 1000:.0f} ms at most")


@pytest.mark.parametrize(
    ("behavior", "said"),
    [("result-dir", "BSO_RESULT_FILE cannot be read: Is a directory"), ("result-deep", "BSO_RESULT_FILE is not JSON: nested too deep")],
)
async def test_an_unreadable_result_file_is_the_agents_failure_said_in_a_few_words(
    tmp_path: Path, behavior: str, said: str
) -> None:
    """It failed the activity on every attempt, and the story ended with a raw Python error."""
    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR=behavior)
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.FAILURE and done.error == said, done.error


async def test_a_fifo_as_the_result_file_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A FIFO at $BSO_RESULT_FILE with no writer: its open blocked for ever, the dispatch never answered (each retry
    blocked again, holding a worker thread for good)."""
    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="result-fifo")
    a = assignment(root)
    result_file = command.run_dir_for(str(root), a.dispatch_id) / "result.json"
    run = asyncio.ensure_future(ActivityEnvironment().run(command.run, a))
    done = None
    try:
        done = await asyncio.wait_for(asyncio.shield(run), 60)
    except TimeoutError:
        pass
    finally:
        if done is None and result_file.exists():  # a writer lets the blocked reader go (EOF), and the test end
            os.close(os.open(result_file, os.O_WRONLY | os.O_NONBLOCK))
        await asyncio.wait([run], timeout=30)
    assert done is not None, "the dispatch hung reading the FIFO at BSO_RESULT_FILE"
    assert done.status is AgentStatus.FAILURE and done.error == (
        "BSO_RESULT_FILE is not a regular file (a FIFO, socket or device?): write the answer to a plain file there"
    ), done.error


async def test_a_story_file_saved_in_another_encoding_is_read_past_its_odd_bytes(tmp_path: Path) -> None:
    """A story file a cp1252 editor saved (`Caf\\xe9`) failed the dev agent's activity on every attempt with
    "'utf-8' codec can't decode byte 0xe9", naming no file."""
    root = dev_project(tmp_path)
    (root / STORY_PATH).write_bytes(STORY_TEXT.encode().replace(b"\n", b"\nCaf\xe9 notes\n", 1))
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.SUCCESS, done.error


async def test_the_merge_waits_out_a_moment_of_the_users_own_git(tmp_path: Path) -> None:
    """An IDE's `git status` held the checkout's index.lock for a second: the merge stopped half-way with "fix
    conflicts" (there were none), its abort failed on the same lock, and MERGE_HEAD stayed in the user's checkout,
    so every later story said it was in the middle of a merge."""
    root = dev_project(tmp_path)
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.SUCCESS, done.error
    lock = root / ".git" / "index.lock"
    lock.write_text("")

    async def release() -> None:
        await asyncio.sleep(1.0)
        lock.unlink()

    released = asyncio.create_task(release())
    result = await finish(root)
    await released
    assert result.merged, result.note
    assert not (root / ".git" / "MERGE_HEAD").exists()
    assert "src/story_1_1_hello_world.py" in git(root, "ls-files", "src").split()


@pytest.mark.parametrize("held", [False, True], ids=["left-by-a-killed-git", "held-by-a-live-git"])
async def test_an_index_lock_no_git_holds_in_the_users_checkout_is_removed_before_the_merge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: bool
) -> None:
    """A worker killed with its children in the middle of the merge into the checkout (a container stopped) left
    the checkout's index.lock: the retry's merge failed ("worktree kept"), the story was never merged, and the
    user's own git failed on the lock. One no git holds goes; one a git working in the checkout may hold stays."""
    monkeypatch.setattr(git_ops, "INDEX_LOCK_PATIENCE_SECONDS", 0.5)
    root = dev_project(tmp_path)
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.SUCCESS, done.error
    lock = root / ".git" / "index.lock"
    lock.write_text("")
    live = subprocess.Popen(["git", "hash-object", "--stdin"], cwd=root, stdin=subprocess.PIPE) if held else None
    try:
        result = await finish(root)
    finally:
        if live is not None:
            live.communicate(b"")
    if held:
        assert not result.merged and lock.exists(), result
    else:
        assert result.merged, result.note
        assert not lock.exists() and not (root / ".git" / "MERGE_HEAD").exists()
        assert "src/story_1_1_hello_world.py" in git(root, "ls-files", "src").split()


async def test_a_check_that_leaves_a_child_running_is_done_when_it_exits(tmp_path: Path) -> None:
    """A verification command that left a server or a watcher running held the check for its whole timeout
    (up to 900 s), then reported it timed out; the child is killed, the command's output and exit code kept."""
    pid_file = tmp_path / "child.pid"
    began = time.monotonic()
    done = await run_command(["sh", "-c", f"sleep 60 & echo $! > {pid_file}; echo '3 passed'"], cwd=str(tmp_path), timeout=30)
    assert (done.returncode, done.output, done.timed_out) == (0, "3 passed\n", False)
    assert time.monotonic() - began < 15
    assert await gone(int(pid_file.read_text()), seconds=5)


async def test_a_child_a_check_started_in_a_session_of_its_own_goes_with_it(tmp_path: Path) -> None:
    """`setsid server &`, a daemon holding the check's output: out of the command's process group, it outlived
    the kill and held the output (and the worker's pipe) for its whole life."""
    started = "import subprocess, sys; print(subprocess.Popen(['sleep', '60'], start_new_session=True).pid)"
    done = await run_command([sys.executable, "-c", started], cwd=str(tmp_path), timeout=30)
    assert done.returncode == 0 and not done.timed_out, done
    assert await gone(int(done.output), seconds=5)
    out_of_time = await run_command(
        ["sh", "-c", f"{sys.executable} -c \"{started}\"; sleep 60"], cwd=str(tmp_path), timeout=2, grace=1
    )
    assert out_of_time.timed_out, out_of_time
    assert await gone(int(out_of_time.output), seconds=5)


async def test_a_check_that_exits_just_in_time_is_not_out_of_time(tmp_path: Path) -> None:
    """Its exit was looked at after the deadline: one that exited at 0.85 s of 1 s, leaving a child, timed out."""
    done = await run_command(["sh", "-c", "sleep 30 & sleep 0.85; echo done"], cwd=str(tmp_path), timeout=1, grace=1)
    assert (done.returncode, done.output, done.timed_out) == (0, "done\n", False), done


async def test_a_check_out_of_time_keeps_what_it_printed(tmp_path: Path) -> None:
    """It was thrown away: the fix agent and the user saw an empty output."""
    done = await run_command(["sh", "-c", "echo '2 passed, 1 hanging'; sleep 60"], cwd=str(tmp_path), timeout=1, grace=1)
    assert done.timed_out and done.returncode is None and done.output == "2 passed, 1 hanging\n", done
    quiet = await run_command(["sh", "-c", "exec >/dev/null 2>&1; sleep 60"], cwd=str(tmp_path), timeout=1, grace=1)
    assert quiet.timed_out and quiet.output == "", quiet  # its output closed, it is still held to its time


async def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids.json"
    root = dev_project(  # 4 s: the launcher and the agent (two Python start-ups) speak first on a busy machine
        tmp_path, agents_toml="\n[agents.dev-runner]\ntimeout_seconds = 4\n",
        FAKE_AGENT_BEHAVIOR="hang", FAKE_AGENT_PIDS=str(pids),
    )
    env = ActivityEnvironment()
    beats: list = []
    env.on_heartbeat = lambda *details: beats.append(details[0])
    done = await env.run(command.run, assignment(root))
    assert done.status is AgentStatus.FAILURE and "timed out" in done.error
    agent_beats = [b for b in beats if "pid" in b]  # while the agent runs; then {"phase": "checking"}
    assert agent_beats and {"elapsed_s", "last_line", "pid"} <= set(agent_beats[-1])
    assert beats[-1].get("phase") == "checking"
    assert any(b.get("last_line") == "working very hard" for b in beats)  # (the worktree's beats come first)
    recorded = json.loads(pids.read_text())
    assert len(recorded) == 3
    assert await gone(*recorded), recorded


async def test_cancellation_kills_the_whole_process_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids.json"
    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="hang", FAKE_AGENT_PIDS=str(pids))
    env = ActivityEnvironment()
    task = asyncio.create_task(env.run(command.run, assignment(root)))
    for _ in range(300):
        if pids.exists() and pids.read_text():
            break
        await asyncio.sleep(0.1)
    recorded = json.loads(pids.read_text())
    env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await gone(*recorded), recorded


async def test_missing_cli_is_a_non_retryable_config_error(tmp_path: Path) -> None:
    root = dev_project(tmp_path, agents_toml='\n[agents.dev-runner]\nprofile = "gone"\n[profiles.gone]\nargv = ["no-such-agent-cli-xyz", "{prompt}"]\n')
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(command.run, assignment(root))
    assert err.value.type == "AgentConfigError" and err.value.non_retryable
    assert "'gone'" in err.value.message


async def test_an_env_name_no_process_takes_is_a_config_error_naming_it(tmp_path: Path) -> None:
    """`"BAD=NAME" = "1"` in a profile's env: each dispatch failed, retried, on Python's bare "illegal environment
    variable name", naming neither the key, the profile nor the file."""
    root = dev_project(tmp_path)
    toml = root / ".bso" / "agents.toml"
    toml.write_text(toml.read_text().replace("[profiles.fake.env]\n", '[profiles.fake.env]\n"BAD=NAME" = "1"\n', 1))
    git(root, "commit", "-qam", "agents env")
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(command.run, assignment(root))
    assert err.value.type == "AgentConfigError" and err.value.non_retryable
    assert "agents.toml: profiles.fake.env.BAD=NAME.[key]: Value error, the environment variable name 'BAD=NAME'" in (
        err.value.message
    ), err.value.message


async def test_unsafe_story_path_is_refused(tmp_path: Path) -> None:
    root = dev_project(tmp_path)
    bad = assignment(root).model_copy(update={"story_path": "../../etc/passwd"})
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(command.run, bad)
    assert err.value.type == "AgentConfigError"
    bad_key = assignment(root).model_copy(update={"story_key": "../x"})
    with pytest.raises(ApplicationError):
        await ActivityEnvironment().run(command.run, bad_key)


async def test_a_retry_first_kills_the_previous_attempts_orphan(tmp_path: Path) -> None:
    """A worker killed hard leaves its agent running; the retry stops that process group first."""
    import subprocess

    root = dev_project(tmp_path)
    a = assignment(root)
    orphan = subprocess.Popen(["sleep", "300"], start_new_session=True)
    run_dir = command.run_dir_for(str(root), a.dispatch_id)
    (run_dir / "pid.json").write_text(json.dumps({"pid": orphan.pid, "pgid": orphan.pid, "attempt": 1}))
    done = await ActivityEnvironment().run(command.run, a)
    assert done.status is AgentStatus.SUCCESS, done.error
    assert orphan.wait(timeout=10) is not None


# Attempt 1 of the dispatch in a worker process of its own, killed with SIGKILL like a worker killed hard.
ATTEMPT = (
    "import asyncio, os, sys\n"
    "from temporalio.testing import ActivityEnvironment\n"
    "from activities.backends import command\n"
    "from bso.messages import TaskAssignment\n"
    "command.LAUNCHER_BACKSTOP_SECONDS = float(os.environ.get('TEST_BACKSTOP', command.LAUNCHER_BACKSTOP_SECONDS))\n"
    "asyncio.run(ActivityEnvironment().run(command.run, TaskAssignment.model_validate_json(sys.argv[1])))\n"
)


async def _worker_killed_while_its_agent_runs(tmp_path: Path, a: TaskAssignment, backstop: float | None = None) -> int:
    """Attempt 1 starts the agent, then its worker is killed hard (the agent, in its own process group, is
    left running): the agent's pid. `backstop`: the launcher's LAUNCHER_BACKSTOP_SECONDS in that worker."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, **({"TEST_BACKSTOP": str(backstop)} if backstop is not None else {})}
    worker = subprocess.Popen([sys.executable, "-c", ATTEMPT, a.model_dump_json()], cwd=repo, env=env)
    try:
        for _ in range(300):
            if runs(tmp_path) or worker.poll() is not None:
                break
            await asyncio.sleep(0.1)
        assert len(runs(tmp_path)) == 1, "the agent never started"
    finally:
        worker.kill()
        worker.wait()
    pid = runs(tmp_path)[0]["pid"]
    assert alive(pid)  # the orphan agent runs on
    return pid


async def test_an_orphan_agent_no_retry_adopts_is_stopped_by_its_launcher_at_its_deadline(tmp_path: Path, monkeypatch) -> None:
    """kill -9 of the worker while its agent works, and no retry of the dispatch comes (its deadline passed on
    the server, or the retry runs on another host): the launcher holds the agent to its timeout itself (plus
    the backstop) and records the timeout. It ran on with no limit."""
    root = dev_project(
        tmp_path, agents_toml="\n[agents.dev-runner]\ntimeout_seconds = 2\n", FAKE_AGENT_BEHAVIOR="slow", FAKE_AGENT_SLEEP="60"
    )
    a = assignment(root)
    pid = await _worker_killed_while_its_agent_runs(tmp_path, a, backstop=1)
    monkeypatch.setattr(command, "LAUNCHER_BACKSTOP_SECONDS", 1)
    assert await gone(pid, seconds=20), "the orphan agent ran past its deadline"
    exit_file = command.run_dir_for(str(root), a.dispatch_id) / "exit.json"

    async def recorded() -> bool:  # the launcher writes it once the agent it stopped is gone
        return exit_file.exists()

    await poll_until(recorded, "the launcher's exit record", timeout=10)
    exited = json.loads(exit_file.read_text())
    assert (exited["timed_out"], exited["returncode"], exited["dispatch_id"]) == (True, None, a.dispatch_id)
    done = await ActivityEnvironment().run(command.run, a)  # a late retry reports the timeout, runs nothing
    assert done.status is AgentStatus.FAILURE and "timed out after 2s" in done.error, done.error
    assert re.search(r"by its launcher [3-9]s after it started", done.error), done.error  # what took the time
    assert len(runs(tmp_path)) == 1


# Attempt 1 of the dispatch in a worker process of its own, which stops (Ctrl-C, SIGTERM) once the agent has
# started: the SDK cancels the activity with worker_shutdown, then the event loop closes. The pidfd child
# watcher (Python 3.12's default) is used where there is one: asyncio's subprocess transport, closed with the
# loop, killed a launcher still running.
STOPPING_WORKER = (
    "import asyncio, sys, warnings\n"
    "from pathlib import Path\n"
    "from temporalio.activity import ActivityCancellationDetails\n"
    "from temporalio.testing import ActivityEnvironment\n"
    "from activities.backends import command\n"
    "from bso.messages import TaskAssignment\n"
    "async def main():\n"
    "    env = ActivityEnvironment()\n"
    "    attempt = asyncio.ensure_future(env.run(command.run, TaskAssignment.model_validate_json(sys.argv[1])))\n"
    "    while not Path(sys.argv[2]).exists():\n"
    "        await asyncio.sleep(0.1)\n"
    "    env.worker_shutdown()\n"
    "    env.cancel(ActivityCancellationDetails(worker_shutdown=True))\n"
    "    try:\n"
    "        await attempt\n"
    "    except asyncio.CancelledError:\n"
    "        pass\n"
    "if hasattr(asyncio, 'PidfdChildWatcher') and sys.version_info < (3, 14):\n"
    "    warnings.simplefilter('ignore', DeprecationWarning)\n"
    "    asyncio.set_child_watcher(asyncio.PidfdChildWatcher())\n"
    "asyncio.run(main())\n"
)


async def test_a_stopping_worker_leaves_its_agent_for_the_next_worker_to_adopt(tmp_path: Path) -> None:
    """The worker stops while the agent works: the agent goes on past the worker's end, and the retry adopts it
    (its answer reported, the agent never run again). A graceful stop killed it, and the retry ran it from
    scratch; then, with the pidfd child watcher, the launcher died with the worker's event loop."""
    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="slow", FAKE_AGENT_SLEEP="4")
    a = assignment(root)
    repo = Path(__file__).resolve().parents[2]
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-c", STOPPING_WORKER, a.model_dump_json(), str(tmp_path / "ledger.jsonl"), cwd=repo
    )
    assert await asyncio.wait_for(worker.wait(), 60) == 0
    [started] = runs(tmp_path)
    assert alive(started["pid"]), "the stopping worker's agent was killed"
    done = await ActivityEnvironment().run(command.run, a)  # the retry on the next worker
    assert done.status is AgentStatus.SUCCESS, done.error
    assert len(runs(tmp_path)) == 1
    assert "thinking slowly" in (command.run_dir_for(str(root), a.dispatch_id) / "stdout.log").read_text()


async def test_a_cancel_during_a_worker_stop_still_stops_the_agent(tmp_path: Path) -> None:
    """A TERMINATE (the sprint cancelled) that reaches the activity while its worker stops: the agent is
    stopped, since no retry of a cancelled dispatch comes to adopt it."""
    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="slow", FAKE_AGENT_SLEEP="60")
    env = ActivityEnvironment()
    attempt = asyncio.ensure_future(env.run(command.run, assignment(root)))

    async def started() -> bool:
        return bool(runs(tmp_path))

    await poll_until(started, "the agent started", timeout=30)
    env.worker_shutdown()
    env.cancel()  # cancel_requested: the sprint's
    with pytest.raises(asyncio.CancelledError):
        await attempt
    assert await gone(runs(tmp_path)[0]["pid"]), "the cancelled dispatch's agent runs on"
    # Said in its record, for a retry on another host sharing the project (no exit record will come).
    assert json.loads((command.run_dir_for(str(root), assignment(root).dispatch_id) / "pid.json").read_text())["killed"]


async def test_an_agent_killed_after_committing_reruns_against_the_commit_before_it(tmp_path: Path) -> None:
    """The worker dies with its agent (a crash that takes the process group, a container stopped) after the
    agent committed: the retry runs the agent again, and its work counts from the commit before the killed
    attempt. The rerun agent, finding the work done, changed nothing and failed with "empty diff"."""
    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="linger")
    a = assignment(root)
    pid = await _worker_killed_while_its_agent_runs(tmp_path, a)
    worktree = worktree_path(str(root), "s1", STORY)

    async def committed() -> bool:
        return "implement" in git(worktree, "log", "--oneline", "-1")

    await poll_until(committed, "the agent committed", timeout=30)
    os.killpg(os.getpgid(pid), signal.SIGKILL)
    assert await gone(pid)
    git(worktree, "clean", "-fdq")  # all its work is in the commit
    toml = root / ".bso" / "agents.toml"
    toml.write_text(toml.read_text().replace('"linger"', '"no-changes"'))
    done = await ActivityEnvironment().run(command.run, a)
    assert done.status is AgentStatus.SUCCESS, done.error
    assert len(runs(tmp_path)) == 2


async def test_an_orphan_agent_of_the_storys_earlier_dispatch_is_stopped_before_the_next_starts(tmp_path: Path) -> None:
    """The worker of dispatch 1 is killed hard, its agent left running; the story goes on (the dispatch timed
    out on the server; a rearm): dispatch 2 starts in the same worktree only once dispatch 1's agent is gone.
    The two agents worked side by side."""
    root = dev_project(
        tmp_path, agents_toml="\n[agents.dev-runner]\ntimeout_seconds = 3\n", FAKE_AGENT_BEHAVIOR="slow", FAKE_AGENT_SLEEP="60"
    )
    orphan = await _worker_killed_while_its_agent_runs(tmp_path, assignment(root, n=1))
    second = asyncio.ensure_future(ActivityEnvironment().run(command.run, assignment(root, n=2)))
    try:
        async def two_started() -> bool:
            return len(runs(tmp_path)) == 2

        await poll_until(two_started, "dispatch 2's agent started", timeout=30)
        assert not alive(orphan), "dispatch 1's agent works beside dispatch 2's"
    finally:
        await second  # its own 3 s timeout
        if alive(orphan):
            os.killpg(os.getpgid(orphan), signal.SIGKILL)


async def test_an_agent_that_finished_after_its_worker_died_is_not_run_again(tmp_path: Path) -> None:
    """kill -9 of the worker while its agent works; the agent finishes alone; the retry picks up its exit and
    its answer and only checks its work: the agent ran once, its work is committed once."""
    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="slow", FAKE_AGENT_SLEEP="2")
    a = assignment(root)
    pid = await _worker_killed_while_its_agent_runs(tmp_path, a)
    assert await gone(pid, seconds=20)
    done = await ActivityEnvironment().run(command.run, a)
    _ran_once_as_if_not_interrupted(tmp_path, root, done)
    run_dir = command.run_dir_for(str(root), a.dispatch_id)
    assert "thinking slowly" in (run_dir / "stdout.log").read_text()  # attempt 1's whole transcript


def _ran_once_as_if_not_interrupted(tmp_path: Path, root: Path, done: AgentComplete) -> None:
    """The agent ran once, its answer is attempt 1's, and its work is committed once."""
    assert len(runs(tmp_path)) == 1
    assert done.status is AgentStatus.SUCCESS, done.error
    assert done.summary.startswith("fake dev-runner/dev") and done.tokens_used == 1700  # attempt 1's answer
    wt = worktree_path(str(root), "s1", STORY)
    log = git(wt, "log", "--format=%s", "main..HEAD").splitlines()
    assert log == [f"bso(dev-runner): {STORY}: src/story_1_1_hello_world_extra.py", f"implement {STORY}"]


LINGER_TIMEOUT = "\n[agents.dev-runner]\ntimeout_seconds = 8\n"


async def _killed_with_its_worker_when(tmp_path: Path, a: TaskAssignment, said: str) -> Path:
    """Attempt 1's worker is killed, then its agent with its launcher (a worker killed with all its children: a
    container stopped, the OOM killer, a power cut) once the agent's output says `said`: no exit record is
    written, no launcher is left. The dispatch's run folder."""
    pid = await _worker_killed_while_its_agent_runs(tmp_path, a)
    run_dir = command.run_dir_for(a.project_root, a.dispatch_id)

    async def reached() -> bool:
        return (run_dir / "stdout.log").exists() and said in (run_dir / "stdout.log").read_text()

    await poll_until(reached, f"the agent's output says {said!r}", timeout=30)
    os.killpg(os.getpgid(pid), signal.SIGKILL)
    assert await gone(pid)
    assert not (run_dir / "exit.json").exists()
    return run_dir


async def test_an_agent_killed_with_its_worker_after_its_whole_answer_is_not_run_again(tmp_path: Path) -> None:
    """The agent wrote its answer and lingers before its exit, as CLIs do (their telemetry, their MCP servers);
    its worker is killed with all its children then. The retry takes its answer and checks its work as after
    its exit: the agent ran once, its work is committed as in a run not interrupted, and a later retry reports
    the recorded answer. With no exit record and no launcher it was taken for dead unfinished and run again,
    its whole first answer set aside under previous/1/."""
    # (A short timeout: an agent run again lingers until it, and that run's answer is its timeout.)
    root = dev_project(tmp_path, agents_toml=LINGER_TIMEOUT, FAKE_AGENT_BEHAVIOR="answer-linger")
    a = assignment(root)
    run_dir = await _killed_with_its_worker_when(tmp_path, a, '"usage"')  # its final output, after its result file
    done = await ActivityEnvironment().run(command.run, a)
    _ran_once_as_if_not_interrupted(tmp_path, root, done)
    assert not (run_dir / "previous").exists()
    exited = json.loads((run_dir / "exit.json").read_text())
    assert (exited["returncode"], exited["timed_out"], exited["killed_after_answer"]) == (None, False, True)
    again = await ActivityEnvironment().run(command.run, a)  # a later retry: nothing runs again
    assert again == done
    assert len(runs(tmp_path)) == 1
    assert len(git(worktree_path(str(root), "s1", STORY), "log", "--format=%s", "main..HEAD").splitlines()) == 2


async def test_an_agent_killed_with_its_worker_after_answering_failure_is_a_failure_not_run_again(tmp_path: Path) -> None:
    """Its exit code unknown, the answer says success or failure itself: a failure it answered stands."""
    root = dev_project(tmp_path, agents_toml=LINGER_TIMEOUT, FAKE_AGENT_BEHAVIOR="answer-linger,claim-failure")
    a = assignment(root)
    await _killed_with_its_worker_when(tmp_path, a, '"usage"')
    done = await ActivityEnvironment().run(command.run, a)
    assert len(runs(tmp_path)) == 1
    assert done.status is AgentStatus.FAILURE and done.error == "could not finish the fix", done.error


async def test_an_agent_killed_with_its_worker_in_the_middle_of_its_answer_runs_again(tmp_path: Path) -> None:
    """Killed while it wrote its result file (half of it written): the answer is no answer, the agent runs again,
    its work counted from the commit before the first attempt."""
    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="torn-answer")
    a = assignment(root)
    run_dir = await _killed_with_its_worker_when(tmp_path, a, "writing the answer")
    assert (run_dir / "result.json").read_text().startswith('{"msg_type": "AGENT_COMPLETE"')
    toml = root / ".bso" / "agents.toml"
    toml.write_text(toml.read_text().replace('"torn-answer"', '""'))
    done = await ActivityEnvironment().run(command.run, a)
    assert len(runs(tmp_path)) == 2
    assert done.status is AgentStatus.SUCCESS, done.error
    assert "writing the answer" in (run_dir / "previous" / "1" / "stdout.log").read_text()  # the first run, kept
    wt = worktree_path(str(root), "s1", STORY)
    log = git(wt, "log", "--format=%s", "main..HEAD").splitlines()
    assert log == [f"implement {STORY}"] * 2  # the second run's commit (with what the first left) on the first's


async def test_an_agent_still_running_after_its_worker_died_is_adopted(tmp_path: Path) -> None:
    """The retry starts while the previous attempt's agent still works: it waits for it (heartbeating)
    instead of killing it and running the agent again."""
    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="slow", FAKE_AGENT_SLEEP="3")
    a = assignment(root)
    await _worker_killed_while_its_agent_runs(tmp_path, a)
    env = ActivityEnvironment()
    beats: list = []
    env.on_heartbeat = lambda *details: beats.append(details[0])
    done = await env.run(command.run, a)
    assert len(runs(tmp_path)) == 1
    assert done.status is AgentStatus.SUCCESS, done.error
    assert any("pid" in b and b["last_line"] == "thinking slowly" for b in beats), beats
    wt = worktree_path(str(root), "s1", STORY)
    assert len(git(wt, "log", "--format=%s", "main..HEAD").splitlines()) == 2


async def test_an_adopted_agent_is_still_held_to_its_timeout(tmp_path: Path) -> None:
    root = dev_project(
        tmp_path, agents_toml="\n[agents.dev-runner]\ntimeout_seconds = 2\n",
        FAKE_AGENT_BEHAVIOR="slow", FAKE_AGENT_SLEEP="300",
    )
    a = assignment(root)
    pid = await _worker_killed_while_its_agent_runs(tmp_path, a)
    done = await ActivityEnvironment().run(command.run, a)
    assert done.status is AgentStatus.FAILURE and "timed out" in done.error
    assert len(runs(tmp_path)) == 1
    assert await gone(pid)

async def test_a_process_group_recorded_on_another_machine_is_never_killed(tmp_path: Path) -> None:
    """pid.json names a process group of the host and boot that wrote it: read on another agent host sharing the
    project, or after a reboot, the same number is someone else's group."""
    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="slow", FAKE_AGENT_SLEEP="60")
    a = assignment(root)
    pid = await _worker_killed_while_its_agent_runs(tmp_path, a)
    pid_file = command.run_dir_for(str(root), a.dispatch_id) / "pid.json"
    record = json.loads(pid_file.read_text())
    assert record["machine"] == machine_id()
    pid_file.write_text(json.dumps({**record, "machine": "another-host/another-boot"}))
    command._kill_previous_attempt(pid_file.parent)
    await asyncio.sleep(0.3)
    assert alive(pid)
    # This machine's, but the number now leads someone else's group (a `sleep` in a session of its own).
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        pid_file.write_text(json.dumps({**record, "pgid": other.pid}))
        command._kill_previous_attempt(pid_file.parent)
        await asyncio.sleep(0.3)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
    pid_file.write_text(json.dumps(record))  # this machine's and the launcher's: the orphan is stopped
    command._kill_previous_attempt(pid_file.parent)
    assert await gone(pid)


async def test_an_agent_that_died_with_its_worker_runs_again(tmp_path: Path) -> None:
    """The agent died unfinished (the whole machine went down): the retry runs it again, and the first
    run's transcript is kept."""
    import signal

    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="slow", FAKE_AGENT_SLEEP="2")
    a = assignment(root)
    pid = await _worker_killed_while_its_agent_runs(tmp_path, a)
    os.killpg(os.getpgid(pid), signal.SIGKILL)
    await gone(pid, seconds=10)
    done = await ActivityEnvironment().run(command.run, a)
    assert len(runs(tmp_path)) == 2
    assert done.status is AgentStatus.SUCCESS, done.error
    run_dir = command.run_dir_for(str(root), a.dispatch_id)
    kept = list(run_dir.glob("previous/*/stdout.log"))
    assert len(kept) == 1 and kept[0].read_text() == "thinking slowly\n"


async def _fix_after_a_passing_dev(tmp_path: Path, behavior: str):
    """A dev dispatch whose test passes, then a fix told `behavior`: (the fix's answer, worktree, dev's HEAD)."""
    root = dev_project(tmp_path)
    dev = await ActivityEnvironment().run(command.run, assignment(root))
    assert dev.status is AgentStatus.SUCCESS, dev.error
    wt = worktree_path(str(root), "s1", STORY)
    after_dev = git(wt, "rev-parse", "HEAD").strip()
    toml = root / ".bso" / "agents.toml"
    toml.write_text(toml.read_text().replace(
        "[profiles.fake.env]\n", f'[profiles.fake.env]\nFAKE_AGENT_BEHAVIOR = "{behavior}"\n'
    ))
    fix = await ActivityEnvironment().run(command.run, assignment(root, n=2, mode=AgentMode.FIX))
    return fix, wt, after_dev


async def test_fix_that_lowers_passing_tests_is_rolled_back(tmp_path: Path) -> None:
    fix, wt, after_dev = await _fix_after_a_passing_dev(tmp_path, "break-tests")
    assert fix.status is AgentStatus.FAILURE
    assert "passing tests fell from 1 to 0" in fix.error and "rolled back" in fix.error
    assert git(wt, "rev-parse", "HEAD").strip() == after_dev


async def test_a_failed_fix_that_lowers_passing_tests_is_rolled_back_too(tmp_path: Path) -> None:
    """The Exit Gate commits what a giving-up fix left; P20 still applies, so the next fix starts clean."""
    fix, wt, after_dev = await _fix_after_a_passing_dev(tmp_path, "break-tests,claim-failure")
    assert fix.status is AgentStatus.FAILURE
    assert "passing tests fell from 1 to 0" in fix.error and "could not finish the fix" in fix.error
    assert git(wt, "rev-parse", "HEAD").strip() == after_dev


async def test_the_fix_snapshot_heartbeats(tmp_path: Path) -> None:
    """P20's count before a fix runs the project's checks: a suite slower than the heartbeat timeout (60 s by
    default) would have every fix attempt timed out by the server if nothing heartbeat meanwhile."""
    suite_seconds = 2
    root = dev_project(tmp_path)
    toml = root / ".bso" / "agents.toml"
    toml.write_text(toml.read_text().replace(
        'commands = [["python3", "run_checks.py"]]',
        f'commands = [["python3", "-c", "import time; time.sleep({suite_seconds}); print(\'1 passed\')"]]',
    ))
    beats: list[tuple[float, dict]] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append((time.monotonic(), details[0] if details else {}))
    started = time.monotonic()
    await env.run(command.run, assignment(root, mode=AgentMode.FIX))
    times = [started, *(t for t, _ in beats)]
    longest = max(b - a for a, b in zip(times, times[1:]))
    assert longest < 1.5, f"{longest:.1f}s without a heartbeat (heartbeat_seconds = 0.5)"
    assert command.FIX_SNAPSHOT_PHASE in [details.get("phase") for _, details in beats]


async def test_the_worktree_s_creation_heartbeats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`git worktree add` of a large repository (or one waiting for the repository lock behind other stories'
    merges) ran before the first heartbeat: slower than the heartbeat timeout, the attempt was retried while
    it still ran."""
    root = dev_project(tmp_path)
    real_ensure = command.ensure_worktree

    async def slow_ensure(*args, **kwargs):
        await asyncio.sleep(2)
        return await real_ensure(*args, **kwargs)

    monkeypatch.setattr(command, "ensure_worktree", slow_ensure)
    beats: list[tuple[float, dict]] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append((time.monotonic(), details[0] if details else {}))
    started = time.monotonic()
    await env.run(command.run, assignment(root))
    preparing = [t for t, details in beats if details.get("phase") == command.PREPARING_PHASE]
    assert preparing and preparing[0] - started < 1.0 and len(preparing) >= 3, preparing


async def test_a_reviewer_that_edits_files_has_them_set_aside_and_reported(tmp_path: Path) -> None:
    """They were stashed: on the user's own stash list (shared by every worktree), above their entries, for
    their next `git stash pop` to apply into their checkout."""
    root = dev_project(tmp_path)
    await ActivityEnvironment().run(command.run, assignment(root))
    wt = worktree_path(str(root), "s1", STORY)
    (wt / "src" / "sneaky.py").write_text("x = 1\n")  # as if the reviewer had written it
    review = await ActivityEnvironment().run(
        command.run, assignment(root, n=2, agent=AgentType.REVIEW_RUNNER, mode=AgentMode.REVIEW)
    )
    assert review.status is AgentStatus.SUCCESS and review.verdict.value == "success"
    ref = git_ops.left_ref("s1/batch-1/1-1/2")
    assert any(f"set aside as {ref}/files" in f.summary and "src/sneaky.py" in f.summary for f in review.findings)
    assert git(wt, "status", "--porcelain") == "" and git(root, "stash", "list") == ""
    assert git(wt, "show", "--name-only", "--format=", f"{ref}/files").split() == ["src/sneaky.py"]


@pytest.mark.parametrize("move", ["commit", "detach", "reset-soft", "orphan", "nested-repo"])
async def test_a_reviewer_that_moves_the_story_branch_has_it_set_back(tmp_path: Path, move: str) -> None:
    """A reviewer's commit was squashed and merged as the story's work; a detached HEAD made the next fix fail
    as the fix's own doing; `git reset --soft <base>` left the story's work in a stash and the branch empty."""
    root = dev_project(tmp_path)
    await ActivityEnvironment().run(command.run, assignment(root))
    wt = worktree_path(str(root), "s1", STORY)
    tip = git(wt, "rev-parse", "HEAD").strip()
    base = git(root, "rev-parse", "HEAD").strip()
    reviewer = tmp_path / "reviewer.sh"
    steps = {
        "commit": "echo fixed >> src/story_1_1_hello_world.py && git commit -qam 'review fix'",
        "detach": f"git checkout -q --detach {base}",
        "reset-soft": f"git reset -q --soft {base}",
        "orphan": "git checkout -q --orphan elsewhere && echo x > fresh.txt",
        "nested-repo": "git init -q vendor/lib && echo x > vendor/lib/a.txt && echo y > notes.txt",
    }[move]
    reviewer.write_text(
        "#!/bin/sh\nset -e\n"
        "export GIT_AUTHOR_NAME=R GIT_AUTHOR_EMAIL=r@example.com GIT_COMMITTER_NAME=R GIT_COMMITTER_EMAIL=r@example.com\n"
        f"{steps}\n"
        "echo '{\"status\": \"success\", \"verdict\": \"success\"}' > \"$BSO_RESULT_FILE\"\n"
    )
    reviewer.chmod(0o755)
    toml = root / ".bso" / "agents.toml"
    toml.write_text(toml.read_text() + f'\n[profiles.rev]\nextends = "generic"\nargv = ["{reviewer}"]\n'
                    '\n[agents.review-runner]\nprofile = "rev"\n')
    review = await ActivityEnvironment().run(
        command.run, assignment(root, n=2, agent=AgentType.REVIEW_RUNNER, mode=AgentMode.REVIEW)
    )
    assert review.status is AgentStatus.SUCCESS, review.error
    assert git(wt, "symbolic-ref", "HEAD").strip() == f"refs/heads/bso/s1/{STORY}"
    assert git(wt, "rev-parse", "HEAD").strip() == tip
    ref = git_ops.left_ref("s1/batch-1/1-1/2")
    if move == "nested-repo":  # named, left in place (not set aside: its files are not the project's objects)
        assert git(wt, "status", "--porcelain", "--untracked-files=all").splitlines() == ["?? vendor/lib/"]
        assert any("vendor/lib" in f.summary and "not set aside" in f.summary for f in review.findings)
        assert git(wt, "show", "--name-only", "--format=", f"{ref}/files").split() == ["notes.txt"]
        return
    assert git(wt, "status", "--porcelain") == ""
    assert any("set back to" in f.summary for f in review.findings), review.findings
    if move == "commit":
        assert "review fix" in git(wt, "log", "-1", "--format=%s", f"{ref}/head")


async def test_a_story_started_after_another_merged_builds_on_it_and_merges(tmp_path: Path) -> None:
    """K1 changes src/auth.py and merges; only then K2's worktree is made (the Master holds a batch while a
    running one works on a file it touches). It was made from the sprint's base, without K1's work, so K2's
    change of the same line conflicted and K2 was not merged; now it starts from the project's HEAD."""
    root = make_git_project(tmp_path / "proj", stories={"1-1-login": "review", "1-2-logout": "review"})
    (root / "src").mkdir()
    (root / "src" / "auth.py").write_text("TOKEN = 0\n")
    git(root, "add", "src")
    git(root, "commit", "-q", "-m", "auth")

    async def story(key: str, token: int) -> FinishStoryResult:
        wt = await ensure_worktree(str(root), "s1", key)
        assert (Path(wt.path) / "src" / "auth.py").read_text() == f"TOKEN = {token - 1}\n"  # the work merged so far
        (Path(wt.path) / "src" / "auth.py").write_text(f"TOKEN = {token}\n")
        git(wt.path, "commit", "-q", "-am", f"{key} work")
        return await ActivityEnvironment().run(
            finish_story_git, FinishStoryInput(project_root=str(root), session_id="s1", story_key=key)
        )

    first, second = await story("1-1-login", 1), await story("1-2-logout", 2)
    assert first.merged and second.merged and second.squashed, (first.note, second.note)
    assert (root / "src" / "auth.py").read_text() == "TOKEN = 2\n"
    assert git(root, "log", "--no-merges", "--format=%s", "-2").split("\n")[:2] == [
        "feat: Story 1.2: 1-2-logout", "feat: Story 1.1: 1-1-login"
    ]


@pytest.mark.parametrize("clear_track", [True, False])
async def test_a_story_run_again_under_a_reused_sprint_id_merges_its_new_work(tmp_path: Path, clear_track: bool) -> None:
    """Sprint s1 merged the story (recorded; its track cleared, or kept) and then failed or was terminated;
    started again under the same id with the story set back by hand, the story's new work must be merged: not
    answered by the first run's record of its merge, nor squashed again with the work already merged (which
    conflicted with itself on a kept branch)."""
    root = make_git_project(tmp_path / "proj", stories={STORY: "review"})

    async def run_story(text: str) -> FinishStoryResult:
        wt = await ensure_worktree(str(root), "s1", STORY)
        (Path(wt.path) / "greeting.txt").write_text(text)
        git(wt.path, "add", "greeting.txt")
        git(wt.path, "commit", "-q", "-m", f"say {text}")
        return await finish(root, clear_track=clear_track)

    first = await run_story("hello\n")
    assert first.merged and worktree_path(str(root), "s1", STORY).exists() is not clear_track
    again = await run_story("hello again\n")
    assert again.merged and again.commit != first.commit, (first, again)
    assert (root / "greeting.txt").read_text() == "hello again\n"
    assert await finish(root, clear_track=clear_track) == again  # a retry of the finish is answered with it
    assert git(root, "log", "--no-merges", "--format=%s").count("feat: Story 1.1") == 2, git(root, "log", "--oneline")


async def test_two_finishes_of_one_story_at_once_both_say_merged(tmp_path: Path) -> None:
    """The Master finishes the merge of a story whose Slave ended during it, while that Slave's attempt may still
    run: the second to take the lock finds the story merged and its branch cleared, and says merged (it said
    "no branch: nothing to merge", and the story got a "not merged" error)."""
    root = make_git_project(tmp_path / "proj", stories={STORY: "review"})
    wt = await ensure_worktree(str(root), "s1", STORY)
    (Path(wt.path) / "greeting.txt").write_text("hello\n")
    git(wt.path, "add", "greeting.txt")
    git(wt.path, "commit", "-q", "-m", "say hello")
    first, second = await asyncio.gather(finish(root), finish(root))
    assert first.merged and second.merged, (first, second)
    assert first == second


async def test_a_stale_record_of_the_story_spares_a_launcher_that_is_not_its_own(tmp_path: Path) -> None:
    """A dispatch of 1-1 cancelled long ago left its pid.json (no exit.json); its group number is now led by
    another project's launcher (simulated: the same number). The next dispatch of 1-1 killed that agent."""
    from activities.process import group_alive, machine_id

    other_dir = tmp_path / "other-project" / ".sprint-session" / "agents" / "x"
    other_dir.mkdir(parents=True)
    spec = {"run_dir": str(other_dir), "stdin": None, "secret_keys": [], "record": {"story_key": "2-1-other"}}
    other = subprocess.Popen(
        [sys.executable, "-I", str(command.LAUNCHER), json.dumps(spec), "sleep", "60"], start_new_session=True
    )
    try:
        for _ in range(100):
            if (other_dir / "pid.json").exists():
                break
            await asyncio.sleep(0.05)
        root = tmp_path / "project"
        stale = root / ".sprint-session" / "agents" / "old-dispatch"
        stale.mkdir(parents=True)
        (stale / "pid.json").write_text(json.dumps({
            "dispatch_id": "s/batch-1/1-1/1", "pid": other.pid, "pgid": other.pid, "started_at": 1.0,
            "machine": machine_id(), "story_key": STORY,
        }))
        command._kill_other_dispatches(str(root), STORY, root / ".sprint-session" / "agents" / "new-dispatch")
        await asyncio.sleep(0.5)
        assert other.poll() is None, "another project's agent was killed through a stale record"
    finally:
        if group_alive(other.pid):
            os.killpg(other.pid, signal.SIGKILL)
        other.wait()


async def test_an_agent_another_host_started_is_waited_for_not_run_beside_it(tmp_path: Path) -> None:
    """The dispatch's agent was started on another agent host sharing the project, whose worker then stopped
    (the agent runs on there): the retry here waits for that agent's exit record and reports its answer. It ran
    the agent again at once, the two working side by side in the same worktree."""
    root = dev_project(tmp_path)
    a = assignment(root, agent=AgentType.REVIEW_RUNNER, mode=AgentMode.REVIEW)
    run_dir = command.run_dir_for(str(root), a.dispatch_id)
    record = {"dispatch_id": a.dispatch_id, "run_id": ActivityEnvironment().default_info().workflow_run_id,
              "attempt": 1, "before": None, "passing_before": None, "machine": "other-host/boot-1",
              "story_key": STORY}
    (run_dir / "pid.json").write_text(json.dumps({**record, "pid": 4242, "pgid": 4242, "started_at": time.time()}))
    retry = asyncio.ensure_future(ActivityEnvironment().run(command.run, a))
    await asyncio.sleep(1.5)
    assert not retry.done() and runs(tmp_path) == [], "the agent ran again beside the other host's"
    (run_dir / "result.json").write_text(json.dumps(
        {"msg_type": "AGENT_COMPLETE", "status": "success", "verdict": "success", "summary": "reviewed on the other host"}
    ))
    (run_dir / "exit.json").write_text(json.dumps(
        {**record, "returncode": 0, "timed_out": False, "elapsed": 2.0, "last_line": "Done."}
    ))
    done = await asyncio.wait_for(retry, 30)
    assert done.status is AgentStatus.SUCCESS and done.summary.startswith("reviewed on the other host"), done
    assert runs(tmp_path) == []


async def test_an_adopted_agent_the_cancelled_sprint_stops_is_not_run_again(tmp_path: Path) -> None:
    """A retry adopts the agent its killed worker left running; the sprint is cancelled meanwhile and
    stop_sprint_agents stops that agent: the retry ends with the cancel, it does not take the launcher's end
    for a crash and run the agent again."""
    from bso.dispatch import StopAgentsInput

    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="slow", FAKE_AGENT_SLEEP="60")
    a = assignment(root)
    orphan = await _worker_killed_while_its_agent_runs(tmp_path, a)
    retry = asyncio.ensure_future(ActivityEnvironment().run(command.run, a))
    await asyncio.sleep(1)  # it adopts the orphan, heartbeating
    assert not retry.done()
    stopped = await ActivityEnvironment().run(command.stop_sprint_agents, StopAgentsInput(project_root=str(root), session_id="s1"))
    assert stopped == [a.dispatch_id]
    with pytest.raises(ApplicationError) as err:
        await asyncio.wait_for(retry, 30)
    assert err.value.type == "SprintCancelled" and err.value.non_retryable
    assert await gone(orphan) and len(runs(tmp_path)) == 1


async def test_the_cancelled_sprint_stops_an_agent_another_host_runs(tmp_path: Path, monkeypatch) -> None:
    """The cancelled sprint's agent runs on another agent host sharing the project (its worker there was killed):
    stop_sprint_agents, taken by this host's worker, cannot kill it and asks its launcher, which stops it within
    a second and marks pid.json killed; a retry ends with the cancel. The agent ran on to its launcher's backstop."""
    from bso.dispatch import StopAgentsInput

    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="slow", FAKE_AGENT_SLEEP="60")
    a = assignment(root)
    orphan = await _worker_killed_while_its_agent_runs(tmp_path, a)
    monkeypatch.setattr(command, "machine_id", lambda: "this-host/boot-2")  # the agent ran on another host
    try:
        stopped = await ActivityEnvironment().run(command.stop_sprint_agents, StopAgentsInput(project_root=str(root), session_id="s1"))
        assert stopped == [a.dispatch_id]
        assert await gone(orphan, seconds=15), "the agent on the other host ran on"
    finally:
        if alive(orphan):
            os.kill(orphan, signal.SIGKILL)
    run_dir = command.run_dir_for(str(root), a.dispatch_id)
    assert json.loads((run_dir / "pid.json").read_text())["killed"] and not (run_dir / "exit.json").exists()
    with pytest.raises(ApplicationError) as err:
        await asyncio.wait_for(ActivityEnvironment().run(command.run, a), 30)
    assert err.value.type == "SprintCancelled" and err.value.non_retryable
    assert len(runs(tmp_path)) == 1


async def test_a_retry_waiting_for_another_hosts_agent_ends_with_the_cancel(tmp_path: Path) -> None:
    """A retry waits for the agent another host runs; the sprint is cancelled (cancelled.json, by whichever host
    took the stop): the retry ends with the cancel at once. It waited out that launcher's whole deadline."""
    root = dev_project(tmp_path)
    a = assignment(root, agent=AgentType.REVIEW_RUNNER, mode=AgentMode.REVIEW)
    run_dir = command.run_dir_for(str(root), a.dispatch_id)
    record = {"dispatch_id": a.dispatch_id, "run_id": ActivityEnvironment().default_info().workflow_run_id,
              "attempt": 1, "machine": "other-host/boot-1", "story_key": STORY}
    (run_dir / "pid.json").write_text(json.dumps({**record, "pid": 4242, "pgid": 4242, "started_at": time.time()}))
    retry = asyncio.ensure_future(ActivityEnvironment().run(command.run, a))
    await asyncio.sleep(1.5)
    assert not retry.done()
    (run_dir / "cancelled.json").write_text(json.dumps({k: record[k] for k in ("dispatch_id", "run_id")}))
    with pytest.raises(ApplicationError) as err:
        await asyncio.wait_for(retry, 15)
    assert err.value.type == "SprintCancelled" and runs(tmp_path) == []


async def test_an_agent_its_launcher_stopped_for_the_cancel_is_reported_cancelled(tmp_path: Path) -> None:
    """The attempt still runs when another host's stop_sprint_agents asks its agent's launcher to stop: the
    attempt ends with the cancel, it does not check and report the killed agent's work as its answer."""
    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="slow", FAKE_AGENT_SLEEP="60")
    a = assignment(root)
    env = ActivityEnvironment()
    attempt = asyncio.ensure_future(env.run(command.run, a))
    for _ in range(300):
        if runs(tmp_path):
            break
        await asyncio.sleep(0.1)
    assert len(runs(tmp_path)) == 1, "the agent never started"
    command.write_json_atomic(  # what stop_sprint_agents writes on the host that takes the sprint's stop
        command.run_dir_for(str(root), a.dispatch_id) / "cancelled.json",
        {"dispatch_id": a.dispatch_id, "run_id": env.info.workflow_run_id},
    )
    with pytest.raises(ApplicationError) as err:
        await asyncio.wait_for(attempt, 30)
    assert err.value.type == "SprintCancelled" and err.value.non_retryable
    assert await gone(runs(tmp_path)[0]["pid"])


async def test_an_agent_another_hosts_worker_killed_is_run_again_here_at_once(tmp_path: Path) -> None:
    """Its worker on the other host killed the agent (the server had given up on that attempt): no exit record
    will come, and the retry here runs the agent at once instead of waiting out that launcher's deadline."""
    root = dev_project(tmp_path)
    a = assignment(root, agent=AgentType.REVIEW_RUNNER, mode=AgentMode.REVIEW)
    run_dir = command.run_dir_for(str(root), a.dispatch_id)
    (run_dir / "pid.json").write_text(json.dumps({
        "dispatch_id": a.dispatch_id, "run_id": ActivityEnvironment().default_info().workflow_run_id, "attempt": 1,
        "before": None, "machine": "other-host/boot-1", "story_key": STORY, "pid": 4242, "pgid": 4242,
        "started_at": time.time(), "killed": True,
    }))
    done = await asyncio.wait_for(ActivityEnvironment().run(command.run, a), 30)
    assert done.status is AgentStatus.SUCCESS, done.error
    assert len(runs(tmp_path)) == 1


async def test_only_a_value_bmads_agents_write_is_set_back(tmp_path: Path) -> None:
    """An agent's `ready-for-dev` (BMAD's create-story) is set back; a person's `skipped` or `done` is theirs: the
    Slave takes it as it takes any change made by hand."""
    from activities.status_file import story_value_now

    root = dev_project(tmp_path)
    a = assignment(root, agent=AgentType.STORY_CREATOR, mode=AgentMode.CREATE)
    run_dir = command.run_dir_for(str(root), a.dispatch_id)
    status = root / "_bmad-output" / "implementation-artifacts" / "sprint-status.yaml"
    env = ActivityEnvironment()
    await env.run(command._note_story_value, run_dir, a)

    def set_story(value: str) -> None:
        status.write_text(re.sub(rf"^(\s*{STORY}:).*$", rf"\1 {value}", status.read_text(), flags=re.M))

    for by_hand in ("skipped", "done"):  # settled by hand, as the README says
        set_story(by_hand)
        assert await env.run(command._story_value_set_back, run_dir, a) is None
        assert story_value_now(str(root), None, STORY) == by_hand
    set_story("ready-for-dev")
    said = await env.run(command._story_value_set_back, run_dir, a)
    assert said is not None and said.summary == (
        "set the story to 'ready-for-dev' in the status file, which BSO alone writes: set back to 'backlog'"
    )
    assert story_value_now(str(root), None, STORY) == "backlog"
    assert await env.run(command._story_value_set_back, run_dir, a) is None  # nothing left to set back


async def test_a_story_creator_that_wrote_the_story_elsewhere_has_not_succeeded(tmp_path: Path) -> None:
    """Its success was taken: the story-reviewer passed a story with no doc, and the dev worked with no acceptance
    criteria or file scope."""
    root = make_git_project(tmp_path / "proj", FAKE_AGENT_BEHAVIOR="story-elsewhere")
    a = assignment(root, agent=AgentType.STORY_CREATOR, mode=AgentMode.CREATE)
    done = await ActivityEnvironment().run(command.run, a)
    assert done.status is AgentStatus.FAILURE, done
    assert done.error.startswith(f"the story-creator answered success but no story file is at {STORY_PATH}"), done.error
    ok = await ActivityEnvironment().run(command.run, assignment(make_git_project(tmp_path / "ok"), n=2,
                                                                  agent=AgentType.STORY_CREATOR, mode=AgentMode.CREATE))
    assert ok.status is AgentStatus.SUCCESS, ok.error


async def test_a_retry_adds_to_what_was_set_aside_never_replaces_it(tmp_path: Path) -> None:
    """A crash after the set-aside's reset, before its clean: the retry saw only the untracked files left and
    replaced the ref, and the reviewer's edit of a tracked file was gone (no reflog keeps such refs)."""
    root = dev_project(tmp_path)
    wt = await ensure_worktree(str(root), "s1", STORY)
    before = git(wt.path, "rev-parse", "HEAD").strip()
    (Path(wt.path) / "run_checks.py").write_text("edited by the reviewer\n")
    (Path(wt.path) / "untracked.txt").write_text("left\n")
    ref = git_ops.left_ref("d1")
    assert await git_ops.set_aside_what_a_reader_left(wt, before, "d1")
    (Path(wt.path) / "untracked.txt").write_text("left\n")  # as a crash before the clean would have left it
    assert await git_ops.set_aside_what_a_reader_left(wt, before, "d1")
    first = f"{ref}/files^2"  # the first set-aside: the second's parent after the story's HEAD
    assert git(wt.path, "show", f"{first}:run_checks.py") == "edited by the reviewer\n"
    assert git(wt.path, "status", "--porcelain") == ""


async def test_a_story_file_moved_out_of_the_worktree_keeps_its_bytes(tmp_path: Path) -> None:
    """It was read through git's decoded output: a cp1252 story came out with replacement characters."""
    root = dev_project(tmp_path)
    story = root / STORY_PATH  # written after the project's first commit: untracked
    wt = await ensure_worktree(str(root), "s1", STORY)
    agents_copy = Path(wt.path, STORY_PATH)
    agents_copy.parent.mkdir(parents=True, exist_ok=True)
    agents_copy.write_bytes(b"# Story 1.1: Caf\xe9\n\n## Dev Agent Record\n")
    git(wt.path, "add", STORY_PATH)
    git(wt.path, "commit", "-qm", "the story, written in the worktree")
    assert await git_ops.move_story_file_out(wt, STORY_PATH, str(story), agent_type="dev-runner", dispatch_id="d1")
    assert story.read_bytes() == b"# Story 1.1: Caf\xe9\n\n## Dev Agent Record\n"
    assert STORY_PATH not in git(wt.path, "ls-files")


async def test_the_checkouts_story_text_the_agents_copy_replaced_is_kept(tmp_path: Path) -> None:
    """The agent's story file went over the checkout's copy, which the project does not track: the text before
    (the story-creator's, an earlier dispatch's) was lost, whatever became of the dispatch after."""
    root = dev_project(tmp_path)
    story = root / STORY_PATH
    before = b"# Story 1.1: Caf\xe9, as the story-creator wrote it\n"
    story.write_bytes(before)
    wt = await ensure_worktree(str(root), "s1", STORY)
    agents_copy = Path(wt.path, STORY_PATH)
    agents_copy.parent.mkdir(parents=True, exist_ok=True)
    for attempt in (1, 2):  # a retry (a crash before its commit): the text before is the first one kept
        agents_copy.write_bytes(b"## Dev Agent Record %d\n" % attempt)
        git(wt.path, "add", STORY_PATH)
        git(wt.path, "commit", "-qm", "the story, written in the worktree")
        moved = await git_ops.move_story_file_out(wt, STORY_PATH, str(story), agent_type="dev-runner", dispatch_id="d1")
        assert moved is not None and moved.kept_as == git_ops.story_file_before_ref("d1")
        assert story.read_bytes() == b"## Dev Agent Record %d\n" % attempt
        shown = subprocess.run(["git", "-C", str(root), "show", f"{moved.kept_as}:{STORY_PATH}"], capture_output=True)
        assert shown.stdout == before


async def test_a_fix_rolled_back_has_the_story_files_text_from_before_it_put_back(tmp_path: Path) -> None:
    """P20 rolled the fix back, but the story file in the checkout kept the fix's Dev Agent Record: it told of
    work the branch no longer holds."""
    fix, wt, after_dev = await _fix_after_a_passing_dev(tmp_path, "break-tests,story-in-worktree")
    root = tmp_path / "proj"
    assert fix.status is AgentStatus.FAILURE and "rolled back" in fix.error, fix.error
    assert "the story file's text to its text before the fix" in fix.error, fix.error
    assert git(wt, "rev-parse", "HEAD").strip() == after_dev
    assert (root / STORY_PATH).read_text() == STORY_TEXT
    [moved] = [f for f in fix.findings if f.file == STORY_PATH]
    assert git_ops.story_file_before_ref(assignment(root, n=2).dispatch_id) in moved.summary


async def test_a_file_the_story_untracked_is_put_back_by_a_finish_retried_after_its_merge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker dies after the merge deleted the checkout's copy, before it was put back: the retry, finding
    the story merged, puts it back."""
    root = dev_project(tmp_path)
    (root / "key.pem").write_text("-----BEGIN PRIVATE KEY-----\n")
    git(root, "add", "-f", "key.pem")
    git(root, "commit", "-qm", "a key")
    wt = await ensure_worktree(str(root), "s1", STORY)
    git(wt.path, "rm", "-q", "--cached", "key.pem")
    (Path(wt.path) / ".gitignore").write_text(".sprint-session/\nkey.pem\n")
    await dev_gate(wt)
    put_back = git_ops._put_back_untracked

    def worker_killed(root: str, aside: Path) -> list[str]:
        raise RuntimeError("the worker is killed")

    monkeypatch.setattr(git_ops, "_put_back_untracked", worker_killed)
    with pytest.raises(RuntimeError):
        await finish(root)
    assert not (root / "key.pem").exists()
    monkeypatch.setattr(git_ops, "_put_back_untracked", put_back)
    done = await finish(root)
    assert done.merged and (root / "key.pem").read_text() == "-----BEGIN PRIVATE KEY-----\n", done


async def test_a_merge_git_refuses_for_the_users_edit_says_it_was_not_made_and_names_the_hand_merge(
    tmp_path: Path,
) -> None:
    """The user's own file, not committed, where the story creates one: git refuses the merge ("untracked working
    tree files would be overwritten by merge"), nothing of it is in the checkout. The note names the merge to make
    once it is dealt with."""
    root, changed = await _done_story(tmp_path)
    (root / changed[0]).parent.mkdir(parents=True, exist_ok=True)
    (root / changed[0]).write_text("# the user's own edit\n")
    result = await finish(root)
    assert not result.merged and "would be overwritten" in result.note, result.note
    assert (root / changed[0]).read_text() == "# the user's own edit\n"
    assert "the merge was not made" in result.note and f"git merge bso/s1/{STORY}" in result.note, result.note
