"""The e2e-live resident on the time-skipping server, with a real headless Chromium (the system's, driven by
Playwright) against a small page this test serves on localhost: every operation and every status."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from activities.browser import BrowseInput, find_chromium, perform
from bso.browser import BrowserRequest
from bso.roster import resident_workflow_id
from tests.conftest import bso_worker
from tests.workflow.helpers import make_project, sprint_result
from tests.workflow.test_researcher import held_sprint
from workflows.residents import ResidentWorkflow
from workflows.sprint_master import SprintMasterWorkflow

PAGE = b"""<!doctype html><html><head><title>Shelfwise Pantry</title></head><body>
<h1 id="heading">Pantry</h1>
<input id="name" value="">
<button id="add" onclick="document.getElementById('heading').textContent='Added'">Add</button>
<ul id="items"><li>Rice</li><li>Beans</li></ul>
</body></html>"""


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the stdlib's name
        if self.path.startswith("/slow"):
            time.sleep(3)
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *args):
        return


@pytest.fixture
def app_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


def req(n: int, operation: str, **kw) -> dict:
    return {"msg_type": "BROWSER_REQUEST", "request_id": f"BR-{n:03d}", "operation": operation, **kw}


async def test_e2e_live_resident_drives_a_real_chromium(ts_env, tmp_path: Path, app_url: str):
    assert find_chromium(), "the browser test needs the system chromium (apt-get install -y chromium)"
    make_project(tmp_path, {"1-1-login-form": "review"})
    overrides = {"resident_slots.e2e_live": True, "e2e_live_base_url": app_url}
    async with bso_worker(ts_env.client) as queue:
        handle, _ = await held_sprint(ts_env.client, queue, tmp_path, "e2e-1", overrides)
        live = ts_env.client.get_workflow_handle(resident_workflow_id("e2e-1", "e2e-live"))

        async def browse(**kw):
            return await live.execute_update(ResidentWorkflow.browse, kw)

        nav = await browse(**req(1, "navigate", url="/pantry", screenshot_path=".sprint-session/screenshots/nav.png"))
        assert nav.status == "success" and nav.result_data["page_title"] == "Shelfwise Pantry"
        assert nav.result_data["url"] == app_url + "pantry"
        assert (tmp_path / ".sprint-session/screenshots/nav.png").read_bytes()[:4] == b"\x89PNG"
        check = await browse(**req(2, "check_element", selector="#heading"))
        assert check.status == "success" and check.result_data["text"] == "Pantry" and check.result_data["visible"]
        typed = await browse(**req(3, "type", selector="#name", input_value="Lentils"))
        assert typed.status == "success" and typed.result_data["value"] == "Lentils"
        clicked = await browse(**req(4, "click", selector="#add"))
        assert clicked.status == "success"
        dom = await browse(**req(5, "read_dom", selector="#items"))
        assert dom.status == "success" and "<li>Beans</li>" in dom.result_data["html"]
        shot = await browse(**req(6, "screenshot", screenshot_path="shots/page.png"))
        assert shot.status == "success" and (tmp_path / "shots/page.png").exists()
        # The timeout covers the page load too: room for a fresh renderer on a busy machine.
        missing = await browse(**req(7, "check_element", selector="#nope", timeout_ms=5000))
        assert missing.status == "element_not_found"
        slow = await browse(**req(8, "navigate", url="/slow", timeout_ms=500))
        assert slow.status == "timeout"
        for bad in (req(9, "click"), req(10, "fly"), req(11, "screenshot", screenshot_path="../outside.png")):
            assert (await browse(**bad)).status == "invalid_request"
        broken = await browse(**req(12, "navigate", url="http://127.0.0.1:9/"))
        assert broken.status == "browser_error"
        await handle.signal(SprintMasterWorkflow.resume, {})
        await sprint_result(handle)


async def test_no_browser_tool(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("BSO_CHROMIUM", str(tmp_path / "no-such-browser"))
    result = await perform(
        BrowseInput(project_root=str(tmp_path), request=BrowserRequest(request_id="BR-1", operation="navigate"),
                    base_url="http://127.0.0.1:1/")
    )
    assert result.status == "no_browser_tool"
