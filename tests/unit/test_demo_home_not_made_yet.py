"""scripts/demo.py with BSO_DEMO_HOME naming a folder that does not exist yet: it made its .run/, .temporal/ and
.demo/ without their parents, and stopped with a traceback (FileNotFoundError). The .demo/ copy is checked here;
.run/ and .temporal/ are made alike where it starts the server and the worker (run by tests/e2e/test_demo.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.fixture
def demo(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    monkeypatch.delitem(sys.modules, "demo", raising=False)
    import demo

    yield demo
    sys.modules.pop("demo", None)


def test_the_demo_copies_its_project_into_a_home_not_made_yet(demo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    home = tmp_path / "not" / "made" / "yet"
    monkeypatch.setattr(demo, "DEMO_DIR", home / ".demo")
    copied = demo.copy_project("demo-1")
    assert copied == home / ".demo" / "demo-1" and (copied / demo.STATUS_REL).is_file()

