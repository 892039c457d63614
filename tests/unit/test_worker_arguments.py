"""The worker's command lines refuse a count or a port out of range in one line, before any server is asked: a
negative --max-concurrent-agents failed `python -m workers.main` with a traceback once the server answered."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from bso.cli import app
from workers.main import main


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--max-concurrent-agents", "-3"], "-3 is not 1 or more"),
        (["--max-concurrent-agents", "0"], "0 is not 1 or more"),
        (["--max-concurrent-agents", "two"], "'two' is not an integer"),
        (["--metrics-port", "70000"], "70000 is not from 1 to 65535"),
    ],
)
def test_python_m_workers_main_refuses_a_value_out_of_range_in_one_line(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["--max-concurrent-agents", "-3"], ["--metrics-port", "70000"]])
def test_bso_worker_refuses_a_value_out_of_range_in_one_line(argv: list[str]) -> None:
    result = CliRunner().invoke(app, ["worker", *argv])
    assert result.exit_code == 2 and "Invalid value" in result.output, result.output
