"""The Web UI shows a sprint: the workflow list filtered by BsoSessionId and the sprint's detail page,
opened in the system's headless Chromium through Playwright (scripts/ui_screenshots.py)."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not Path("/usr/bin/chromium").exists() or importlib.util.find_spec("playwright") is None,
        reason="needs /usr/bin/chromium (apt-get install chromium; .ci/run installs it) and the dev extras",
    ),
]


def test_ui_lists_and_shows_the_sprint_across_continue_as_new(tmp_path: Path):
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import ui_screenshots
    finally:
        sys.path.remove(str(REPO / "scripts"))
    sprint_id = f"ui-{uuid.uuid4().hex[:6]}"
    # capture() waits for the sprint id (and batch-2's Slave, and the workflow type) on each page and
    # raises if they do not appear.
    # One story a batch and a low hand-over line: the Master continues as new between batches, and the
    # list (by BsoSessionId) and the detail page (the workflow id's latest run) still show the sprint.
    settings = ["batch_size=1", "continue_as_new_after_events=100"]
    shots = ui_screenshots.capture(tmp_path, sprint_id, settings)
    assert set(shots) == {"ui-workflow-list.png", "ui-sprint-detail.png"}
    for path in shots.values():
        assert path.stat().st_size > 10_000  # a rendered page, not a blank one
