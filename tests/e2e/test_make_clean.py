"""`make clean` before `make stop` deleted the demo server's database and pid records: the server ran on, on a
deleted file, and nothing recorded it any more (a later `make demo` reused it)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"


def test_make_clean_stops_the_demos_server_before_it_removes_its_files(tmp_path: Path) -> None:
    # A stand-in for the demo's server: `make stop` stops a recorded pid only if its command line says start-dev.
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "start-dev"])
    reaped = threading.Thread(target=server.wait, daemon=True)  # (a zombie would still answer `kill -0`)
    reaped.start()
    try:
        (tmp_path / ".run").mkdir()
        (tmp_path / ".run" / "server.pid").write_text(f"{server.pid}\n")
        (tmp_path / ".temporal").mkdir()
        (tmp_path / ".temporal" / "bso-dev.db").write_text("")
        done = subprocess.run(["make", "-f", str(MAKEFILE), "clean"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=60, env={**os.environ, "MAKEFLAGS": ""})
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"stopping server (pid {server.pid})" in done.stdout, done.stdout
        reaped.join(timeout=10)
        assert server.returncode is not None
        assert not (tmp_path / ".temporal").exists() and not (tmp_path / ".run").exists()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
