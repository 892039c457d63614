"""`make demo`, the README's first command, run as a user runs it (scripts/demo.py on its own free ports,
its .run/.demo/.temporal in a scratch directory): it starts the dev server and a worker, runs the example
sprint through the temporal CLI, prints the report and the status file's changed lines, and stops its
worker; the server it leaves running is stopped here by the pid the demo recorded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.infra import free_port
from tests.conftest import REPO

pytestmark = pytest.mark.e2e


def _demo_module():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import demo
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return demo


def test_make_demo_runs_the_example_sprint(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "BSO_"))}
    port, ui_port = free_port(), free_port()
    env.update(BSO_DEMO_HOME=str(tmp_path), BSO_DEMO_PORT=str(port), BSO_DEMO_UI_PORT=str(ui_port))
    proc = subprocess.Popen(
        [sys.executable, "scripts/demo.py"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = proc.communicate(timeout=400)
        worker_pid_left = (tmp_path / ".run" / "worker.pid").exists()  # the demo removes it when it stops its worker
    except BaseException:  # a timeout or an interrupted run: SIGTERM lets the demo stop its own worker
        proc.terminate()
        out, err = proc.communicate(timeout=60)
        raise
    finally:
        # Whatever happened: the demo's worker (it stops it itself unless killed) and the server it started.
        demo = _demo_module()
        demo.stop_recorded(tmp_path / ".run" / "worker.pid", "workers.main", "the demo's worker")
        demo.stop_recorded(tmp_path / ".run" / "server.pid", "start-dev", "the demo's server")
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert "starting the Temporal dev server" in out and f"--port {port}" in out
    assert "temporal workflow start" in out and "--type SprintMasterWorkflow" in out
    # The example's scripted outcome: an improve cycle, two review-fix rounds, one dev failure.
    assert "sprint-partial" in out
    assert "2-2-expiry-reminder-emails" in out and "needs-intervention" in out
    assert "+  1-2-pantry-item-model-and-storage: done" in out
    assert "2 of 2 batches done" in out
    assert f"the demo's worker is stopped: run `BSO_DEMO_PORT={port} make worker`" in out
    assert f"http://localhost:{ui_port}/namespaces/default/workflows/demo-" in out
    # Its worker is stopped and its pid file gone; the scratch project is under the demo's home.
    assert not worker_pid_left
    (project,) = (tmp_path / ".demo").iterdir()
    status = (project / "_bmad-output/implementation-artifacts/sprint-status.yaml").read_text()
    assert "2-2-expiry-reminder-emails: needs-intervention" in status
    assert (tmp_path / ".temporal" / "bso-dev.db").exists()


def test_the_demo_offers_make_stop_only_for_a_server_it_started(tmp_path: Path, monkeypatch):
    """A server an earlier demo started, since killed and restarted by hand (`make server`): its stale pid file
    must not make the demo say `make stop` will stop the server that runs now."""
    demo = _demo_module()
    monkeypatch.setattr(demo, "RUN_DIR", tmp_path)
    gone = subprocess.Popen(["true"])
    gone.wait()
    (tmp_path / "server.pid").write_text(f"{gone.pid}\n")
    with demo.console.capture() as captured:
        demo.print_epilogue("s-1", server_started=False)
    assert "was already running and is left as it was" in captured.get() and "make stop" not in captured.get()
    with demo.console.capture() as captured:
        demo.print_epilogue("s-1", server_started=True)
    assert "stop it with: make stop" in captured.get()


def test_an_interrupted_demo_says_how_to_resume_it_on_its_own_port(tmp_path: Path, monkeypatch):
    """Interrupted on BSO_DEMO_PORT=7555, it said `make worker` resumes the sprint: that worker serves 7233."""
    demo = _demo_module()
    monkeypatch.setattr(demo, "RUN_DIR", tmp_path)
    monkeypatch.setattr(demo, "PORT", 7555)
    monkeypatch.setattr(demo, "ADDRESS", "localhost:7555")

    async def interrupted(state):
        state.update(session_id="demo-1", sprint_started=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "run", interrupted)
    monkeypatch.chdir(REPO)  # main() moves there; put back after
    monkeypatch.setattr(demo.signal, "signal", lambda *_: None)  # main()'s SIGTERM handler is not the test's
    with demo.console.capture() as captured:
        assert demo.main() == 130
    said = " ".join(captured.get().split())
    assert "interrupted: the sprint's state is safe on the server; `BSO_DEMO_PORT=7555 make worker` resumes it where it was" in said
    assert "[yellow]" not in said  # the markup rendered, not printed
    assert "stays open on the server: `BSO_DEMO_PORT=7555 make worker` resumes it" in said
    assert ".venv/bin/bso --address localhost:7555 sprint cancel demo-1" in said
    assert "`make worker`" not in said
