#!/usr/bin/env python3
"""A fake coding-agent CLI for BSO's tests: a real executable, stdlib only.

It reads its prompt (`--prompt TEXT`, `--prompt-file PATH`, or stdin), then acts as the agent named by
$BSO_AGENT_TYPE in its working directory, and answers like Claude Code (`--output-format json`, with
`usage`) plus, unless told otherwise, an AGENT_COMPLETE in $BSO_RESULT_FILE.

Misbehaviour for the dev-runner, from $FAKE_AGENT_BEHAVIOR (comma separated) or a prompt line
`FAKE_AGENT_BEHAVIOR: ...`: slow (sleeps $FAKE_AGENT_SLEEP seconds, default 3, before it works), hang, crash, leak-env, commit-env, echo-secret, claim-failure, out-of-scope, break-tests, break-tests-in-dev (only the
dev mode breaks them, a fix repairs them), no-commit, no-changes, no-answer (neither a result file nor an answer in its output), echo-prompt (a
plain-text CLI: prints its prompt, then its last words, as plain text), linger (commits, then
sleeps 300 s), answer-linger (answers, its result file and its output, then sleeps 300 s), torn-answer (writes
half of its answer to the result file, then sleeps 300 s), no-result-file, result-dir (a directory where the result file goes), result-fifo (a FIFO there, no writer), result-deep (a result
file and output nested 100,000 deep), own-branch / detach (works on a branch of its own / a detached HEAD),
edit-status / commit-status (sets its story to `review` in the worktree's sprint-status.yaml, as BMAD's
dev-story does, and leaves the change / commits it), commit-in-plan (the dev-runner commits a file in the
PO plan phase), story-in-worktree (the dev-runner writes its Dev Agent
Record into the story file at its path in the worktree), story-elsewhere (the story-creator writes the
story under docs/stories/, not at $BSO_STORY_FILE), creator-sets-status (the story-creator sets its story to
`ready-for-dev` in the project's sprint-status.yaml, as BMAD's create-story does), garbled-usage (reports 10^30 output tokens), many-findings (200 findings, the most an answer carries), huge-findings
(the review-runner's 200 findings of 1,900 characters with 7,000-character paths), shared-file (also appends
a line naming the story to src/shared.py, a file every such story touches), in-project-root (the dev-runner
works, and commits, in $BSO_PROJECT_ROOT instead of its worktree), untrack-all (then runs `git rm -r --cached .`
and nothing after it). $FAKE_AGENT_LEDGER:
a JSONL file each start is appended to. $FAKE_AGENT_PIDS: where
`hang` records its own pid and its two children's (one started in a session of its own).

Agent-PO gates ($BSO_PO_PHASE set): in the plan phase it changes nothing and writes a PLAN_SUBMISSION; in
the completion phases (implement / fix) it implements as above and writes a COMPLETION_REPORT. What kind,
per attempt ($BSO_PO_ATTEMPT; the last entry repeats), from $FAKE_AGENT_PO_PLAN (good, missing-ac,
out-of-scope, invalid, huge, plain: no PLAN_SUBMISSION, it works and writes an AGENT_COMPLETE) and $FAKE_AGENT_PO_REPORT (good, missing-ac, out-of-scope, fewer-files: changes
docs/notes.md but claims only the planned files, invalid). The AC ids and authorized files come from the
prompt's PO section, as a real agent would read them. A fix attempt removes docs/notes.md.
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path


def read_prompt(argv):
    if "--prompt" in argv:
        return argv[argv.index("--prompt") + 1]
    if "--prompt-file" in argv:
        return Path(argv[argv.index("--prompt-file") + 1]).read_text()
    return sys.stdin.read()


def git(*args):
    subprocess.run(["git", "-c", "user.name=Fake", "-c", "user.email=fake@example.com", *args], check=True,
                   capture_output=True)


def po_kind(var, attempt):
    kinds = [k.strip() for k in os.environ.get(var, "good").split(",") if k.strip()] or ["good"]
    return kinds[min(attempt, len(kinds)) - 1]


def section(prompt, heading):
    m = re.search(r"^### " + re.escape(heading) + r"\s*$(.*?)(?=^#|\Z)", prompt, re.M | re.S)
    return [x.strip() for x in re.findall(r"^- `?([^`\n]+?)`?\s*$", m.group(1), re.M)] if m else []


def now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def po_plan(kind, prompt, key, module, attempt):
    acs = [a for a in section(prompt, "Acceptance criteria to map") if a.startswith("AC-")]
    if kind == "missing-ac":
        acs = acs[:-1]
    files = [f"src/{module}.py", f"src/{module}_extra.py", f"tests/test_{module}.py"]
    if kind == "out-of-scope":
        files.append("docs/notes.md")
    plan = {"approach": f"fake plan ({kind})",
            "ac_mapping": [{"ac_id": ac, "implementation": f"greet() for {ac}", "file": files[0]} for ac in acs],
            "files_to_modify": [{"path": f, "changes": "add"} for f in files],
            "test_approach": {"unit_tests": [files[2]]}}
    if kind == "invalid":
        del plan["ac_mapping"]
    if kind == "huge":  # a valid plan of 300 KB: its approach written out at length
        plan["approach"] += " " + "step by step. " * 21_500
    return {"message_type": "PLAN_SUBMISSION", "timestamp": now(), "agent_id": "dev-runner", "task_id": key,
            "revision": attempt, "plan": plan}


def po_report(kind, prompt, key):
    acs = [a for a in section(prompt, "Acceptance criteria to verify") if a.startswith("AC-")]
    if kind == "missing-ac":
        acs = acs[:-1]
    files = section(prompt, "Authorized files")
    if kind == "out-of-scope":
        files.append("docs/notes.md")
    report = {"message_type": "COMPLETION_REPORT", "timestamp": now(), "agent_id": "dev-runner", "task_id": key,
              "summary": {"started_at": now(), "completed_at": now(), "duration_minutes": 1},
              "ac_verification": [{"ac_id": ac, "status": "PASS", "evidence": f"test_greet ({ac})", "tested": True}
                                  for ac in acs],
              "test_results": {"passed": 1, "failed": 0},
              "files_changed": [{"path": f, "action": "added"} for f in files]}
    if kind == "invalid":
        report["test_results"] = {"passed": -1}
    return report


CRITERIA_MAX = {"code_quality": 30, "test_coverage": 25, "security": 20, "documentation": 15, "acceptance_criteria": 10}


def scored_review(scores: str, review_round: int, told_the_bar: bool) -> dict:
    """FAKE_AGENT_REVIEW_SCORES="55,90": the score of review round 1, 2, ... (the last one repeats),
    split over Gear 2's criteria; below 80 the review blocks, with a feedback item for the fix."""
    values = [int(x) for x in scores.split(",")]
    score = values[min(review_round, len(values)) - 1]
    criteria = {k: m * score // 100 for k, m in CRITERIA_MAX.items()}
    criteria["code_quality"] += score - sum(criteria.values())
    passing = score >= 80 and told_the_bar
    feedback = [{"severity": "blocking" if not passing else "suggestion", "category": "documentation",
                 "file": "src/x.py", "line": 1, "issue": f"greet() has no docstring (round {review_round})",
                 "suggestion": "add one"}]
    return {"verdict": "success" if passing else "failure", "criteria_scores": criteria, "score": score,
            "blocking_issues": [] if passing else ["greet() has no docstring"], "feedback": feedback}


def main():
    prompt = read_prompt(sys.argv[1:])
    agent = os.environ["BSO_AGENT_TYPE"]
    mode = os.environ["BSO_MODE"]
    key = os.environ["BSO_STORY_KEY"]
    behavior = set(filter(None, os.environ.get("FAKE_AGENT_BEHAVIOR", "").split(",")))
    m = re.search(r"^FAKE_AGENT_BEHAVIOR:\s*(.+)$", prompt, re.M)
    if m:
        behavior |= set(filter(None, m.group(1).split(",")))
    if os.environ.get("FAKE_AGENT_LEDGER"):
        with open(os.environ["FAKE_AGENT_LEDGER"], "a") as fh:
            fh.write(json.dumps({"dispatch_id": os.environ["BSO_DISPATCH_ID"], "agent": agent, "mode": mode,
                                 "phase": os.environ.get("BSO_PO_PHASE", ""), "pid": os.getpid(),
                                 "prompt_chars": len(prompt)}) + "\n")
    dev = agent == "dev-runner"
    phase = os.environ.get("BSO_PO_PHASE", "")
    attempt = int(os.environ.get("BSO_PO_ATTEMPT", "1") or 1)
    module = "story_" + key.replace("-", "_")
    # `plain`: an agent that knows nothing of the gates: it works and writes an AGENT_COMPLETE, as in no phase.
    plain = dev and phase == "plan" and po_kind("FAKE_AGENT_PO_PLAN", attempt) == "plain"
    if dev and phase == "plan" and not plain:
        if "commit-in-plan" in behavior:  # real CLIs often implement at once, plan or no plan
            Path("docs").mkdir(exist_ok=True)
            Path("docs/unplanned.md").write_text("done before the plan was approved\n")
            git("add", "docs/unplanned.md")
            git("commit", "-q", "-m", "implemented during the plan")
        plan = po_plan(po_kind("FAKE_AGENT_PO_PLAN", attempt), prompt, key, module, attempt)
        Path(os.environ["BSO_RESULT_FILE"]).write_text(json.dumps(plan))
        print(json.dumps({"type": "result", "subtype": "success", "is_error": False, "result": "Plan submitted.",
                          "usage": {"input_tokens": 300, "output_tokens": 100}}))
        return
    report_kind = po_kind("FAKE_AGENT_PO_REPORT", attempt) if dev and phase and not plain else ""
    if report_kind in ("out-of-scope", "fewer-files"):
        behavior.add("out-of-scope")
    if dev and phase == "fix" and Path("docs/notes.md").exists():
        git("rm", "-q", "docs/notes.md")
        git("commit", "-q", "-m", f"fix {key}: remove docs/notes.md")
    if dev and "slow" in behavior:
        print("thinking slowly", flush=True)
        time.sleep(float(os.environ.get("FAKE_AGENT_SLEEP", "3")))
    if dev and "hang" in behavior:
        child = subprocess.Popen(["sleep", "300"])
        # and one in a session of its own (as Node's `detached: true` does): out of the agent's process group
        escaped = subprocess.Popen(["sleep", "300"], start_new_session=True)
        Path(os.environ["FAKE_AGENT_PIDS"]).write_text(json.dumps([os.getpid(), child.pid, escaped.pid]))
        print("working very hard", flush=True)
        time.sleep(300)
    if dev and "own-branch" in behavior:  # as coding agents do: their work on a branch of their own
        git("checkout", "-q", "-b", f"agent-feature-{os.getpid()}")
    if dev and "detach" in behavior:
        git("checkout", "-q", "--detach")
    if dev and "crash" in behavior:
        print("Traceback: fake crash", file=sys.stderr)
        sys.exit(3)

    result = {"msg_type": "AGENT_COMPLETE", "status": "success", "summary": f"fake {agent}/{mode}"}
    if agent == "story-creator":
        story_file = Path(os.environ["BSO_STORY_FILE"])
        if "story-elsewhere" in behavior:  # in a story folder of its own, as BMAD's create-story may
            story_file = Path("docs/stories/1.1.story.md")
            story_file.parent.mkdir(parents=True, exist_ok=True)
        story_file.write_text(
            "# Story 1.1: Hello\n\nStatus: story-doc-review\n\nFile scope: src/**, tests/**\n\n"
            "## Acceptance Criteria\n\n1. greet() says hello\n2. tests cover it\n"
        )
    elif agent in ("story-reviewer",):
        result["verdict"] = "passed"
    elif agent in ("review-runner", "e2e-inspector"):
        result["verdict"] = "success"
        if agent == "review-runner" and os.environ.get("FAKE_AGENT_REVIEW_SCORES"):
            result.update(scored_review(os.environ["FAKE_AGENT_REVIEW_SCORES"], int(os.environ["BSO_MODE_ROUND"]),
                                        "$approval_score" not in prompt and "at least 80" in prompt))
    elif dev and "no-changes" not in behavior:
        if "in-project-root" in behavior:  # it works in the user's checkout, not in its worktree
            os.chdir(os.environ["BSO_PROJECT_ROOT"])
        broken = "break-tests" in behavior or ("break-tests-in-dev" in behavior and mode == "dev")
        Path("src").mkdir(exist_ok=True)
        Path("tests").mkdir(exist_ok=True)
        Path(f"src/{module}.py").write_text("def greet():\n    return 'hello'\n")
        Path(f"tests/test_{module}.py").write_text(
            f"import sys; sys.path.insert(0, 'src')\nfrom {module} import greet\n\n"
            "def test_greet():\n    assert greet() == " + ("'goodbye'" if broken else "'hello'") + "\n"
        )
        if "shared-file" in behavior:
            with open("src/shared.py", "a") as fh:
                fh.write(f"# {key}\n")
        if "leak-env" in behavior or "commit-env" in behavior:
            Path(".env").write_text("OPENAI_API_KEY=sk-fake-leaked\n")
        if "commit-env" in behavior:  # the agent commits the secret itself
            git("add", "-f", ".env")
        if "out-of-scope" in behavior:
            Path("docs").mkdir(exist_ok=True)
            Path("docs/notes.md").write_text("outside the scope\n")
        if "no-commit" not in behavior:
            git("add", "src", "tests")
            if subprocess.run(["git", "diff", "--cached", "--quiet"]).returncode:  # something staged
                git("commit", "-q", "-m", f"implement {key}")
            Path(f"src/{module}_extra.py").write_text("EXTRA = 1\n")  # left for BSO's exit gate
        if "untrack-all" in behavior:  # half of the .gitignore re-apply idiom: no `git add .` after it
            git("rm", "-r", "-q", "--cached", ".")
    status_file = Path("_bmad-output/implementation-artifacts/sprint-status.yaml")
    if agent == "story-creator" and "creator-sets-status" in behavior:  # BMAD's create-story does
        status_file.write_text(re.sub(rf"^(\s*{re.escape(key)}:).*$", r"\1 ready-for-dev", status_file.read_text(), flags=re.M))
    if dev and "story-in-worktree" in behavior:  # dev-story's record, written at the story's path where it works
        story = Path(os.path.relpath(os.environ["BSO_STORY_FILE"], os.environ["BSO_PROJECT_ROOT"]))
        story.parent.mkdir(parents=True, exist_ok=True)
        text = Path(os.environ["BSO_STORY_FILE"]).read_text() if Path(os.environ["BSO_STORY_FILE"]).exists() else ""
        story.write_text(text + f"\n## Dev Agent Record\n\n- implemented by {mode}\n")
    if dev and behavior & {"edit-status", "commit-status"} and status_file.exists():
        status_file.write_text(re.sub(rf"^(\s*{re.escape(key)}:).*$", r"\1 review", status_file.read_text(), flags=re.M))
        if "commit-status" in behavior:
            git("commit", "-q", "-m", f"{key}: status review", "--", str(status_file))
    if dev and "linger" in behavior:  # its work committed, the agent is still busy (killed here, it reruns)
        print("committed, still checking", flush=True)
        time.sleep(300)
    usage = {"input_tokens": 1000, "output_tokens": 200, "cache_read_input_tokens": 5000,
             "cache_creation_input_tokens": 0}
    if "garbled-usage" in behavior:  # a CLI whose usage output is broken
        usage["output_tokens"] = 10**30
    if report_kind:
        result = po_report(report_kind, prompt, key)
    if "claim-failure" in behavior:  # the agent gives up (after changing files)
        result.update(status="failure", error="could not finish the fix")
    if "echo-secret" in behavior:  # a careless agent repeats a secret of its environment everywhere
        secret = os.environ.get("MY_API_TOKEN", "")
        print(f"using token {secret}", flush=True)
        print(json.dumps({"type": "item.completed", "item": {"aggregated_output": secret}}), flush=True)  # a JSONL CLI
        print(f"debug: token={secret}", file=sys.stderr, flush=True)
        result["summary"] = f"done with token {secret}"
        result["findings"] = [{"severity": "LOW", "summary": f"token {secret} is hard-coded"}]
    if "many-findings" in behavior:  # as many findings as an answer may carry
        result["findings"] = [{"severity": "LOW", "summary": f"nit {n}"} for n in range(200)]
    if "huge-findings" in behavior and agent == "review-runner":  # megabytes: 200 long findings, deep paths
        result["findings"] = [
            {"severity": "HIGH", "summary": f"finding {n} " + "s" * 1900, "file": "src/" + "deep/" * 1400 + "x.py"}
            for n in range(200)
        ]
    if "result-dir" in behavior:  # the result file's path taken by a directory
        Path(os.environ["BSO_RESULT_FILE"]).mkdir()
        text = "Done."
    elif "result-fifo" in behavior:  # a named pipe where the result file goes, with no one to write it
        os.mkfifo(os.environ["BSO_RESULT_FILE"])
        text = "Done."
    elif "result-deep" in behavior:
        Path(os.environ["BSO_RESULT_FILE"]).write_text("[" * 100_000)
        text = "[" * 100_000
    elif "no-result-file" in behavior:
        text = "Done.\n```json\n" + json.dumps(result) + "\n```"
    elif "no-answer" in behavior:  # it stops without a word of AGENT_COMPLETE
        text = "Done."
    elif dev and "torn-answer" in behavior:  # killed in the middle of writing its answer
        answer = json.dumps(result)
        Path(os.environ["BSO_RESULT_FILE"]).write_text(answer[: len(answer) // 2])
        print("writing the answer", flush=True)
        time.sleep(300)
    else:
        Path(os.environ["BSO_RESULT_FILE"]).write_text(json.dumps(result))
        text = "Done."
    if "echo-prompt" in behavior:  # a plain-text CLI that repeats its prompt first (its example answer in it)
        print(prompt)
        print(text)
        return
    print(json.dumps({"type": "result", "subtype": "success", "is_error": False, "result": text, "usage": usage}),
          flush=True)
    if dev and "answer-linger" in behavior:  # answered, the CLI shuts down slowly (its telemetry, its MCP servers)
        time.sleep(300)


if __name__ == "__main__":
    main()
