"""Check the Temporal Web UI's view of a sprint in a real headless Chromium, and take screenshots.

    .venv/bin/python scripts/ui_screenshots.py [--out docs]

It starts its own dev server with the Web UI (`bso server`, on free ports, SQLite file in a scratch
directory) and a worker (`bso worker`), runs a short sprint of the example project with `bso sprint
start` / `bso sprint watch`, then opens with Playwright, in the system Chromium (/usr/bin/chromium,
`apt-get install chromium`; never `playwright install`):
  - the workflow list filtered by `BsoSessionId="<sprint>"` -> <out>/ui-workflow-list.png
  - the sprint's (Master workflow's) detail page             -> <out>/ui-sprint-detail.png
and checks that both pages show the sprint's workflow id. Everything it started is stopped at the end.
Exit status 0 when both pages showed the sprint. tests/e2e/test_web_ui.py runs `capture()` too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_PROJECT = REPO / "examples" / "demo-project"
CHROMIUM = os.environ.get("BSO_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bso() -> str:
    return str(Path(sys.executable).parent / "bso")


def _wait_http(url: str, server: subprocess.Popen[bytes], log: Path, timeout: float = 120) -> None:
    """Until the UI answers; a server that exited (a port taken meanwhile) is said at once, with its log's end."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2).read(64)
            return
        except OSError:
            if server.poll() is not None:
                raise RuntimeError(
                    f"the dev server exited ({server.returncode}) before {url} answered: {log.read_text()[-1500:]}"
                ) from None
            time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer within {timeout:.0f}s: the server's log ends {log.read_text()[-1500:]}")


def _process(stack: ExitStack, args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    fh = stack.enter_context(log.open("wb"))
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT)

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()

    stack.callback(stop)
    return proc


def run_sprint(scratch: Path, env: dict[str, str], sprint_id: str, settings: list[str] = ()) -> None:
    project = scratch / "project"
    shutil.copytree(EXAMPLE_PROJECT, project, ignore=shutil.ignore_patterns(".sprint-session"))
    script = json.loads((EXAMPLE_PROJECT / "simulation.json").read_text())
    script["default"]["duration_ms"] = 20
    for story in script["stories"].values():
        story.pop("duration_ms", None)
    sim = scratch / "simulation.json"
    sim.write_text(json.dumps(script))
    for args in (
        ["sprint", "start", str(project), "--simulation", str(sim), "--id", sprint_id]
        + [arg for setting in settings for arg in ("--set", setting)],
        ["sprint", "watch", sprint_id, "--interval", "0.5"],
    ):
        subprocess.run([_bso(), *args], env=env, cwd=REPO, check=True, capture_output=True, timeout=300)


def screenshot_pages(ui: str, sprint_id: str, out: Path, handed_over: bool = False) -> dict[str, Path]:
    """Open the two pages in headless Chromium; return the screenshots. Raises if a page lacks the id (or,
    with `handed_over`, if the list does not show the Master's earlier run as continued as new)."""
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    query = urllib.parse.quote(f'BsoSessionId="{sprint_id}"')
    pages = {
        "ui-workflow-list.png": f"{ui}/namespaces/default/workflows?query={query}",
        "ui-sprint-detail.png": f"{ui}/namespaces/default/workflows/{urllib.parse.quote(sprint_id, safe='')}",
    }
    shots: dict[str, Path] = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            for name, url in pages.items():
                page.goto(url, wait_until="domcontentloaded", timeout=60_000)
                page.get_by_text(sprint_id, exact=False).first.wait_for(state="visible", timeout=60_000)
                if name == "ui-workflow-list.png":
                    # The Master and both batches' Slaves carry the sprint's BsoSessionId.
                    page.get_by_text(f"{sprint_id}/batch-2").first.wait_for(state="visible", timeout=60_000)
                    if handed_over:  # the Master's earlier runs are listed too, by the same search attribute
                        page.get_by_text("Continued as New", exact=False).first.wait_for(
                            state="visible", timeout=60_000
                        )
                else:
                    page.get_by_text("SprintMasterWorkflow").first.wait_for(state="visible", timeout=60_000)
                page.wait_for_timeout(1500)  # let the UI settle (spinners, fonts)
                path = out / name
                page.screenshot(path=str(path))
                shots[name] = path
        finally:
            browser.close()
    return shots


def capture(out: Path, sprint_id: str | None = None, settings: list[str] = ()) -> dict[str, Path]:
    """Start a dev server with the UI and a worker, run a sprint (`settings`: `--set` overrides), screenshot
    its pages. With `continue_as_new_after_events` among the settings, the list must show a hand-over."""
    sprint_id = sprint_id or f"ui-sprint-{int(time.time())}"
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        scratch = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
        for attempt in range(3):  # a free port may be taken by another process before the server binds it
            port, ui_port = _free_port(), _free_port()
            env.update(TEMPORAL_ADDRESS=f"127.0.0.1:{port}", TEMPORAL_NAMESPACE="default")
            server = [_bso(), "server", "--port", str(port), "--ui-port", str(ui_port)]
            server += ["--db-filename", str(scratch / f"dev-{attempt}.db")]
            log = scratch / f"server-{attempt}.log"
            server_process = _process(stack, server, env, log)
            ui = f"http://127.0.0.1:{ui_port}"
            try:
                _wait_http(ui, server_process, log)
                break
            except RuntimeError:
                if server_process.poll() is None or attempt == 2:
                    raise
        _process(stack, [_bso(), "worker"], env, scratch / "worker.log")
        run_sprint(scratch, env, sprint_id, settings)
        handed_over = any(setting.startswith("continue_as_new_after_events=") for setting in settings)
        return screenshot_pages(ui, sprint_id, out, handed_over)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs", help="where to save the PNGs (default: docs/)")
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        print(f"error: {CHROMIUM} not found: apt-get install -y chromium (or set BSO_CHROMIUM)", file=sys.stderr)
        return 1
    for name, path in capture(args.out).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
