"""activities.status_file: load_sprint_status and the U4 write, run in an ActivityEnvironment."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

import activities.status_file as status_file
from activities.status_file import load_sprint_status, wait_for_status_file, write_story_status
from bso.models import DEFAULT_STATUS_FILE, LoadStatusInput, StatusWriteInput
from bso.sprint_status import parse_status_text, render_story_file

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "sprint-status.yaml"


def make_project(tmp_path: Path, text: str | None = None) -> tuple[Path, Path]:
    root = tmp_path / "proj"
    status = root / DEFAULT_STATUS_FILE
    status.parent.mkdir(parents=True)
    if text is None:
        shutil.copyfile(FIXTURE, status)
    else:
        status.write_text(text, encoding="utf-8")
    return root, status


async def load(root: Path, status_file: str | None = None):
    return await ActivityEnvironment().run(
        load_sprint_status, LoadStatusInput(project_root=str(root), status_file=status_file)
    )


async def write(root: Path, status: Path, key: str, expected: str, new: str):
    return await ActivityEnvironment().run(
        write_story_status,
        StatusWriteInput(project_root=str(root), status_file=str(status), story_key=key, expected=expected, new=new),
    )


def write_sync(root: Path, status: Path, key: str, expected: str, new: str):
    return asyncio.run(write(root, status, key, expected, new))


async def expect_error(
    coro, fragment: str, non_retryable: bool = True, error_type: str = "StatusFileError"
) -> ApplicationError:
    with pytest.raises(ApplicationError) as ei:
        await coro
    assert fragment in str(ei.value)
    assert ei.value.type == error_type
    assert ei.value.non_retryable is non_retryable
    return ei.value


# --- load ----------------------------------------------------------------------------------------


async def test_load_happy_path_with_story_files(tmp_path: Path) -> None:
    root, status = make_project(tmp_path)
    stories_dir = status.parent
    (stories_dir / "2-2-chunk-manager.md").write_text(
        render_story_file(
            "2-2-chunk-manager", "The Chunk Manager", 2, 2, "backlog", ["it stores chunks"],
            depends_on=["2-1", "1-2-config-loader", "9-9", "2-2"], tags=["Frontend", "ui"], revision=1,
        ),
        encoding="utf-8",
    )
    snap = await load(root)
    assert snap.status_file == os.path.realpath(status)
    assert snap.story_location == "_bmad-output/implementation-artifacts"
    assert snap.project == "chunkstore"
    assert snap.epics == {"epic-1": "in-progress", "epic-2": "backlog", "epic-3": "backlog"}
    by_key = {s.key: s for s in snap.stories}
    assert list(by_key) == [
        "1-1-project-scaffold", "1-2-config-loader", "1-3-logging", "2-1-block-format",
        "2-2-chunk-manager", "2-6a-compaction-hints", "3-1-http-server", "3-2-chunk-manager",
    ]
    cm = by_key["2-2-chunk-manager"]
    assert cm.title == "The Chunk Manager"
    assert cm.depends_on == ["2-1-block-format", "1-2-config-loader"]  # unknown and self deps ignored ...
    # ... and said so, for the sprint's start and its errors (they were in the worker's log only)
    assert snap.dependency_problems == {"2-2-chunk-manager": ["2-2-chunk-manager.md: Depends on '9-9' ignored: "
                                                              "unknown story key '9-9'"]}
    assert cm.tags == ["frontend", "ui"]
    assert cm.epic == "epic-2" and cm.short_key == "2-2" and cm.state == "backlog"
    assert cm.story_path == "_bmad-output/implementation-artifacts/2-2-chunk-manager.md"
    other = by_key["2-6a-compaction-hints"]
    assert other.title == "Compaction Hints" and other.state == "drafted" and other.short_key == "2-6a"
    assert other.depends_on == [] and other.tags == []


async def test_load_relative_story_location_and_status_file(tmp_path: Path) -> None:
    text = "story_location: docs/stories\ndevelopment_status:\n  1-1-a: backlog\n  1-2-b: backlog\n"
    root, _ = make_project(tmp_path, text)
    (root / "docs" / "stories").mkdir(parents=True)
    (root / "docs" / "stories" / "1-2-b.md").write_text("# Story 1.2: Bee\nDepends on: 1-1\n")
    snap = await load(root, DEFAULT_STATUS_FILE)
    assert snap.story_location == "docs/stories"
    assert snap.stories[1].title == "Bee" and snap.stories[1].depends_on == ["1-1-a"]
    (root / "docs" / "stories" / "1-2-b.md").write_text("# Story 1.2: Bee\nDepends on: Story 1.1\n")
    snap = await load(root, DEFAULT_STATUS_FILE)
    assert snap.stories[1].depends_on == ["1-1-a"] and snap.dependency_problems == {}  # BMAD's dotted number
    assert snap.stories[1].story_path == "docs/stories/1-2-b.md"


async def test_load_story_location_outside_refused(tmp_path: Path) -> None:
    root, _ = make_project(tmp_path, "story_location: /etc\ndevelopment_status: {}\n")
    await expect_error(load(root), "outside the project")
    root2, _ = make_project(tmp_path / "b", "story_location: ../../..\ndevelopment_status: {}\n")
    await expect_error(load(root2), "escapes the project")


async def test_load_symlinked_status_file_outside_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside.yaml"
    shutil.copyfile(FIXTURE, outside)
    root = tmp_path / "proj"
    status = root / DEFAULT_STATUS_FILE
    status.parent.mkdir(parents=True)
    status.symlink_to(outside)
    await expect_error(load(root), "outside the project root")


async def test_load_status_file_path_escape_refused(tmp_path: Path) -> None:
    root, _ = make_project(tmp_path)
    await expect_error(load(root, "../outside.yaml"), "escapes the project")
    await expect_error(load(root, "/etc/hostname"), "outside the project root")


async def test_load_missing_project_root(tmp_path: Path) -> None:
    # Retryable, as a missing file: a project moved away mid-sprint is waited for (a sprint's first read refuses
    # it at once: it lists the type as non-retryable).
    await expect_error(load(tmp_path / "nope"), "project root does not exist (moved or deleted?)",
                       non_retryable=False, error_type="StatusFileUnreadable")
    f = tmp_path / "file"
    f.write_text("x")
    await expect_error(load(f), "not a directory")


async def test_load_missing_status_file(tmp_path: Path) -> None:
    (tmp_path / "proj").mkdir()
    # Retryable, like a file that does not parse: mid-sprint, an editor may be saving it (aside, then renamed).
    await expect_error(
        load(tmp_path / "proj"), "status file does not exist", non_retryable=False, error_type="StatusFileUnreadable"
    )


async def test_load_non_utf8(tmp_path: Path) -> None:
    root, status = make_project(tmp_path)
    status.write_bytes(b"development_status:\n  1-1-a: back\xfflog\n")
    err = await expect_error(
        load(root), "not valid UTF-8 at byte offset 33", non_retryable=False, error_type="StatusFileUnreadable"
    )
    assert str(status.name) in str(err)


async def test_load_too_large(tmp_path: Path) -> None:
    root, status = make_project(tmp_path)
    with open(status, "ab") as fh:
        fh.write(b"#" * (6 * 1024 * 1024) + b"\n")
    await expect_error(load(root), "too large")


async def test_load_malformed_yaml_names_file_and_line(tmp_path: Path) -> None:
    root, status = make_project(tmp_path, "development_status:\n  1-1-a: done\n  1-1-a: review\n")
    # Retryable: mid-sprint, a file that does not parse is most likely being saved by someone's editor.
    err = await expect_error(
        load(root), 'found duplicate key "1-1-a"', non_retryable=False, error_type="StatusFileUnreadable"
    )
    assert "sprint-status.yaml: line 3, column 3" in str(err)


# --- U4 write ------------------------------------------------------------------------------------


async def test_write_written_then_already_applied(tmp_path: Path) -> None:
    root, status = make_project(tmp_path)
    os.chmod(status, 0o640)
    before = status.read_text()
    r = await write(root, status, "2-2", "backlog", "story-doc-review")
    assert r.outcome == "written"
    assert (r.story_key, r.previous, r.current) == ("2-2-chunk-manager", "backlog", "story-doc-review")
    assert r.epic_changes == {"epic-2": "in-progress"}
    after = status.read_text()
    assert parse_status_text(after, "x").values()["2-2-chunk-manager"] == "story-doc-review"
    assert stat.S_IMODE(status.stat().st_mode) == 0o640
    # comments and all other lines survive
    old_lines, new_lines = before.splitlines(), after.splitlines()
    assert len(old_lines) == len(new_lines)
    diff = [(a, b) for a, b in zip(old_lines, new_lines, strict=True) if a != b]
    assert [a for a, _ in diff] == [
        "last_updated: 2025-10-05T14:22:03Z",
        "  epic-2: backlog",
        "  2-2-chunk-manager: backlog",
    ]
    assert diff[0][1].startswith("last_updated: 20") and diff[0][1].endswith("Z")
    assert diff[0][1] != diff[0][0]
    assert [ln for ln in new_lines if ln.lstrip().startswith("#")] == [
        ln for ln in old_lines if ln.lstrip().startswith("#")
    ]
    # a retried write after a crash is a no-op
    again = await write(root, status, "2-2-chunk-manager", "backlog", "story-doc-review")
    assert again.outcome == "already-applied"
    assert status.read_text() == after
    # no temp files left behind
    assert sorted(p.name for p in status.parent.iterdir()) == ["sprint-status.yaml", "sprint-status.yaml.lock"]


async def test_write_cas_mismatch_leaves_file_byte_identical(tmp_path: Path) -> None:
    root, status = make_project(tmp_path)
    before = status.read_bytes()
    r = await write(root, status, "1-2-config-loader", "ready-for-dev", "done")
    assert r.outcome == "cas-mismatch"
    assert r.previous == "review" and r.current == "review" and r.epic_changes == {}
    assert status.read_bytes() == before


async def test_write_epic_in_progress_then_done_and_date_only_last_updated(tmp_path: Path) -> None:
    text = (
        "# my sprint\n"
        "last_updated: 2025-01-01\n"
        "development_status:\n"
        "  epic-1: backlog  # first epic\n"
        "  1-1-a: backlog\n"
        "  1-2-b: backlog\n"
        "  epic-1-retrospective: optional\n"
    )
    root, status = make_project(tmp_path, text)
    r = await write(root, status, "1-1", "backlog", "ready-for-dev")
    assert r.epic_changes == {"epic-1": "in-progress"}
    vals = parse_status_text(status.read_text(), "x").values()
    assert vals["epic-1"] == "in-progress"
    assert "  epic-1: in-progress  # first epic\n" in status.read_text()
    last = [ln for ln in status.read_text().splitlines() if ln.startswith("last_updated:")][0]
    assert len(last.split(": ")[1]) == 10  # date only, like before
    r = await write(root, status, "1-1-a", "ready-for-dev", "done")
    assert r.epic_changes == {}
    r = await write(root, status, "1-2-b", "backlog", "done")
    assert r.epic_changes == {"epic-1": "done"}
    vals = parse_status_text(status.read_text(), "x").values()
    assert vals == {"epic-1": "done", "1-1-a": "done", "1-2-b": "done", "epic-1-retrospective": "optional"}
    assert status.read_text().startswith("# my sprint\n")


async def test_a_story_set_done_by_hand_rolls_its_epic_up_at_the_slaves_next_write(tmp_path: Path) -> None:
    """1-2 set done by hand while its dev-runner ran, the last of epic-1 not done: the Slave's write of 1-2 found
    it done (a CAS mismatch: its line is not written), and epic-1 stayed in-progress, BSO rolling epics up only
    in the writes of their stories. That write now rolls it up in the file (the story's line left as it is)."""
    text = (
        "last_updated: 2025-01-01\n"
        "development_status:\n"
        "  epic-1: in-progress\n"
        "  1-1-a: done\n"
        "  1-2-b: done  # set by hand\n"
        "  epic-1-retrospective: optional\n"
    )
    root, status = make_project(tmp_path, text)
    r = await write(root, status, "1-2", "in-progress", "review")
    assert (r.outcome, r.current, r.epic_changes) == ("cas-mismatch", "done", {"epic-1": "done"})
    after = status.read_text()
    assert "  epic-1: done\n" in after and "  1-2-b: done  # set by hand\n" in after
    assert not after.startswith("last_updated: 2025-01-01\n")
    again = await write(root, status, "1-2", "in-progress", "review")  # a retry: nothing more to write
    assert (again.outcome, again.epic_changes) == ("cas-mismatch", {})
    assert status.read_text() == after


async def test_a_write_back_puts_back_the_epic_line_the_write_it_undoes_rolled(tmp_path: Path) -> None:
    """A refused course correction's write-back: the added story's write reports the epic values it rolled and the
    ones they held (epic-2 backlog -> in-progress); given those, the write setting the story back puts the epic
    line back too, its comment kept, under the same lock, in the same replace. Once only: a retry finds it so."""
    text = (
        "development_status:\n"
        "  epic-2: backlog  # second epic\n"
        "  2-1-a: skipped\n"
        "  2-2-b: ready-for-dev\n"
    )
    root, status = make_project(tmp_path, text)
    added = await write(root, status, "2-1", "skipped", "backlog")
    assert (added.outcome, added.epic_changes, added.epics_before) == ("written", {"epic-2": "in-progress"}, {"epic-2": "backlog"})
    back = StatusWriteInput(
        project_root=str(root), status_file=str(status), story_key="2-1-a", expected="backlog", new="skipped",
        epics_back={e: (v, added.epics_before[e]) for e, v in added.epic_changes.items()},
    )
    r = await ActivityEnvironment().run(write_story_status, back)
    assert (r.outcome, r.epic_changes, r.epics_before) == ("written", {"epic-2": "backlog"}, {"epic-2": "in-progress"})
    assert status.read_text() == text
    again = await ActivityEnvironment().run(write_story_status, back)
    assert (again.outcome, again.epic_changes) == ("already-applied", {})
    assert status.read_text() == text


async def test_write_unknown_story_is_non_retryable(tmp_path: Path) -> None:
    root, status = make_project(tmp_path)
    before = status.read_bytes()
    await expect_error(write(root, status, "9-9-nope", "backlog", "done"), "9-9-nope")
    assert status.read_bytes() == before


@pytest.mark.parametrize("broken", ["", "development_status:\n  1-1-a: [unclosed\n", "  1-1-a: done\n- x\n"])
async def test_write_to_a_file_that_does_not_parse_is_retryable_and_changes_nothing(tmp_path: Path, broken: str):
    """Someone's editor saving the file (truncated, or a line typed half-way): the write is retried until the
    file parses again, instead of giving the story up."""
    root, status = make_project(tmp_path)
    status.write_text(broken)
    await expect_error(
        write(root, status, "1-1", "backlog", "done"), "sprint-status.yaml", non_retryable=False,
        error_type="StatusFileUnreadable",
    )
    assert status.read_text() == broken


async def test_a_broken_file_fails_the_write_for_good_from_the_attempt_the_slave_names(tmp_path: Path):
    """A Slave waits for a file that stays broken (wait_for_status_file) once its write has tried a few times:
    from that attempt on the failure is final, before it the write is retried as an editor's save needs."""
    root, status = make_project(tmp_path)
    status.write_text("development_status:\n  1-1-a: [unclosed\n")
    inp = StatusWriteInput(project_root=str(root), status_file=str(status), story_key="1-1", expected="backlog",
                           new="done", wait_when_unreadable_after=4)
    env = ActivityEnvironment()
    for attempt, final in ((3, False), (4, True)):
        env.info = dataclasses.replace(env.info, attempt=attempt)
        await expect_error(env.run(write_story_status, inp), "YAML error", non_retryable=final,
                           error_type="StatusFileUnreadable")


def disk_full_for(monkeypatch, calls: int) -> list[str]:
    """The status file's folder takes no new file for the next `calls` tries (ENOSPC); the paths tried."""
    real, tried = tempfile.mkstemp, []

    def mkstemp(*args, **kwargs):
        tried.append(str(kwargs.get("dir")))
        if len(tried) <= calls:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(status_file.tempfile, "mkstemp", mkstemp)
    return tried


async def test_a_disk_full_for_now_is_waited_for_not_a_story_given_up(tmp_path: Path, monkeypatch):
    """ENOSPC (or EROFS) failed the write as any error: retried a few times, then the story ended
    needs-intervention, the file behind the sprint. It is now the unreadable file's kind: retried, then (from the
    attempt the Slave names) final, and the Slave's wait returns once a write could land."""
    root, status = make_project(tmp_path)
    before = status.read_text()
    disk_full_for(monkeypatch, 2)
    inp = StatusWriteInput(project_root=str(root), status_file=str(status), story_key="1-2", expected="review",
                           new="done", wait_when_unreadable_after=2)
    env = ActivityEnvironment()
    for attempt, final in ((1, False), (2, True)):
        env.info = dataclasses.replace(env.info, attempt=attempt)
        await expect_error(env.run(write_story_status, inp), "cannot be written now (No space left on device)",
                           non_retryable=final, error_type="StatusFileUnreadable")
    assert status.read_text() == before
    env.info = dataclasses.replace(env.info, attempt=3)
    assert (await env.run(write_story_status, inp)).outcome == "written"

    monkeypatch.setattr(status_file, "STATUS_FILE_POLL_SECONDS", 0.01)
    tried = disk_full_for(monkeypatch, 2)
    said: list[str] = []
    waiting = ActivityEnvironment()
    waiting.on_heartbeat = lambda *details: said.extend(details)
    assert await waiting.run(wait_for_status_file, LoadStatusInput(project_root=str(root), status_file=str(status)))
    assert len(tried) == 3 and tried[0] == str(status.parent) and "cannot be written now" in said[0], (tried, said)
    assert sorted(p.name for p in status.parent.iterdir() if p.name.startswith(".")) == []  # no probe left


async def test_a_story_value_that_cannot_be_edited_in_place_is_waited_for_as_a_broken_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A folded value parsed, and only the write of the story's state failed (retried, then the story needed
    intervention, its agent's work lost). It no longer parses: the write waits for the file to be mended, as for
    any file that does not parse, and the wait names the line and how to mend it."""
    root, status = make_project(tmp_path, "development_status:\n  1-1-a: >-\n    ready-for-dev\n")
    why = "line 2, column 10: cannot edit the value of '1-1-a' in place: it is a block scalar (>-); write it plainly"
    await expect_error(
        write(root, status, "1-1", "ready-for-dev", "review"), why, non_retryable=False,
        error_type="StatusFileUnreadable",
    )
    monkeypatch.setattr(status_file, "STATUS_FILE_POLL_SECONDS", 0.01)
    waiting, beats = _waiting_for(root, status)
    await asyncio.sleep(0.3)
    assert not waiting.done() and beats and why in beats[0][0]
    status.write_text("development_status:\n  1-1-a: ready-for-dev\n")
    assert await asyncio.wait_for(waiting, timeout=10) is True
    assert (await write(root, status, "1-1", "ready-for-dev", "review")).outcome == "written"


def _waiting_for(root: Path, status: Path) -> tuple[asyncio.Future, list]:
    """wait_for_status_file running on `status`, and the heartbeats it has sent so far."""
    beats: list = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(details)
    inp = LoadStatusInput(project_root=str(root), status_file=str(status))
    return asyncio.ensure_future(env.run(wait_for_status_file, inp)), beats


async def test_a_wait_taken_over_from_a_lost_worker_still_says_the_file_was_broken(tmp_path: Path):
    """The first attempt's worker died while the file was broken (its heartbeats say so); mended since, the retry
    finds it parsing at once: the wait did see it broken (two waits that never did make the story give up)."""
    root, status = make_project(tmp_path)
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=2, heartbeat_details=["line 3: YAML error"])
    inp = LoadStatusInput(project_root=str(root), status_file=str(status))
    assert await env.run(wait_for_status_file, inp) is True


async def test_the_wait_returns_once_the_file_parses_and_says_it_was_broken(tmp_path: Path):
    root, status = make_project(tmp_path)
    good = status.read_text()
    status.write_text("development_status:\n  1-1-a: [unclosed\n")
    waiting, beats = _waiting_for(root, status)
    await asyncio.sleep(1.5)
    assert not waiting.done() and beats and "YAML error" in beats[0][0]
    status.write_text(good)
    assert await asyncio.wait_for(waiting, timeout=10) is True


async def test_write_refuses_symlink_outside(tmp_path: Path) -> None:
    outside = tmp_path / "outside.yaml"
    shutil.copyfile(FIXTURE, outside)
    root = tmp_path / "proj"
    status = root / DEFAULT_STATUS_FILE
    status.parent.mkdir(parents=True)
    status.symlink_to(outside)
    await expect_error(write(root, status, "2-2", "backlog", "done"), "outside the project root")
    assert outside.read_bytes() == FIXTURE.read_bytes()


@pytest.mark.parametrize("saves", [1, 4, 5])
async def test_an_editors_save_during_a_write_is_kept_not_overwritten(tmp_path: Path, monkeypatch, saves: int) -> None:
    """An editor takes no lock: a save between the write's read and its replace was overwritten (29 of 1,000 saves
    made during a loop of writes were lost). The change is made again on the file as it is then; a file that keeps
    changing fails the attempt, retried, having overwritten nothing."""
    root, status = make_project(tmp_path)
    original = status_file.apply_story_transition
    edits = iter(range(saves))

    def an_editor_saves_meanwhile(text, *args):
        result = original(text, *args)
        if (n := next(edits, None)) is not None:
            tmp = status.with_name("editor.tmp")
            tmp.write_text(status.read_text().replace("# project: chunkstore", f"# project: chunkstore (edit {n})", 1))
            os.replace(tmp, status)  # an editor's atomic save
        return result

    monkeypatch.setattr(status_file, "apply_story_transition", an_editor_saves_meanwhile)
    if saves == 5:
        await expect_error(
            write(root, status, "2-2", "backlog", "story-doc-review"), "changed 5 times while", non_retryable=False,
            error_type="StatusFileBusy",
        )
        assert "(edit 4)" in status.read_text() and "2-2-chunk-manager: backlog" in status.read_text()
        return
    r = await write(root, status, "2-2", "backlog", "story-doc-review")
    assert r.outcome == "written"
    text = status.read_text()
    assert f"(edit {saves - 1})" in text and "2-2-chunk-manager: story-doc-review" in text, text


async def test_a_file_an_editor_has_moved_aside_for_a_moment_during_a_write_is_retried(tmp_path: Path, monkeypatch):
    """vim saves by renaming the file aside, then writing a new one: the write's re-read met no file and the
    story was given up (a non-retryable StatusFileError), where a file missing at the start is waited for."""
    root, status = make_project(tmp_path)
    original = status_file.apply_story_transition
    before = status.read_text()

    def editor_mid_save(text, *args):
        result = original(text, *args)
        os.replace(status, status.with_name(status.name + "~"))
        return result

    monkeypatch.setattr(status_file, "apply_story_transition", editor_mid_save)
    await expect_error(
        write(root, status, "2-2", "backlog", "story-doc-review"), "being saved by someone else while BSO wrote it",
        non_retryable=False, error_type="StatusFileUnreadable",  # waited for, as a file missing at the start is
    )
    assert status.with_name(status.name + "~").read_text() == before and not status.exists()  # nothing written


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    n = 20
    lines = ["# concurrency", "last_updated: 2025-01-01T00:00:00Z", "development_status:", "  epic-1: backlog"]
    lines += [f"  1-{i}-story{i}: backlog  # s{i}" for i in range(1, n + 1)]
    root, status = make_project(tmp_path, "\n".join(lines) + "\n")
    results: list = []
    errors: list = []
    barrier = threading.Barrier(n)

    def worker(i: int) -> None:
        try:
            barrier.wait()
            results.append(write_sync(root, status, f"1-{i}", "backlog", "done"))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(1, n + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(r.outcome for r in results) == ["written"] * n
    vals = parse_status_text(status.read_text(), "x").values()
    assert all(vals[f"1-{i}-story{i}"] == "done" for i in range(1, n + 1))
    assert vals["epic-1"] == "done"
    # exactly one write moved the epic to in-progress, exactly one to done
    changes = [r.epic_changes.get("epic-1") for r in results if r.epic_changes]
    assert changes.count("in-progress") == 1 and changes.count("done") == 1
    text = status.read_text()
    assert all(f"# s{i}\n" in text for i in range(1, n + 1))


def test_load_only_some_stories(tmp_path):
    """A Slave asks only for its batch: the snapshot in its history does not grow with the sprint."""
    from activities.status_file import _load_sync
    from bso.models import LoadStatusInput
    from tests.workflow.helpers import make_project as _make

    _make(tmp_path, {"1-1-a": "review", "1-2-b": "done", "2-1-c": "backlog"})
    snap = _load_sync(LoadStatusInput(project_root=str(tmp_path), only_stories=["1-2-b", "2-1-c", "9-9-gone"]))
    assert [s.key for s in snap.stories] == ["1-2-b", "2-1-c"]
    assert set(snap.epics) == {"epic-1", "epic-2"}
    full = _load_sync(LoadStatusInput(project_root=str(tmp_path)))
    assert [s.key for s in full.stories] == ["1-1-a", "1-2-b", "2-1-c"]


PLAIN = "development_status:\n  epic-1: in-progress\n  1-1-a: review\n  1-2-b: backlog\n  1-3-c: done\n"


@pytest.mark.parametrize("layout", ["fixture (YAML path)", "plain (line-scan path)"])
@pytest.mark.parametrize("outcome", ["written", "cas-mismatch"])
async def test_a_write_reports_the_watched_stories_the_file_holds_otherwise(tmp_path: Path, layout, outcome) -> None:
    """The Slave names the batch's stories not started yet with the state it holds for them; the write answers
    with those the file holds otherwise (set by hand), None for one gone from the file, whatever its outcome."""
    plain = layout.startswith("plain")
    root, status = make_project(tmp_path, PLAIN if plain else None)
    key, current = ("1-1-a", "review") if plain else ("1-2-config-loader", "review")
    by_hand, unchanged = ("1-3-c", "1-2-b") if plain else ("1-3-logging", "2-1-block-format")
    watch = {by_hand: "backlog", unchanged: "backlog", "9-9-gone": "backlog"}
    expected = current if outcome == "written" else "in-progress"
    result = await ActivityEnvironment().run(
        write_story_status,
        StatusWriteInput(
            project_root=str(root), status_file=str(status), story_key=key, expected=expected, new="done", watch=watch
        ),
    )
    assert result.outcome == outcome
    file_value = "done" if plain else "ready-for-dev"
    assert result.watched_changes == {by_hand: file_value, "9-9-gone": None}


@pytest.mark.parametrize("denied", ["file", "directory"])
def test_a_sprint_does_not_start_on_a_status_file_it_cannot_write(tmp_path: Path, monkeypatch, denied) -> None:
    """Checked at the sprint's start, by the Master's load on the worker (whose permissions are the ones that
    count): each story's first agent ran before its first write failed, ten tries later, for every story.
    (os.access is faked: the tests run as root, for whom permission bits do not hold.)"""
    import os

    from activities import status_file
    from activities.status_file import _load_sync
    from tests.workflow.helpers import make_project as _make

    _make(tmp_path, {"1-1-a": "review"})
    target = os.path.realpath(tmp_path / DEFAULT_STATUS_FILE)
    denied_path = target if denied == "file" else os.path.dirname(target)
    real_access = os.access
    monkeypatch.setattr(status_file.os, "access", lambda p, mode: p != denied_path and real_access(p, mode))
    _load_sync(LoadStatusInput(project_root=str(tmp_path)))  # a Slave's load (no claim) reads as before
    with pytest.raises(ApplicationError) as err:
        _load_sync(LoadStatusInput(project_root=str(tmp_path), claim_project=True))
    assert err.value.non_retryable and f"{denied_path} is not writable" in str(err.value)
    assert "the sprint could not record any story's state" in str(err.value)


def test_the_write_probe_fails_on_a_disk_that_takes_only_part_of_the_file(tmp_path: Path, monkeypatch):
    """(From a review.) On a nearly full disk write(2) writes what fits and says so, with no error: the probe
    said "writable", the wait ended, the write failed again, and after a few rounds the story gave up."""
    root, status = make_project(tmp_path)
    free, real_write = [1024], os.write
    assert status.stat().st_size > free[0]

    def write(fd, data):
        if free[0] == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        done = real_write(fd, bytes(data[: free[0]]))
        free[0] -= done
        return done

    monkeypatch.setattr(status_file.os, "write", write)
    with pytest.raises(ApplicationError, match="cannot be written now"):
        status_file._probe_writable(str(status))
