#!/usr/bin/env python3
"""A fake coding-agent CLI for BSO's tests: a real executable, stdlib only.

It reads its prompt (`--prompt TEXT`, `--prompt-file PATH`, or stdin), then acts as the agent named by
$BSO_AGENT_TYPE in its working directory, and answers like Claude Code (`--output-format json`, with
`usage`) plus, unless told otherwise, an AGENT_COMPLETE in $BSO_RESULT_FILE.

Misbehaviour for the dev-runner, from $FAKE_AGENT_BEHAVIOR (comma separated) or a prompt line
`FAKE_AGENT_BEHAVIOR: ...`: hang, crash, leak-env, out-of-scope, break-tests, break-tests-in-dev (only the
dev mode breaks them, a fix repairs them), no-commit, no-changes, no-result-file. $FAKE_AGENT_LEDGER:
a JSONL file each start is appended to. $FAKE_AGENT_PIDS: where
`hang` records its own pid and its child's.
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
                                 "pid": os.getpid(), "prompt_chars": len(prompt)}) + "\n")
    dev = agent == "dev-runner"
    if dev and "hang" in behavior:
        child = subprocess.Popen(["sleep", "300"])
        Path(os.environ["FAKE_AGENT_PIDS"]).write_text(json.dumps([os.getpid(), child.pid]))
        print("working very hard", flush=True)
        time.sleep(300)
    if dev and "crash" in behavior:
        print("Traceback: fake crash", file=sys.stderr)
        sys.exit(3)

    result = {"msg_type": "AGENT_COMPLETE", "status": "success", "summary": f"fake {agent}/{mode}"}
    module = "story_" + key.replace("-", "_")
    if agent == "story-creator":
        Path(os.environ["BSO_STORY_FILE"]).write_text(
            f"# Story 1.1: Hello\n\nStatus: story-doc-review\n\nFile scope: src/**, tests/**\n\n"
            f"## Acceptance Criteria\n\n1. greet() says hello\n2. tests cover it\n"
        )
    elif agent in ("story-reviewer",):
        result["verdict"] = "passed"
    elif agent in ("review-runner", "e2e-inspector"):
        result["verdict"] = "success"
    elif dev and "no-changes" not in behavior:
        broken = "break-tests" in behavior or ("break-tests-in-dev" in behavior and mode == "dev")
        Path("src").mkdir(exist_ok=True)
        Path("tests").mkdir(exist_ok=True)
        Path(f"src/{module}.py").write_text("def greet():\n    return 'hello'\n")
        Path(f"tests/test_{module}.py").write_text(
            f"import sys; sys.path.insert(0, 'src')\nfrom {module} import greet\n\n"
            "def test_greet():\n    assert greet() == " + ("'goodbye'" if broken else "'hello'") + "\n"
        )
        if "leak-env" in behavior:
            Path(".env").write_text("OPENAI_API_KEY=sk-fake-leaked\n")
        if "out-of-scope" in behavior:
            Path("docs").mkdir(exist_ok=True)
            Path("docs/notes.md").write_text("outside the scope\n")
        if "no-commit" not in behavior:
            git("add", "src", "tests")
            git("commit", "-q", "-m", f"implement {key}")
            Path(f"src/{module}_extra.py").write_text("EXTRA = 1\n")  # left for BSO's exit gate
    usage = {"input_tokens": 1000, "output_tokens": 200, "cache_read_input_tokens": 5000,
             "cache_creation_input_tokens": 0}
    if "no-result-file" in behavior:
        text = "Done.\n```json\n" + json.dumps(result) + "\n```"
    else:
        Path(os.environ["BSO_RESULT_FILE"]).write_text(json.dumps(result))
        text = "Done."
    print(json.dumps({"type": "result", "subtype": "success", "is_error": False, "result": text, "usage": usage}))


if __name__ == "__main__":
    main()
