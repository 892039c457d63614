"""`bso sprint list` showed at most 20 sprints and said nothing of the others.

A server with 49 sprints (after a day of trying BSO): `bso sprint list` prints 20 rows and stops, with no word
that more sprints match; the README's `bso sprint list [--status ...] [--session ID]` does not mention
`--limit` (default 20, only in `--help`). A user looking for an older sprint concludes it is gone. When the
list is cut, it should say so (e.g. `20 of 49 sprints shown: --limit N for more`), on stderr or under the table.
"""

from __future__ import annotations

import io
from datetime import UTC, datetime
from types import SimpleNamespace

from rich.console import Console
from temporalio.client import WorkflowExecutionStatus
from temporalio.common import TypedSearchAttributes
from typer.testing import CliRunner

import pytest

import bso.cli
from bso.cli import app


@pytest.mark.parametrize("limit", [None, 30])
def test_a_list_cut_at_its_limit_says_so(monkeypatch, limit):
    sprints = [
        SimpleNamespace(
            id=f"s-{n}", run_id=f"r{n}", status=WorkflowExecutionStatus.COMPLETED,
            start_time=datetime(2026, 11, 29, 10, n, tzinfo=UTC), close_time=datetime(2026, 11, 29, 10, n, 30, tzinfo=UTC),
            typed_search_attributes=TypedSearchAttributes.empty,
        )
        for n in range(30)
    ]

    class Client:
        async def list_workflows(self, query, limit=None):
            for wf in sprints[:limit]:
                yield wf

        async def count_workflows(self, query=None):
            return SimpleNamespace(count=len(sprints), groups=[])

    async def client():
        return Client()

    async def outcome(_client, _wf):
        return "sprint-complete"

    monkeypatch.setattr(bso.cli, "_client", client)
    monkeypatch.setattr(bso.cli, "_outcome", outcome)
    monkeypatch.setattr(bso.cli, "out", Console(file=(terminal := io.StringIO()), width=160, color_system=None))
    monkeypatch.setattr(bso.cli, "err_console", Console(file=(errors := io.StringIO()), width=160, color_system=None))
    result = CliRunner().invoke(app, ["sprint", "list", *(["--limit", str(limit)] if limit else [])])
    assert result.exit_code == 0, result.output
    shown = [line for line in terminal.getvalue().splitlines() if line.startswith("s-")]
    assert len(shown) == (limit or 20)
    said = terminal.getvalue() + errors.getvalue() + result.output
    if limit is None:
        assert "20 of 30 sprints shown: --limit N shows more" in errors.getvalue(), said
    else:  # all of them: nothing more to say
        assert "--limit" not in said, said
