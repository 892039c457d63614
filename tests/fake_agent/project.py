"""A real temporary git repository set up for the fake agent CLI."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.workflow.helpers import make_project

FAKE_AGENT = Path(__file__).resolve().parent / "fake_agent.py"
STORY = "1-1-hello-world"

RUN_CHECKS = '''import importlib.util, pathlib, sys
failed = 0
passed = 0
for path in sorted(pathlib.Path("tests").glob("test_*.py")):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name in dir(mod):
        if name.startswith("test_"):
            try:
                getattr(mod, name)()
                passed += 1
                print("PASS", path, name)
            except AssertionError as err:
                failed += 1
                print("FAIL", path, name, err)
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
'''


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=T", "-c", "user.email=t@example.com", *args],
        check=True, capture_output=True, text=True,
    ).stdout


def make_git_project(
    root: Path,
    stories: dict[str, str] | None = None,
    agents_toml: str = "",
    verification: list[list[str]] | None = None,
    **env: str,
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    make_project(root, stories or {STORY: "backlog"})
    (root / ".gitignore").write_text(".sprint-session/\n")
    (root / "run_checks.py").write_text(RUN_CHECKS)
    (root / ".bso").mkdir(exist_ok=True)
    env_lines = "".join(f"{k} = {json.dumps(v)}\n" for k, v in env.items())
    (root / ".bso" / "agents.toml").write_text(
        'default_profile = "fake"\n'
        "heartbeat_seconds = 0.5\nkill_grace_seconds = 1.0\n\n"
        "[profiles.fake]\n"
        'extends = "generic"\n'
        f'argv = [{json.dumps(str(FAKE_AGENT))}, "--prompt-file", "{{prompt_file}}"]\n'
        'prompt_via = "file"\n\n'
        "[profiles.fake.env]\n" + env_lines + "\n"
        "[verification]\n"
        f"commands = {json.dumps(verification or [['python3', 'run_checks.py']])}\n" + agents_toml
    )
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "initial")
    return root
