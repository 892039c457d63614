"""`bso protocol schema` and `bso protocol validate`, through typer's CliRunner and as a module."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from bso.messages import MESSAGE_TYPES
from bso.protocol_cli import protocol_app
from tests.unit import message_examples as ex

runner = CliRunner()


def test_schema_writes_one_file_per_type_and_an_index(tmp_path: Path) -> None:
    result = runner.invoke(protocol_app, ["schema", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    index = json.loads((tmp_path / "index.json").read_text())
    names = set(index["types"])
    assert names >= {t for t in MESSAGE_TYPES if t != "error"}
    assert {"error.delivery_failed", "error.response_timeout", "error.validation_failed"} <= names
    for entry in index["types"].values():
        body = json.loads((tmp_path / entry["file"]).read_text())
        assert body["type"] == "object" and "properties" in body
    query = json.loads((tmp_path / "query.schema.json").read_text())
    assert "from" in query["required"] and query["properties"]["id"]["pattern"] == "^msg-[a-f0-9]{8}$"
    union = json.loads((tmp_path / "messages.schema.json").read_text())
    assert union["discriminator"]["propertyName"] == "type"


def test_validate_ok_json_and_yaml(tmp_path: Path) -> None:
    good = tmp_path / "query.json"
    good.write_text(json.dumps(ex.SCHEMAS["query"]))
    result = runner.invoke(protocol_app, ["validate", str(good)])
    assert result.exit_code == 0 and result.output.startswith("OK query msg-a1b2c3d4")
    yaml_file = tmp_path / "debug.yaml"
    yaml_file.write_text(
        "msg_type: DEBUG_REQUEST\ndebug_id: DBG-001\nstory_key: 3-1\nagent_type: dev-runner\n"
        "error_summary: Test failure\nseverity_hint: HIGH\n"
    )
    result = runner.invoke(protocol_app, ["validate", str(yaml_file)])
    assert result.exit_code == 0, result.output
    assert "OK DEBUG_REQUEST msg-" in result.output


def test_validate_invalid_prints_field_errors_and_exits_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**ex.SCHEMAS["query"], "payload": {}, "priority": "urgent"}))
    result = runner.invoke(protocol_app, ["validate", str(bad)])
    assert result.exit_code == 1
    assert "payload.question: required field missing" in result.output
    assert "priority: invalid value: urgent" in result.output
    result = runner.invoke(protocol_app, ["validate", "--json", str(bad)])
    assert result.exit_code == 1
    rendered = json.loads(result.output)
    assert rendered["error_type"] == "validation_failed" and rendered["original_message_id"] == "msg-a1b2c3d4"
    po = tmp_path / "po.json"
    po.write_text(json.dumps({k: v for k, v in ex.PO["COMPLETION_REPORT"].items() if k != "ac_verification"}))
    result = runner.invoke(protocol_app, ["validate", "--po", str(po)])
    assert result.exit_code == 1
    assert json.loads(result.output)["error"]["message"] == "Missing required field: ac_verification"


def test_validate_unreadable_file_exits_2(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not: json: [")
    result = runner.invoke(protocol_app, ["validate", str(broken)])
    assert result.exit_code == 2
    assert runner.invoke(protocol_app, ["validate", str(tmp_path / "missing.json")]).exit_code == 2


def test_runs_as_a_module(tmp_path: Path) -> None:
    good = tmp_path / "m.json"
    good.write_text(json.dumps(ex.GEAR2["agent_error"]))
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "bso.protocol_cli", "validate", str(good)],
        cwd=root, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("OK agent_error msg-e0000001")


def test_mounted_as_bso_protocol(tmp_path: Path) -> None:
    from bso.cli import app

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**ex.SCHEMAS["query"], "payload": {}}))
    result = runner.invoke(app, ["protocol", "validate", str(bad)])
    assert result.exit_code == 1 and "payload.question: required field missing" in result.output
    assert runner.invoke(app, ["protocol", "schema", "--out", str(tmp_path / "s")]).exit_code == 0


def test_validate_takes_an_agent_answer_as_the_agent_complete_signal_carries_it(tmp_path: Path) -> None:
    """The README's external-agent answer (no msg_type: the signal's name says what it is) is what an agent
    checks with `bso protocol validate`: it was refused for a missing `type`, and a bad status went unnamed."""
    answer = {"dispatch_id": "sprint-ext/batch-1/1-2/1", "story_key": "1-2-pantry-item-model-and-storage",
              "agent_type": "story-creator", "mode": "create", "status": "success",
              "tokens_used": 1234, "summary": "story file written"}
    good = tmp_path / "answer.json"
    good.write_text(json.dumps(answer))
    result = runner.invoke(protocol_app, ["validate", str(good)])
    assert result.exit_code == 0 and result.output.startswith("OK AGENT_COMPLETE"), result.output
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**answer, "status": "bogus"}))
    result = runner.invoke(protocol_app, ["validate", str(bad)])
    assert result.exit_code == 1 and "status: invalid value: bogus" in result.output, result.output


def test_validate_refuses_an_answer_the_batch_refuses_for_its_tokens_in_the_batchs_words(tmp_path: Path) -> None:
    """An answer claiming over 1,000,000,000 tokens was `OK AGENT_COMPLETE` to validate, and the batch then refused
    it (implausible_tokens): validate applies that rule itself and says the batch's reason."""
    from bso.dispatch import MAX_TOKENS_PER_ANSWER, implausible_tokens
    from bso.messages import AgentComplete

    answer = {"dispatch_id": "sprint-ext/batch-1/1-2/1", "story_key": "1-2-pantry-item-model-and-storage",
              "agent_type": "dev-runner", "mode": "dev", "status": "success", "tokens_used": 5_000_000_000}
    reason = implausible_tokens(AgentComplete.model_validate(answer)).reason
    path = tmp_path / "answer.json"
    path.write_text(json.dumps(answer))
    result = runner.invoke(protocol_app, ["validate", str(path)])
    assert result.exit_code == 1 and reason in result.output, result.output
    result = runner.invoke(protocol_app, ["validate", "--json", str(path)])
    assert result.exit_code == 1
    assert json.loads(result.output)["errors"] == [{"field": "tokens_used", "error": reason}]
    result = runner.invoke(protocol_app, ["validate", "--po", str(path)])
    assert result.exit_code == 1 and json.loads(result.output)["error"]["message"] == reason
    # The same answer in an envelope, and the most the batch takes, as before.
    envelope = tmp_path / "envelope.json"
    wrapped = {k: v for k, v in ex.SCHEMAS["query"].items() if k != "timeout_ms"}
    envelope.write_text(json.dumps({**wrapped, "type": "AGENT_COMPLETE", "payload": {**answer, "tokens_used": 5}}))
    result = runner.invoke(protocol_app, ["validate", str(envelope)])
    assert result.exit_code == 0 and result.output.startswith("OK AGENT_COMPLETE"), result.output
    envelope.write_text(json.dumps({**wrapped, "type": "AGENT_COMPLETE", "payload": answer}))
    result = runner.invoke(protocol_app, ["validate", str(envelope)])
    assert result.exit_code == 1 and reason in result.output, result.output
    path.write_text(json.dumps({**answer, "tokens_used": MAX_TOKENS_PER_ANSWER}))
    result = runner.invoke(protocol_app, ["validate", str(path)])
    assert result.exit_code == 0 and result.output.startswith("OK AGENT_COMPLETE"), result.output


def test_validate_takes_an_agent_po_answer_without_timestamp_as_the_sprint_does(tmp_path: Path) -> None:
    """A dev agent's PLAN_SUBMISSION / COMPLETION_REPORT may leave out its timestamp (the sprint takes the time it
    reads the answer): validate said `timestamp: required field missing` of what the sprint accepted."""
    from tests.unit import message_examples as ex

    for kind in ("PLAN_SUBMISSION", "COMPLETION_REPORT"):
        answer = {k: v for k, v in ex.PO[kind].items() if k != "timestamp"}
        path = tmp_path / f"{kind}.json"
        path.write_text(json.dumps(answer))
        result = runner.invoke(protocol_app, ["validate", str(path)])
        assert result.exit_code == 0 and result.output.startswith(f"OK {kind}"), result.output
        assert "no timestamp: BSO takes the time it reads the answer" in result.output
    # Other messages still need theirs (BSO writes them itself).
    directive = tmp_path / "go.json"
    directive.write_text(json.dumps({k: v for k, v in ex.PO["GO_DIRECTIVE"].items() if k != "timestamp"}))
    result = runner.invoke(protocol_app, ["validate", str(directive)])
    assert result.exit_code == 1 and "timestamp: required field missing" in result.output, result.output


def test_validate_a_file_that_cannot_be_read_says_so_as_every_bso_error(tmp_path: Path) -> None:
    result = runner.invoke(protocol_app, ["validate", str(tmp_path / "nope.json")])
    assert result.exit_code == 2 and result.stdout == "", result.output
    # The OS's words once, not Python's `[Errno 2] No such file or directory: '<the path again>'`.
    assert result.stderr == f"bso: error: cannot read {tmp_path / 'nope.json'}: No such file or directory\n", result.stderr


def test_validate_a_file_that_does_not_parse_says_so_on_one_line(tmp_path: Path) -> None:
    """The YAML parser's error came on four lines (`while parsing a flow node ... ^ (line: 2)`), for a .json file
    too: one line now, as every `bso` error, with the JSON parser's words for a .json file."""
    cases = {
        "bad.json": ('{"msg_type": "AGENT_COMPLETE",\n  "x": [1, 2\n', "not valid JSON: Expecting ',' delimiter: line 3"),
        "bad.yaml": ("a: [1, 2\nb: 3\n", "YAML error: expected ',' or ']', but got ':' (line 2, column 2)"),
        "bad.txt": ('{"a": [1,\n', "YAML error: expected the node content, but found '<stream end>' (line 2, column 1)"),
    }
    for name, (text, said) in cases.items():
        (tmp_path / name).write_text(text)
        result = runner.invoke(protocol_app, ["validate", str(tmp_path / name)])
        assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith(f"bso: error: cannot read {tmp_path / name}: {said}"), result.stderr
