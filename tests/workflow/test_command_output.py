"""How the command backend reads a CLI's output (activities.backends.command._read_output): an answer that
equals the prompt's example, an echo the launcher redacted, outputs past WHOLE_OUTPUT_BYTES. (Found by a
review of the one-pass reading against the reading before it.)"""

import asyncio
import hashlib
import json
import threading
import tracemalloc
from collections.abc import Callable
from dataclasses import astuple
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from activities.agent_config import load_templates
from activities.agent_launcher import StreamRedactor, redact_forms, secret_forms
from activities.backends import command
from activities.backends.command import WHOLE_OUTPUT_BYTES, _read_output
from bso.agent_output import CliOutput
from bso.agent_profiles import redact_text
from bso.messages import TaskAssignment
from bso.prompting import PromptContext, render_prompt
from bso.states import AgentMode, AgentStatus, AgentType
from tests.workflow.test_command_backend import assignment, dev_project


def run_dir(path: Path, prompt: str, stdout: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "prompt.md").write_text(prompt, encoding="utf-8")
    (path / "stdout.log").write_bytes(stdout.encode())
    return path


MINIMAL = {"msg_type": "AGENT_COMPLETE", "status": "success", "verdict": "passed", "findings": []}
# A project's own .bso/prompts/story-reviewer.md (templates are the project's to change) that tells the agent
# the exact answer to give when the story is fine: the agent that gives it has answered.
CUSTOM_PROMPT = (
    "Review the story.\n\nIf it is ready for development, answer exactly:\n\n```json\n"
    + json.dumps(MINIMAL) + "\n```\n\nOtherwise list findings with verdict needs-improve.\n"
)


def test_an_answer_equal_to_a_templates_minimal_example_is_the_agents_own(tmp_path: Path) -> None:
    """It was refused as an echo of the prompt: in a CLI's own answer text (Claude's `result`) always, in plain
    text when the output holds it once more than the prompt. An echo alone is still no answer."""
    claude = json.dumps({"type": "result", "is_error": False, "result": "```json\n" + json.dumps(MINIMAL) + "\n```",
                         "usage": {"input_tokens": 1000, "output_tokens": 200}})
    assert _read_output(run_dir(tmp_path / "claude", CUSTOM_PROMPT, claude + "\n"))[0].complete == MINIMAL
    plain = CUSTOM_PROMPT + "\nReady.\n" + json.dumps(MINIMAL) + "\n"
    assert _read_output(run_dir(tmp_path / "plain", CUSTOM_PROMPT, plain))[0].complete == MINIMAL
    echo_only = _read_output(run_dir(tmp_path / "echo", CUSTOM_PROMPT, CUSTOM_PROMPT + "\nDone.\n"))[0]
    assert echo_only.complete is None and echo_only.echoed_prompt


def test_an_echo_the_launcher_redacted_is_still_no_answer(tmp_path: Path) -> None:
    """The launcher redacts stdout.log, never prompt.md: an echoed example holding a secret's value (story
    3-1-postgres-schema, POSTGRES_PASSWORD=postgres) differed from the prompt's and was taken as a success."""
    a = TaskAssignment(
        dispatch_id="s/b/3-1/1", agent_type=AgentType.DEV_RUNNER, mode=AgentMode.DEV, story_key="3-1-postgres-schema",
        story_path="stories/3-1-postgres-schema.md", session_id="s", batch_id=1, report_to="s/b", project_root="/p",
    )
    ctx = PromptContext(assignment=a, story_file="/p/stories/3-1.md", workdir="/wt", result_file="/r.json")
    prompt = render_prompt(*load_templates(str(tmp_path), AgentType.DEV_RUNNER), ctx)
    # what agent_launcher writes for a plain-text CLI that echoes its prompt and stops
    echoed = redact_forms(prompt + "\nDone.\n", secret_forms(["postgres"]))
    output, _ = _read_output(run_dir(tmp_path / "run", prompt, echoed), {"POSTGRES_PASSWORD": "postgres"})
    assert output.complete is None and output.echoed_prompt, output


async def test_an_echoing_cli_whose_story_key_holds_a_secrets_value_has_not_succeeded(tmp_path: Path) -> None:
    root = dev_project(tmp_path, FAKE_AGENT_BEHAVIOR="echo-prompt,no-answer", GREETING_API_KEY="hello-world")
    done = await ActivityEnvironment().run(command.run, assignment(root))
    assert done.status is AgentStatus.FAILURE and "repeats the example answer of its prompt" in done.error, done


def test_a_pretty_printed_output_past_the_whole_reading_size_keeps_its_answer_and_tokens(tmp_path: Path) -> None:
    """Gemini's `--output-format json` is one pretty-printed document: past WHOLE_OUTPUT_BYTES, read line by line
    only, its answer and tokens were lost."""
    answer = {"msg_type": "AGENT_COMPLETE", "status": "success", "summary": "g"}
    doc = {"response": "log " * (WHOLE_OUTPUT_BYTES // 4) + json.dumps(answer),
           "stats": {"models": {"gemini-2.5-pro": {"tokens": {"prompt": 900, "candidates": 40, "cached": 100}}}}}
    d = run_dir(tmp_path, "prompt", json.dumps(doc, indent=2))
    assert (d / "stdout.log").stat().st_size > WHOLE_OUTPUT_BYTES
    output, digest = _read_output(d)
    assert (output.complete, astuple(output.tokens)) == (answer, (800, 40, 100, 0))
    assert digest == hashlib.sha256((d / "stdout.log").read_bytes()).hexdigest()


def test_a_pretty_printed_output_past_the_longest_line_is_never_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A document of many short lines was read whole however long (a CLI printing gigabytes of JSON): no more is
    held than the longest line read, MAX_LINE_BYTES. Its answer is then the result file's."""
    monkeypatch.setattr(command, "WHOLE_OUTPUT_BYTES", 2**20)  # (small bounds keep the test quick)
    monkeypatch.setattr(command, "MAX_LINE_BYTES", 2**21)
    answer = {"msg_type": "AGENT_COMPLETE", "status": "success", "summary": "g"}
    doc = {"lines": ["log line"] * 2**19, "response": json.dumps(answer)}
    output, _, peak = read_measured(run_dir(tmp_path, "p", json.dumps(doc, indent=2)))
    assert (output.complete, output.documents) == (None, 0)
    assert peak < 2**21, peak


def test_a_single_line_past_the_whole_reading_size_keeps_its_answer(tmp_path: Path) -> None:
    answer = {"msg_type": "AGENT_COMPLETE", "status": "success", "summary": "h"}
    claude = json.dumps({"type": "result", "is_error": False, "usage": {"input_tokens": 3, "output_tokens": 4},
                         "result": "x" * (WHOLE_OUTPUT_BYTES + 10) + json.dumps(answer)})
    plain = "y" * (WHOLE_OUTPUT_BYTES + 10) + " " + json.dumps(answer)
    for i, out in enumerate((claude, plain, claude + "\r\n")):
        d = run_dir(tmp_path / str(i), "p", out)
        output, digest = _read_output(d)
        assert output.complete == answer, i
        assert astuple(output.tokens)[:2] == ((0, 0) if out is plain else (3, 4)), (i, output.tokens)
        assert digest == hashlib.sha256((d / "stdout.log").read_bytes()).hexdigest()


def read_measured(d: Path) -> tuple[CliOutput, str, int]:
    """_read_output's output and sha256, and the most memory it held at once (tracemalloc)."""
    tracemalloc.start()
    try:
        output, digest = _read_output(d)
        return output, digest, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_line_of_hundreds_of_mb_is_hashed_but_never_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One line with no newline (a tool's output relayed in one CLI event) was held whole and parsed, however
    long; alone in the output, it would be loaded whole again as one pretty-printed document. Past MAX_LINE_BYTES
    a line is hashed, never held: the events around it are read, the hash is the whole output's."""
    monkeypatch.setattr(command, "WHOLE_OUTPUT_BYTES", 2**20)  # (small bounds keep the test quick)
    monkeypatch.setattr(command, "MAX_LINE_BYTES", 2**20, raising=False)
    relayed = json.dumps({"type": "item.completed", "item": {"type": "command_execution", "aggregated_output": "x" * 2**25}})
    turn = json.dumps({"type": "turn.completed", "usage": {"input_tokens": 10, "output_tokens": 2}})
    answer = json.dumps({"type": "item.completed", "item": {"type": "agent_message", "text": '{"status": "success"}'}})
    outputs = {"events around it": f"{turn}\n{relayed}\r\n{turn}\n{answer}\n", "alone": relayed}
    for kind, text in outputs.items():
        output, digest, peak = read_measured(run_dir(tmp_path / kind, "p", text))
        assert peak < 2**25 / 4, (kind, peak)
        assert digest == hashlib.sha256(text.encode()).hexdigest(), kind
        if text is not relayed:
            assert (output.complete, output.tokens.weighted(1.0), output.documents) == ({"status": "success"}, 24, 3)
        else:
            assert (output.complete, output.documents) == (None, 0)


def test_a_long_plain_text_output_that_ends_with_its_answer_is_not_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain-text log past WHOLE_OUTPUT_BYTES that ends with a pretty-printed answer (`}`) was read whole in vain
    as one JSON document: only an output that starts as one is."""
    monkeypatch.setattr(command, "WHOLE_OUTPUT_BYTES", 2**20)  # (small bounds keep the test quick)
    answer = {"msg_type": "AGENT_COMPLETE", "status": "success", "summary": "built"}
    text = "build step ok\n" * 2**18 + json.dumps(answer, indent=2)
    output, digest, peak = read_measured(run_dir(tmp_path, "p", text))
    assert peak < len(text) / 4, (peak, len(text))
    assert (output.complete, digest) == (answer, hashlib.sha256(text.encode()).hexdigest())


async def test_the_result_file_is_read_and_redacted_while_the_event_loop_runs_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The result file was read, then it and the PO's answer files redacted, on the worker's event loop: an agent's
    file of any size held up the heartbeats and the worker's other activities. Here each waits until a coroutine
    of the loop has run: on the loop itself it never could (it waits 10 s in vain)."""
    loop = asyncio.get_running_loop()
    waited: dict[str, bool] = {}

    def once_the_loop_has_run(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            if name not in waited:
                ran = threading.Event()

                async def concurrent() -> None:
                    ran.set()

                asyncio.run_coroutine_threadsafe(concurrent(), loop)
                waited[name] = ran.wait(10)
            return real(*args)

        return call

    monkeypatch.setattr(command, "read_result_file", once_the_loop_has_run("read", command.read_result_file))
    monkeypatch.setattr(command, "_redact_file", once_the_loop_has_run("redact", command._redact_file))
    done = await ActivityEnvironment().run(command.run, assignment(dev_project(tmp_path)))
    assert waited == {"read": True, "redact": True}, "read or redacted on the event loop: no coroutine ran meanwhile"
    assert done.status is AgentStatus.SUCCESS, done.error


def test_a_result_file_of_hundreds_of_mb_is_redacted_in_blocks_as_if_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The result file was read whole to redact it, however long (the agent's to write). It is redacted in blocks:
    a secret across a block's end, one inside another, a character cut in two all read as in the whole file."""
    env = {"API_TOKEN": "abcd1234efgh", "DB_PASSWORD": "abcd1234", "OTHER_SECRET": "pässwörd-ünïcode",
           "SSH_KEY": "first line of the key\nsecond line of it"}
    text = ('{"summary": "x abcd1234efgh y abcd1234 pässwörd-ünïcode caf\u00e9 ' + json.dumps("pässwörd-ünïcode")[1:-1]
            + ' abcd1234efghabcd1234 first line of the key\\nsecond line of it end"}\nsecond line of it\n')
    path = tmp_path / "result.json"
    for block in (1, 2, 3, 5, 7, 11, 16, 64):
        monkeypatch.setattr(command, "_BLOCK_BYTES", block)
        path.write_text(text)
        command._redact_file(path, env)
        assert path.read_text() == redact_text(text, env), block
    clean = b'{"summary": "caf\xe9, no secret"}'  # (not UTF-8 either: left as it is)
    path.write_bytes(clean)
    command._redact_file(path, env)
    assert path.read_bytes() == clean

    monkeypatch.setattr(command, "_BLOCK_BYTES", 64 * 1024)
    path.write_text(text * (2**25 // len(text)))
    size = path.stat().st_size
    tracemalloc.start()
    try:
        command._redact_file(path, env)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < size / 4, (peak, size)
    assert path.read_text() == redact_text(text, env) * (2**25 // len(text))


def test_a_redaction_failing_midway_leaves_the_answer_as_it_was_and_no_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk full while the redacted copy is written: the file stays whole (the activity fails and is
    retried), and no half-written copy is left beside it."""
    path = tmp_path / "result.json"
    path.write_text('{"summary": "the token abcd1234efgh"}')
    monkeypatch.setattr(command, "_BLOCK_BYTES", 8)
    fed = StreamRedactor.feed

    def full_disk(self, text):
        if "token" in text:
            raise OSError(28, "No space left on device")
        return fed(self, text)

    monkeypatch.setattr(StreamRedactor, "feed", full_disk)
    with pytest.raises(OSError):
        command._redact_file(path, {"API_TOKEN": "abcd1234efgh"})
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]
    assert path.read_text() == '{"summary": "the token abcd1234efgh"}'
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]
