"""With the token budget off, the report (and `bso sprint status`) showed a limit as if it were in force.

`bso sprint start P --set token_budget.enabled=false`: the sprint never pauses nor stops on tokens, yet the
execution summary's Results Overview says `| tokens used | 2000 / 2000000 |` and `bso sprint status` /
`watch` draw a `tokens 2000/2000000` bar against the budget: a user reads that a 2,000,000-token budget
holds the sprint. The line should say there is no budget (e.g. `2000 (no budget: token_budget.enabled is
false)`), not a limit.
"""

from __future__ import annotations

import io

from rich.console import Console

from bso.cli import _progress, _view_from_report
from bso.config import SprintConfig
from bso.models import SprintReport
from bso.summary import render_summary


def _tokens_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("| tokens used |"))


def test_the_tokens_line_names_no_limit_when_the_budget_is_off():
    report = SprintReport(session_id="s", status="sprint-complete", tokens_used=2000, token_limit=2_000_000)
    config = SprintConfig.model_validate({"token_budget": {"enabled": False}})
    line = _tokens_line(render_summary(report, config, overrides={"token_budget.enabled": False}))
    assert "2000000" not in line, line
    assert "2000" in line


def test_the_tokens_line_keeps_the_limit_when_the_budget_is_on():
    report = SprintReport(session_id="s", status="sprint-complete", tokens_used=2000, token_limit=2_000_000)
    assert _tokens_line(render_summary(report, SprintConfig())) == "| tokens used | 2000 / 2000000 |"


def _tokens_row(report: SprintReport, budget_on: bool) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(_progress(_view_from_report(report, budget_on), None, "sprint-complete", from_report=True))
    return next(line for line in console.export_text().splitlines() if line.startswith("tokens"))


def test_the_status_from_the_report_draws_no_budget_bar_when_the_budget_is_off():
    report = SprintReport(session_id="s", status="sprint-complete", tokens_used=2000, token_limit=2_000_000)
    assert _view_from_report(report, budget_on=False).token_limit == 0
    off = _tokens_row(report, budget_on=False)
    assert "2000000" not in off and "2000 (no budget)" in off and "━" not in off, off
    assert "2000/2000000" in _tokens_row(report, budget_on=True)
