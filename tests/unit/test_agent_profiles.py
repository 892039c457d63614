"""The pure parts of the command backend: profiles, CLI output, git rules, prompt rendering."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError

from activities.agent_config import load_agents_file, load_templates

from activities.session_files import UnreadableResultFile, read_result_file
from bso.agent_output import (
    CliOutput,
    TokenUse,
    cli_output,
    json_documents,
    line_documents,
    prompt_examples,
    read_cli_output,
)
from bso.agent_profiles import (
    AgentProfileError,
    AgentsFile,
    dispatch_session_id,
    is_secret_env_key,
    ProfilePatch,
    parse_agents_file,
    redact_env,
    redact_text,
    render_argv,
    resolve_profile,
)
from bso.git_rules import (
    GitRuleError,
    index_holds,
    is_secret_path,
    out_of_scope,
    parse_acceptance_criteria,
    parse_file_scope,
    parse_porcelain,
    parse_porcelain_entries,
    removal_staged,
    squash_message,
    story_branch,
)
from bso.messages import Finding, TaskAssignment
from bso.prompting import PromptContext, render_prompt, result_shape
from bso.states import AgentMode, AgentType, Severity

TOML = """
default_profile = "claude"

[profiles.claude-opus]
extends = "claude"
argv = ["claude", "-p", "{prompt}", "--output-format", "json", "--model", "opus"]
env = { ANTHROPIC_MODEL = "opus" }

[agents.review-runner]
profile = "codex"

[agents.dev-runner]
timeout_seconds = 1200

[agents.dev-runner.modes.fix]
profile = "claude-opus"
timeout_seconds = 2400

[verification]
commands = [["pytest", "-q"], ["ruff", "check", "."]]
"""


def test_toml_profiles_resolve_per_agent_and_mode() -> None:
    agents = parse_agents_file(TOML, "agents.toml")
    dev = resolve_profile(agents, AgentType.DEV_RUNNER, AgentMode.DEV)
    assert dev.name == "claude" and dev.argv[:2] == ["claude", "-p"] and dev.timeout_seconds == 1200
    assert dev.workdir == "worktree"
    fix = resolve_profile(agents, AgentType.DEV_RUNNER, AgentMode.FIX)
    assert fix.name == "claude-opus" and "opus" in fix.argv and fix.timeout_seconds == 2400
    assert fix.env == {"ANTHROPIC_MODEL": "opus"}
    review = resolve_profile(agents, AgentType.REVIEW_RUNNER, AgentMode.REVIEW)
    assert review.argv == ["codex", "exec", "--json", "{prompt}"] and review.output == "jsonl"
    creator = resolve_profile(agents, AgentType.STORY_CREATOR, AgentMode.CREATE)
    assert creator.workdir == "project"
    assert agents.verification.commands == [["pytest", "-q"], ["ruff", "check", "."]]


def test_yaml_file_is_accepted() -> None:
    text = "default_profile: codex\nagents:\n  dev-runner:\n    profile: aider\n"
    agents = parse_agents_file(text, "agents.yaml")
    dev = resolve_profile(agents, AgentType.DEV_RUNNER, AgentMode.DEV)
    assert dev.prompt_via == "file" and "{prompt_file}" in dev.argv


def test_whole_numbers_written_as_floats_are_still_taken() -> None:
    """Refusing `true` for a number must not refuse `600.0`, which files written before took."""
    agents = parse_agents_file(
        "[agents.dev-runner]\ntimeout_seconds = 600.0\n[verification]\ntimeout_seconds = 300.0\n"
        "[tokens]\ncache_read_weight = 0\n", "agents.toml",
    )
    assert agents.agents[AgentType.DEV_RUNNER].timeout_seconds == 600 and agents.verification.timeout_seconds == 300


@pytest.mark.parametrize(
    "text, needle",
    [
        ("default_profile = 3", "default_profile"),
        ("[agents.dev-runnr]\nprofile='x'", "agents"),
        ("[profiles.x]\nargv=['x']\nprompt_via='arg'", "'{prompt}'"),
        ("[profiles.a]\nextends='b'\n[profiles.b]\nextends='a'", "loops"),
        ("[profiles.x]\nextends='x'", "profile 'x': 'extends' loops (x -> x)"),  # (a bare KeyError)
        ("not toml [", "not valid TOML"),
        ("[profiles.x]\nextends='nope'", "unknown agent profile"),
        ("[verification]\ntimeout_seconds = 3600", "verification.timeout_seconds"),
        # Each of these was taken at the start and failed only after three agents had run (a hunt, 2026-11-26):
        ('[verification]\npassed_pattern = "(\\\\d+ passed"', "verification.passed_pattern"),
        ('[verification]\npassed_pattern = "passed"', "needs exactly one group"),
        ('[git]\ncommit_message = ""', "git.commit_message"),
        ('[git]\nsquash_message = "  "', "git.squash_message"),
        ('[profiles.x]\nextends="claude"\nenv = { A = "a\\u0000b" }', "NUL"),
        ('[verification]\ncommands = [["pytest", "\\u0000"]]', "NUL"),
        # Names no process takes: each dispatch failed on Python's bare "illegal environment variable name".
        ('[profiles.x]\nextends="claude"\n[profiles.x.env]\n"BAD=NAME" = "1"',
         "agents.toml: profiles.x.env.BAD=NAME.[key]: Value error, the environment variable name 'BAD=NAME' holds '='"),
        ('[agents.dev-runner.env]\n"" = "1"', "agents.dev-runner.env..[key]: Value error, the environment variable name '' is empty"),
        ('[agents.dev-runner.modes.fix.env]\n"A=" = "1"', "agents.dev-runner.modes.fix.env.A=.[key]"),
        ("kill_grace_seconds = inf", "kill_grace_seconds"),
        ("heartbeat_seconds = 1e9", "heartbeat_seconds"),
        # A hunt, 2026-11-28: `inf` failed every agent's answer after its work (each ran again, up to 5 times);
        # `true` was read as 1 (a one-second agent timeout).
        ("[tokens]\ncache_write_weight = inf", "tokens.cache_write_weight"),
        ("[tokens]\ncache_write_weight = 1e6", "tokens.cache_write_weight"),
        ("[tokens]\ncache_read_weight = nan", "tokens.cache_read_weight"),
        ("[agents.dev-runner]\ntimeout_seconds = true", "agents.dev-runner.timeout_seconds"),
        ("[profiles.x]\nextends='claude'\ntimeout_seconds = true", "profiles.x.timeout_seconds"),
        ("heartbeat_seconds = true", "heartbeat_seconds"),
        ("[verification]\ntimeout_seconds = true", "verification.timeout_seconds"),
    ],
)
def test_bad_agents_files_name_the_problem(text: str, needle: str) -> None:
    with pytest.raises(AgentProfileError) as err:
        parse_agents_file(text, "agents.toml")
    assert needle in str(err.value)


def _extends_chain(links: int) -> str:
    """An agents file whose default profile p0 extends p1, ..., which extends p<links>, the one with an argv."""
    return 'default_profile = "p0"\n' + "".join(f'[profiles.p{i}]\nextends = "p{i + 1}"\n' for i in range(links)) + (
        f'[profiles.p{links}]\nextends = "generic"\nargv = ["agent", "{{prompt}}"]\n'
    )


def test_a_long_extends_chain_is_an_agent_profile_error_not_a_recursion_error() -> None:
    """A chain longer than Python's recursion limit raised a bare RecursionError (at `bso sprint start` and in
    every dispatch); one of thousands took seconds to check. Past MAX_EXTENDS_DEPTH it is refused, naming it."""
    from bso.agent_profiles import MAX_EXTENDS_DEPTH

    agents = parse_agents_file(_extends_chain(MAX_EXTENDS_DEPTH - 1), "agents.toml")  # p0 ... p49: 50 profiles
    assert resolve_profile(agents, AgentType.DEV_RUNNER, AgentMode.DEV).argv == ["agent", "{prompt}"]
    for links in (MAX_EXTENDS_DEPTH, 1500):
        with pytest.raises(AgentProfileError) as err:
            parse_agents_file(_extends_chain(links), "agents.toml")
        assert str(err.value) == (
            f"profile 'p0': its 'extends' chain is longer than {MAX_EXTENDS_DEPTH} profiles (p0 -> p1 -> ... -> "
            f"p{MAX_EXTENDS_DEPTH}): have it extend a built-in profile, or one nearer to it"
        )


def test_an_env_name_holding_a_nul_is_refused_naming_it() -> None:
    with pytest.raises(AgentProfileError) as err:
        parse_agents_file('profiles:\n  x:\n    extends: claude\n    env: {"A\\0B": "1"}\n', ".bso/agents.yaml")
    assert str(err.value).startswith(".bso/agents.yaml: profiles.x.env.A\x00B.[key]: Value error, the environment variable "
                                     "name 'A\\x00B' holds a NUL"), str(err.value)


def test_generic_needs_argv_and_reviewer_may_not_resume_a_session() -> None:
    with pytest.raises(AgentProfileError, match="no argv"):
        resolve_profile(AgentsFile(default_profile="generic"), AgentType.DEV_RUNNER, AgentMode.DEV)
    agents = parse_agents_file(
        "[profiles.resumer]\nextends='claude'\nargv=['claude','--resume','{session_id}','-p','{prompt}']\n",
        "agents.toml",
    )
    agents = agents.model_copy(update={"default_profile": "resumer"})
    assert resolve_profile(agents, AgentType.DEV_RUNNER, AgentMode.DEV).name == "resumer"
    with pytest.raises(AgentProfileError, match="P30"):
        resolve_profile(agents, AgentType.REVIEW_RUNNER, AgentMode.REVIEW)
    for argv in (["claude", "-c", "-p", "{prompt}"], ["claude", "-p", "{prompt}", "--resume=abc"],
                 ["/usr/bin/opencode", "run", "-s", "abc", "{prompt}"]):
        reviewer = AgentsFile(profiles={"r": ProfilePatch(extends="claude", argv=argv)}, default_profile="r")
        with pytest.raises(AgentProfileError, match="P30"):
            resolve_profile(reviewer, AgentType.REVIEW_RUNNER, AgentMode.REVIEW)
    in_project = AgentsFile(agents={AgentType.DEV_RUNNER: {"workdir": "project"}})
    with pytest.raises(AgentProfileError, match="would skip BSO's Exit Gate"):
        resolve_profile(in_project, AgentType.DEV_RUNNER, AgentMode.FIX)
    no_git = AgentsFile(agents={AgentType.DEV_RUNNER: {"workdir": "project"}}, git={"enabled": False})
    assert resolve_profile(no_git, AgentType.DEV_RUNNER, AgentMode.FIX).workdir == "project"
    # codex's -c sets a config value: not a resume
    codex = AgentsFile(profiles={"r": ProfilePatch(extends="codex", argv=["codex", "exec", "-c", "x=1", "{prompt}"])},
                       default_profile="r")
    assert resolve_profile(codex, AgentType.REVIEW_RUNNER, AgentMode.REVIEW).name == "r"
    assert dispatch_session_id("s/1/1-1/3") != dispatch_session_id("s/1/1-1/4")


def test_argv_rendering_and_redaction() -> None:
    # One pass: placeholders inside a substituted value (a story quoting `{workdir}`) stay as written.
    assert render_argv(["x", "{prompt}", "{workdir}"], {"prompt": "see {workdir} and {result_file}", "workdir": "/w",
                                                      "result_file": "/r"}) == ["x", "see {workdir} and {result_file}", "/w"]
    assert render_argv(["x", "-p", "{prompt}", "--f={prompt_file}"], {"prompt": "hi", "prompt_file": "/p"}) == [
        "x", "-p", "hi", "--f=/p",
    ]
    assert is_secret_env_key("OPENAI_API_KEY") and is_secret_env_key("GH_TOKEN") and is_secret_env_key("DB_PASSWORD")
    assert not is_secret_env_key("PATH") and not is_secret_env_key("BSO_STORY_KEY")
    assert all(map(is_secret_env_key, ("DATABASE_URL", "GITHUB_PAT", "DB_PWD", "SENTRY_DSN", "NPM_AUTH")))
    assert not any(map(is_secret_env_key, ("PWD", "OLDPWD", "AUTHOR_NAME", "HOMEPATH")))
    env = {"MY_SECRET": "hunter2hunter2", "HOME": "/root"}
    assert redact_env(env) == {"MY_SECRET": "***", "HOME": "/root"}
    assert redact_text("pw=hunter2hunter2 home=/root", env) == "pw=*** home=/root"
    key = {"DEPLOY_KEY": "-----BEGIN KEY-----\nbody-line-one-AAAA\nbody-line-twó-BBBB\n-----END KEY-----"}
    assert redact_text(json.dumps({"out": key["DEPLOY_KEY"]}), key) == '{"out": "***"}'  # JSON-escaped
    assert redact_text(json.dumps({"out": key["DEPLOY_KEY"]}, ensure_ascii=False), key) == '{"out": "***"}'
    assert redact_text("body-line-twó-BBBB\n", key) == "***\n"  # one line of it (output read line by line)
    assert redact_text("pw=abc", {"SHORT_SECRET": "abc"}) == "pw=abc"  # too short to tell from a word


def test_token_use_of_each_cli() -> None:
    claude = json.dumps({"type": "result", "result": "ok", "usage": {
        "input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 20}})
    assert cli_output(claude).tokens == TokenUse(10, 5, 1000, 20)
    assert cli_output(claude).tokens.weighted(0.1) == 10 + 5 + 100 + 20
    codex = "\n".join(json.dumps(e) for e in [
        {"type": "thread.started"},
        {"type": "turn.completed", "usage": {"input_tokens": 100, "cached_input_tokens": 60, "output_tokens": 7}},
        {"type": "turn.completed", "usage": {"input_tokens": 50, "cached_input_tokens": 0, "output_tokens": 3}},
    ])
    assert cli_output(codex).tokens == TokenUse(90, 10, 60, 0)
    gemini = json.dumps({"response": "x", "stats": {"models": {"g": {"tokens": {"prompt": 30, "candidates": 4, "cached": 10}}}}})
    assert cli_output(gemini).tokens == TokenUse(20, 4, 10, 0)
    assert cli_output("plain text\nno json").tokens == TokenUse()


def test_agent_complete_found_in_cli_output() -> None:
    inner = {"status": "success", "verdict": "success", "summary": "ok"}
    claude = json.dumps({"type": "result", "result": "All good.\n```json\n" + json.dumps(inner) + "\n```"})
    assert cli_output(claude).complete == inner
    codex = json.dumps({"type": "item.completed", "item": {"type": "agent_message", "text": json.dumps(inner)}})
    assert cli_output(codex).complete == inner
    assert cli_output("I did nothing useful").complete is None


def test_an_unreadable_result_file_or_output_is_said_in_a_few_words(tmp_path: Path) -> None:
    """A result file that is a directory, not UTF-8 or nested deeper than the parser goes failed the agent's
    activity on every attempt (the story ended with a raw Python error); deep JSON on stdout did too."""
    result = tmp_path / "result.json"
    result.mkdir()
    with pytest.raises(UnreadableResultFile, match="^cannot be read: Is a directory$"):
        read_result_file(result)
    result.rmdir()
    result.write_text("[" * 100_000)
    with pytest.raises(UnreadableResultFile, match="^is not JSON: nested too deep$"):
        read_result_file(result)
    result.write_bytes(b'{"summary": "caf\xe9"}')
    with pytest.raises(UnreadableResultFile, match="^is not JSON: 'utf-8' codec can't decode"):
        read_result_file(result)
    result.write_text('{"status": "success"}')
    assert read_result_file(result) == {"status": "success"}
    result.write_bytes(b'\xef\xbb\xbf{"status": "success"}')  # a BOM: "Expecting value" on every attempt
    assert read_result_file(result) == {"status": "success"}
    assert cli_output("[" * 100_000).complete is None and cli_output("[" * 100_000 + "\n{}").tokens == TokenUse()


def test_a_fifo_as_the_result_file_is_refused_at_once(tmp_path: Path) -> None:
    """Its open waited for a writer for ever (the dispatch never answered)."""
    result = tmp_path / "result.json"
    os.mkfifo(result)
    with ThreadPoolExecutor(1) as pool:
        reading = pool.submit(read_result_file, result)
        try:
            refused = reading.exception(timeout=10)
        finally:
            if not reading.done():  # a writer lets the blocked reader go (EOF), and the test end
                os.close(os.open(result, os.O_WRONLY | os.O_NONBLOCK))
    assert isinstance(refused, UnreadableResultFile), refused
    assert str(refused) == "is not a regular file (a FIFO, socket or device?): write the answer to a plain file there"


def test_a_result_file_of_hundreds_of_mb_is_not_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It was held whole and parsed, however long: past RESULT_FILE_BYTES it is refused, read no further."""
    import tracemalloc

    from activities import session_files

    monkeypatch.setattr(session_files, "RESULT_FILE_BYTES", 2**20, raising=False)  # (small: the test is quick)
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"status": "success", "summary": "x" * 2**25}))
    tracemalloc.start()
    try:
        with pytest.raises(UnreadableResultFile, match="^is past 1,048,576 bytes: too long to be an answer$"):
            read_result_file(result)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**25 / 4, peak
    result.write_text(json.dumps({"status": "success", "summary": "x" * (2**20 - 100)}))
    assert read_result_file(result)["status"] == "success"  # up to the bound


def test_git_rules() -> None:
    assert story_branch("sprint-1", "1-2-login") == "bso/sprint-1/1-2-login"
    for bad in ("../x", "a/b", "x..y", "", "-x"):
        with pytest.raises(GitRuleError):
            story_branch("s", bad)
    patterns = AgentsFile().git.secret_patterns
    for secret in (".env", "config/.env.production", "id_rsa", "certs/server.key", "a/credentials.json",
                   "certs/SERVER.PEM", ".ENV", ".envrc", ".git-credentials", "infra/prod.tfvars", "id_dsa",
                   "keys/deploy.ppk"):
        assert is_secret_path(secret, patterns), secret
    for fine in (".env.example", "src/env.py", "keys.md", "src/app.py"):
        assert not is_secret_path(fine, patterns), fine
    assert out_of_scope(["src/a.py", "tests/t.py", "docs/x.md"], ["src/**", "tests/"]) == ["docs/x.md"]
    assert out_of_scope(["anything"], []) == []
    assert squash_message("feat: Story $story_number: $title", story_key="3-2-chunks", title="Chunk manager") == (
        "feat: Story 3.2: Chunk manager"
    )
    assert parse_porcelain(" M a.py\x00?? b/c.py\x00R  new.py\x00old.py\x00") == ["a.py", "b/c.py", "new.py"]
    # `git rm --cached key.pem`: two entries for one path, the index holds no file of it.
    assert parse_porcelain_entries("D  key.pem\x00?? key.pem\x00") == [("D ", "key.pem"), ("??", "key.pem")]
    assert not index_holds(["D ", "??"]) and removal_staged(["D ", "??"])
    assert index_holds([" M"]) and index_holds(["A "]) and index_holds([" D"]) and not removal_staged([" D", "??"])


def test_story_parsing() -> None:
    text = "# Story 1.1: X\n\nFile scope: `src/**`, tests/**\n\n## Acceptance Criteria\n\n1. one\n2. two\n\n## Tasks\n- a\n"
    assert parse_file_scope(text) == ["src/**", "tests/**"]
    assert parse_acceptance_criteria(text) == ["one", "two"]
    section = "## File Scope\n\n- src/auth/\n- tests/test_auth.py\n\n## Other\n"
    assert parse_file_scope(section) == ["src/auth/", "tests/test_auth.py"]
    # Prose under a scope's name is none: every planned file was out of it, and the PO gate blocked the story.
    prose = "**Scope:** backend only, the UI comes in story 1.2.\n\n### Scope\n\n- no UI work\n- keep it small\n"
    assert parse_file_scope(prose) == []
    assert parse_file_scope(prose + "\nFile scope: src/**, tests/**\n") == ["src/**", "tests/**"]
    assert parse_file_scope("File scope: src/**, Makefile, Dockerfile, LICENSE\n") == [
        "src/**", "Makefile", "Dockerfile", "LICENSE"
    ]
    assert parse_file_scope("**Scope:** UI only\n") == [] and parse_file_scope("Scope: n/a\n") == []
    assert parse_file_scope(prose + "\n## File Scope\n\n- src/\n- Makefile\n") == ["src/", "Makefile"]


def test_prompt_rendering_carries_the_assignment() -> None:
    a = TaskAssignment(
        dispatch_id="s/b/1-1/2", agent_type=AgentType.DEV_RUNNER, mode=AgentMode.FIX, story_key="1-1-x",
        story_path="stories/1-1-x.md", session_id="s", batch_id=1, report_to="s/b", project_root="/p",
        resident_contacts={"debugger": "s/debugger"},
        fix_findings=[Finding(severity=Severity.HIGH, summary="null check missing", file="src/a.py", line=3)],
    )
    ctx = PromptContext(assignment=a, story_file="/p/stories/1-1-x.md", workdir="/wt", result_file="/r.json",
                        acceptance_criteria=["works"], verification_output="FAIL test_a")
    template = "Story $story_key mode $mode\n$common\n$unknown_name"
    common = "AC:\n$acceptance_criteria\n$fix_section\n$resident_contacts_section\nwrite to $result_file\n$result_shape"
    out = render_prompt(template, common, ctx)
    assert "Story 1-1-x mode fix" in out and "1. works" in out
    assert "[HIGH] null check missing (src/a.py:3)" in out and "FAIL test_a" in out
    assert "debugger: `s/debugger`" in out and "write to /r.json" in out
    assert '"msg_type": "AGENT_COMPLETE"' in out and "$unknown_name" in out


def test_the_shipped_prompts_keep_agents_off_the_status_file_and_on_the_story_branch() -> None:
    """BMAD agents update sprint-status.yaml themselves, and coding agents make branches of their own: each broke
    the sprint (a status changed under it, work left unmerged) and no prompt said not to."""
    common = (Path(__file__).resolve().parents[2] / "bso" / "prompts" / "_common.md").read_text()
    dev = (Path(__file__).resolve().parents[2] / "bso" / "prompts" / "dev-runner.md").read_text()
    assert "do not edit `sprint-status.yaml`" in common and "$common" in dev
    assert "merges only that branch: make no branch of your own" in dev


def test_the_story_creator_prompt_keeps_a_story_written_by_hand_as_the_simulated_creator_does() -> None:
    """The simulated story-creator keeps a story file written already (bso.sprint_status.is_story_stub); a real
    one was told only to write the document, and wrote over it."""
    creator = (Path(__file__).resolve().parents[2] / "bso" / "prompts" / "story-creator.md").read_text()
    assert "In `create`, a story document already written there" in creator and "keep it" in creator


def test_a_review_after_a_failed_e2e_is_told_what_failed(tmp_path: Path) -> None:
    a = TaskAssignment(
        dispatch_id="s/b/1-1/5", agent_type=AgentType.REVIEW_RUNNER, mode=AgentMode.REVIEW, story_key="1-1-x",
        story_path="stories/1-1-x.md", session_id="s", batch_id=1, report_to="s/b", project_root="/p",
        fix_findings=[Finding(severity="HIGH", summary="the expiry date is not shown", file="src/page.tsx", line=7)],
    )
    ctx = PromptContext(assignment=a, story_file="/p/stories/1-1-x.md", workdir="/wt", result_file="/r.json")
    prompt = render_prompt(*load_templates(str(tmp_path), AgentType.REVIEW_RUNNER), ctx)
    assert "## The e2e verification failed after the last review" in prompt and "Findings to fix" not in prompt
    assert "- [HIGH] the expiry date is not shown (src/page.tsx:7)" in prompt


def test_a_prompt_echoed_by_a_plain_text_cli_is_never_taken_for_its_answer(tmp_path: Path) -> None:
    """A plain-text CLI that repeats its prompt and ends without an answer had the prompt's example AGENT_COMPLETE
    (`success`) taken for its answer; JSON the prompt quotes (a failed verification's) likewise."""
    a = TaskAssignment(
        dispatch_id="s/b/1-1/3", agent_type=AgentType.REVIEW_RUNNER, mode=AgentMode.REVIEW, story_key="1-1-x",
        story_path="stories/1-1-x.md", session_id="s", batch_id=1, report_to="s/b", project_root="/p",
    )
    quoted = {"status": "error", "test": "test_a"}
    ctx = PromptContext(assignment=a, story_file="/p/stories/1-1-x.md", workdir="/wt", result_file="/r.json",
                        verification_output=json.dumps(quoted))
    prompt = render_prompt(*load_templates(str(tmp_path), AgentType.REVIEW_RUNNER), ctx)
    example = json.loads(result_shape(a))
    examples = prompt_examples(prompt)
    assert example in examples and quoted in examples
    assert cli_output(prompt + "\nDone.").complete == example  # what was taken before
    assert cli_output(prompt + "\nDone.", examples) == CliOutput(None, echoed_prompt=True)
    assert cli_output(prompt.replace("\n", "\r\n"), examples) == CliOutput(None, echoed_prompt=True)
    one_line = json.dumps(example)  # a JSON-lines CLI printing the example as a document of its own
    assert cli_output(f"{one_line}\nDone.", examples) == CliOutput(None, echoed_prompt=True)

    # The agent's own answer after the echo is still taken, an answer that differs from the example in one word too.
    answer = {"status": "success", "verdict": "success", "summary": "reviewed: no findings"}
    assert cli_output(f"{prompt}\n{json.dumps(answer, indent=2)}\n", examples) == CliOutput(answer, True)
    edited = {**example, "summary": "looked at greet()"}
    assert cli_output(f"{prompt}\n```json\n{json.dumps(edited)}\n```", examples).complete == edited
    assert cli_output("nothing to say", examples) == CliOutput(None, echoed_prompt=False)


def test_a_json_lines_output_is_read_line_by_line_in_one_pass() -> None:
    """A JSON-lines CLI's output of hundreds of MB was held whole and parsed four times over (answer, answer text,
    error, tokens): one pass now, over lines given one by one, none of them kept."""
    assert list(line_documents(['{"a": 1}\n', "plain text\n", '[1]\r\n', '{"broken": \n'])) == [{"a": 1}, [1]]
    assert list(line_documents(['\u280b working\r{"a": 1}\n'])) == [{"a": 1}]  # a spinner redrawn before it
    raw_separator = '{"text": "a\u2028b"}'  # Node's JSON.stringify leaves U+2028 raw: no line ends there
    assert list(line_documents([raw_separator])) == json_documents(f"x\n{raw_separator}") == [{"text": "a\u2028b"}]

    events = [
        {"type": "turn.completed", "usage": {"input_tokens": 100, "cached_input_tokens": 60, "output_tokens": 7}},
        {"type": "error", "message": "rate limited, retrying"},
        {"type": "item.completed", "item": {"type": "agent_message", "text": '{"status": "failure", "error": "x"}'}},
        {"type": "error", "message": "a later error"},
        {"type": "item.completed", "item": {"type": "agent_message", "text": 'Done: {"status": "success"}'}},
        {"type": "turn.completed", "usage": {"input_tokens": 50, "output_tokens": 3}},
    ]
    lines = (json.dumps(e) + "\n" for e in events)  # a generator: read once
    read = read_cli_output(line_documents(lines), "the tail is not searched when a document has the text")
    assert read == CliOutput({"status": "success"}, False, TokenUse(90, 10, 60, 0), "rate limited, retrying")
    assert read == cli_output("".join(json.dumps(e) + "\n" for e in events))
    plain = read_cli_output(iter([]), 'the end of a plain-text output: {"status": "success", "summary": "s"}')
    assert plain == CliOutput({"status": "success", "summary": "s"})
    typed = {"msg_type": "AGENT_COMPLETE", "status": "success"}  # a document that is the answer itself
    assert read_cli_output([typed, {"result": '{"status": "failure"}'}], "").complete == typed


def test_count_passed() -> None:
    from bso.git_rules import count_passed

    assert count_passed("....\n12 passed, 1 warning in 0.5s", r"(\d+) passed") == 12
    assert count_passed("$ a\n3 passed\n$ b\n2 passed", r"(\d+) passed") == 5
    assert count_passed("no summary here", r"(\d+) passed") is None


def test_the_readme_example_is_a_valid_agents_file() -> None:
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("### Agent profiles")[1].split("```toml")[1].split("```")[0]
    agents = parse_agents_file(block, "agents.toml")
    assert resolve_profile(agents, AgentType.DEV_RUNNER, AgentMode.FIX).name == "claude-opus"
    assert resolve_profile(agents, AgentType.REVIEW_RUNNER, AgentMode.REVIEW).name == "codex"


@pytest.mark.parametrize("bad", ["not-utf8", "dangling-link", "folder"])
def test_an_agents_file_or_template_there_but_unusable_is_named_not_skipped(tmp_path: Path, bad: str) -> None:
    """A non-UTF-8 agents.toml failed without naming the file; a folder or a link to nothing there was skipped,
    the built-in profile used and the user's [verification] and secret patterns dropped without a word. A prompt
    template that is not UTF-8 failed a story after its first agents, naming nothing."""
    for relative in (".bso/agents.toml", ".bso/prompts/dev-runner.md"):
        root = tmp_path / f"{bad}-{relative.count('/')}-{len(relative)}"
        target = root / relative
        target.parent.mkdir(parents=True)
        if bad == "not-utf8":
            target.write_bytes(b"default_profile = \"caf\xe9\"\n")
        elif bad == "dangling-link":
            target.symlink_to(root / "gone")
        else:
            target.mkdir()
        with pytest.raises(ApplicationError) as refused:
            load_agents_file(str(root))
            load_templates(str(root), AgentType.DEV_RUNNER)
        assert str(target) in refused.value.message and refused.value.non_retryable


def test_an_answer_as_real_agents_write_it_is_taken_in_bsos_shape() -> None:
    """A review summary of 2,500 characters failed a review that had passed, after a passing dev; so did
    `SUCCESS`, `INFO`, `"line": "12-15"`, findings written as sentences, 201 findings, a score of 87.5."""
    from pydantic import ValidationError

    from bso.agent_output import lenient_answer
    from bso.messages import MAX_FINDINGS, MAX_SUMMARY_CHARS, AgentComplete

    ids = {"dispatch_id": "s/batch-1/1-1/4", "story_key": "1-1-x", "agent_type": "review-runner", "mode": "review"}
    raw = {
        "status": "SUCCESS", "verdict": "Success", "summary": "s" * 2_500, "score": 87.5,
        "findings": [
            {"severity": "INFO", "summary": "naming", "line": "12-15"},
            {"severity": "major", "summary": "x" * 3_000, "line": "L7"},
            "the retry loop never ends",
            *({"severity": "LOW", "summary": f"nit {n}"} for n in range(MAX_FINDINGS)),
        ],
    }
    with pytest.raises(ValidationError):
        AgentComplete.model_validate({**raw, **ids})
    answer = AgentComplete.model_validate({**lenient_answer(raw), **ids})
    assert answer.status == "success" and answer.verdict == "success" and answer.score == 88
    assert len(answer.summary) == MAX_SUMMARY_CHARS and answer.summary.endswith("…")
    assert len(answer.findings) == MAX_FINDINGS
    first = answer.findings[:3]  # the most severe are kept
    assert [(f.severity, f.line) for f in first] == [("HIGH", None), ("MEDIUM", None), ("LOW", 12)]
    assert first[1].summary == "the retry loop never ends" and len(first[0].summary) == MAX_SUMMARY_CHARS
    assert lenient_answer({"status": "success", "summary": None})["summary"] == ""
    for endless in (float("inf"), float("nan")):  # round() raised OverflowError: a raw error on every attempt
        with pytest.raises(ValidationError):
            AgentComplete.model_validate({**lenient_answer({"status": "success", "score": endless}), **ids})
    with pytest.raises(ValidationError):  # what is no status stays refused
        AgentComplete.model_validate({**lenient_answer({"status": "completed-ish"}), **ids})


def test_a_pretty_printed_answer_in_plain_text_is_found() -> None:
    """Only the output's last 20 lines were searched, line by line: a reviewer's answer with four findings,
    pretty-printed over 31 lines (fenced or not, an aider-style footer after it), was no AGENT_COMPLETE."""
    answer = {
        "status": "success", "verdict": "failure",
        "findings": [{"severity": "HIGH", "summary": f"issue {n}", "status": "open"} for n in range(4)],
    }
    pretty = json.dumps(answer, indent=2)
    assert len(pretty.splitlines()) > 20
    footer = "\n".join(f"Tokens: {n}k sent, 1k received." for n in range(30))
    for text in (f"Done.\n```json\n{pretty}\n```\n{footer}", f"Here it is:\n{pretty}\n{footer}"):
        assert cli_output(text).complete == answer
    earlier = json.dumps({"status": "failure", "summary": "first try"})
    assert cli_output(f"{earlier}\nthen again:\n{pretty}").complete == answer  # the last one
    assert cli_output("a set {1, 2} and no answer").complete is None
