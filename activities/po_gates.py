"""Agent-PO gate activities: read the story's acceptance criteria and file scope; record gate decisions.

Idempotent: the scope is read, the decision file is rewritten whole (atomically) from what the Slave sends.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from temporalio import activity

from activities.session_files import safe_name, session_path, write_json_atomic
from bso.git_rules import parse_file_scope
from bso.po_gates import StoryScope, acceptance_criteria_ids
from bso.sprint_status import parse_story_file, resolve_inside


class StoryScopeInput(BaseModel):
    model_config = ConfigDict(frozen=True)
    project_root: str
    story_path: str


class GateRecordInput(BaseModel):
    model_config = ConfigDict(frozen=True)
    project_root: str
    session_id: str
    story_key: str
    gate: Literal["go", "next"]
    decisions: list[dict[str, Any]]  # every decision of this gate for the story so far, oldest first


def gate_file(project_root: str, story_key: str, gate: str) -> Path:
    name = story_key if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", story_key) else safe_name(story_key)
    return session_path(project_root, "gates", f"{name}-{gate}.json")


def _read_scope(inp: StoryScopeInput) -> StoryScope:
    target = Path(resolve_inside(inp.project_root, inp.story_path))
    if not target.is_file():
        return StoryScope()
    text = target.read_text(encoding="utf-8", errors="replace")
    # `Files:` (P29), else a `File scope:` line / section (the command backend's scope guard reads the same)
    files = parse_story_file(text).files or parse_file_scope(text)
    return StoryScope(ac_ids=acceptance_criteria_ids(text), files=files)


@activity.defn
async def load_story_scope(inp: StoryScopeInput) -> StoryScope:
    """The story's AC ids and `Files:` scope (a missing story file: no AC, no scope)."""
    return await asyncio.to_thread(_read_scope, inp)


@activity.defn
async def record_gate(inp: GateRecordInput) -> str:
    """`.sprint-session/gates/<story>-<gate>.json`: the gate's decisions for the story, oldest first."""
    path = gate_file(inp.project_root, inp.story_key, inp.gate)
    data = {"story_key": inp.story_key, "session_id": inp.session_id, "gate": inp.gate, "decisions": inp.decisions}
    await asyncio.to_thread(write_json_atomic, path, data)
    return str(path)
