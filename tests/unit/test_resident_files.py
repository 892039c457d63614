"""The files the residents own in .sprint-session/ (the knowledge cache and budget, the debug journal) carry
over from sprint to sprint: one edited by hand or cut short must not disable its resident for good."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.debugger import AnalyzeInput, analyze_failure
from activities.researcher import ResearchInput, research
from bso.debugging import JOURNAL, DebugRequest, DebugResult, render_entry
from bso.research import ResearchRequest

CACHE = ".sprint-session/knowledge-cache"


def _ask(root: Path, query: str = "How do I hash passwords?"):
    inp = ResearchInput(
        project_root=str(root), request=ResearchRequest(request_id="R-1", story_key="1-1", query=query)
    )
    return ActivityEnvironment().run(research, inp)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("index.yaml", "entries: []\n"),  # the wrong shape
        ("index.yaml", "entries: {a: [unclosed\n"),  # broken YAML
        ("index.yaml", b"\xff\xfe entries"),  # not UTF-8
        ("budget.yaml", "calls: {1-1: lots}\n"),  # not a count
        ("budget.yaml", "calls: [1, 2]\n"),  # not a mapping
        ("budget.yaml", "calls: abc\n"),
        ("budget.yaml", "calls: {1-1: .inf}\n"),  # no count either
    ],
)
async def test_an_unreadable_cache_file_is_set_aside_and_research_goes_on(tmp_path: Path, name: str, text):
    directory = tmp_path / CACHE
    directory.mkdir(parents=True)
    path = directory / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    result = await _ask(tmp_path)
    assert result.status == "answered", result  # it answered `error` (ValidationError ...) for good
    assert (directory / f"{name}.unreadable").read_bytes() == (text if isinstance(text, bytes) else text.encode())
    again = await _ask(tmp_path)  # the cache works again: the same question is a hit
    assert (again.status, again.cached) == ("cached", True)


async def test_a_debug_journal_with_bytes_that_are_not_utf8_still_serves(tmp_path: Path):
    journal = tmp_path / ".sprint-session" / JOURNAL
    journal.parent.mkdir(parents=True)
    journal.write_bytes(b"# Debug journal\n\n\x93garbage\xff\n")
    request = DebugRequest(
        debug_id="DBG-b1-1-1-001", story_key="1-1-login", report_to="s/batch-1", session_id="s", error_summary="boom"
    )
    result = await ActivityEnvironment().run(
        analyze_failure, AnalyzeInput(project_root=str(tmp_path), request=request, scripted="fixable")
    )
    assert result.fixable, result  # it answered `unavailable: analysis failed: UnicodeDecodeError`
    assert b"## DBG-b1-1-1-001-s\n" in journal.read_bytes()


async def test_a_debug_id_an_earlier_run_of_the_sprint_journaled_is_analysed_afresh(tmp_path: Path):
    """Debug ids repeat when a sprint is started again under its id: the earlier run's entry for the same id (about
    another error) was taken for this request's retry, and its analysis returned. A retry still finds its own."""
    request = DebugRequest(
        debug_id="DBG-b1-1-1-001", story_key="1-1-login", report_to="s/batch-1", session_id="s",
        error_summary="ImportError: no module named bcrypt",
    )  # fmt: skip
    earlier = DebugRequest(**{**request.model_dump(), "error_summary": "TimeoutError: the database did not answer"})
    journal = tmp_path / ".sprint-session" / JOURNAL
    journal.parent.mkdir(parents=True)
    earlier_result = DebugResult(debug_id=earlier.debug_id, story_key=earlier.story_key, root_cause="the database")
    journal.write_text(render_entry("DBG-b1-1-1-001-s", earlier, earlier_result, "2026-01-05T10:00:00Z"))
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, scheduled_time=datetime(2026, 2, 1, tzinfo=timezone.utc))
    inp = AnalyzeInput(project_root=str(tmp_path), request=request, scripted="fixable")
    fresh = await env.run(analyze_failure, inp)
    assert fresh.fixable and fresh.root_cause != "the database", fresh
    assert journal.read_text().count("## DBG-b1-1-1-001-s\n") == 2
    again = await env.run(analyze_failure, inp)  # its retry: the entry it wrote, nothing appended
    assert again == fresh and journal.read_text().count("## DBG-b1-1-1-001-s\n") == 2


async def test_a_heading_quoted_in_an_errors_text_is_no_journal_entry(tmp_path: Path):
    """An error summary ending in `## DBG-b1-1-1-002-s` is kept on its `error` line: the later request DBG-...-002
    took that line for its own entry (no `when` there: taken for this activity's) and returned its empty fields."""
    first = DebugRequest(
        debug_id="DBG-b1-1-1-001", story_key="1-1-login", report_to="s/batch-1", session_id="s",
        error_summary="AssertionError: expected ## DBG-b1-1-1-002-s",
    )  # fmt: skip
    second = DebugRequest(**{**first.model_dump(), "debug_id": "DBG-b1-1-1-002", "error_summary": "KeyError: 'id'"})
    for request in (first, second):
        result = await ActivityEnvironment().run(
            analyze_failure, AnalyzeInput(project_root=str(tmp_path), request=request, scripted="fixable")
        )
    assert result.fixable and result.root_cause, result  # its own analysis
    assert (tmp_path / ".sprint-session" / JOURNAL).read_text().count("\n## DBG-b1-1-1-002-s\n") == 1
