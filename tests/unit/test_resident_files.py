"""The files the residents own in .sprint-session/ (the knowledge cache and budget, the debug journal) carry
over from sprint to sprint: one edited by hand or cut short must not disable its resident for good."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.debugger import AnalyzeInput, analyze_failure
from activities.researcher import ResearchInput, research
from bso.debugging import JOURNAL, DebugRequest
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
