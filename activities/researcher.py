"""The knowledge researcher resident's activity: cache first (`index.yaml`, LRU, TTL), then the per-story
call budget, then one research call within its time limit. Cache and budget are files in
`.sprint-session/knowledge-cache/`, owned by the resident, locked while read and written."""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import Callable
from datetime import datetime, timezone
from io import StringIO
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError
from temporalio import activity

from activities.session_files import session_path
from bso.config import KnowledgeResearch
from bso.research import (
    BUDGET_FILE,
    CACHE_DIR,
    INDEX_FILE,
    CacheIndex,
    ResearchRequest,
    ResearchResult,
    budget_key,
    insert,
    lookup,
    touch,
)


class ResearchInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project_root: str
    request: ResearchRequest
    limits: KnowledgeResearch = KnowledgeResearch()
    backend: str = "simulated"
    simulated_delay_ms: int = 0


def _yaml() -> YAML:
    yaml = YAML(typ="safe")
    yaml.default_flow_style = False
    return yaml


def _read(path: Path) -> dict:
    if not path.exists():
        return {}
    data = _yaml().load(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


T = TypeVar("T")


def _read_or_set_aside(path: Path, parse: Callable[[dict], T], empty: T) -> T:
    """A file the resident owns, parsed; one that does not parse (edited by hand, cut short) is moved aside to
    `<name>.unreadable` with a warning naming it, and the resident starts it afresh (a cache, a budget): before,
    every research call failed on it, in this sprint and every later one on the project."""
    try:
        return parse(_read(path))
    except (YAMLError, ValidationError, UnicodeDecodeError, TypeError, ValueError, OverflowError) as err:
        aside = path.with_name(f"{path.name}.unreadable")
        os.replace(path, aside)
        activity.logger.warning("knowledge cache: %s is unreadable (%s); set aside as %s, starting afresh",
                                path, " ".join(str(err).split())[:300], aside.name)
        return empty


def _write(path: Path, data: dict) -> None:
    buffer = StringIO()
    _yaml().dump(data, buffer)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(buffer.getvalue(), encoding="utf-8")
    os.replace(tmp, path)


def _budget_calls(data: dict) -> dict[str, int]:
    calls = data.get("calls") or {}
    if not isinstance(calls, dict):
        raise TypeError(f"calls must be a mapping of story: count, got {type(calls).__name__}")
    return {str(k): int(v) for k, v in calls.items()}


async def _call(inp: ResearchInput) -> str:
    """One research call. Only the simulated researcher exists; a real one would query docs/MCP tools here."""
    if inp.backend != "simulated":
        raise LookupError(f"no knowledge research for agent backend {inp.backend!r} (simulated only)")
    await asyncio.sleep(inp.simulated_delay_ms / 1000)
    return f"simulated research answer for: {inp.request.query}"


@activity.defn
async def research(inp: ResearchInput) -> ResearchResult:
    directory = session_path(inp.project_root, CACHE_DIR, INDEX_FILE).parent
    index_path, budget_path = directory / INDEX_FILE, directory / BUDGET_FILE
    req, limits = inp.request, inp.limits
    base = {"request_id": req.request_id, "story_key": req.story_key, "query": req.query}
    if inp.backend != "simulated":
        return ResearchResult(
            **base, status="unavailable", error=f"no knowledge research for agent backend {inp.backend!r} (simulated only)"
        )
    if (counted_as := budget_key(req.story_key)) is None:
        return ResearchResult(
            **base, status="error", error=f"{req.story_key!r} is not a story key (N-M or N-M-slug, e.g. 1-2)"
        )
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        now = datetime.now(timezone.utc)
        index = _read_or_set_aside(index_path, CacheIndex.model_validate, CacheIndex())
        budget = _read_or_set_aside(budget_path, _budget_calls, {})
        used = budget.get(counted_as, 0)
        left = max(limits.max_calls_per_story - used, 0)
        hit = lookup(index, req.query, now, limits.cache_ttl_days)
        if hit is not None:
            _write(index_path, touch(index, req.query, now).model_dump(mode="json"))
            return ResearchResult(**base, status="cached", answer=hit.answer, cached=True, calls_used=used, calls_left=left)
        if left == 0:
            return ResearchResult(
                **base, status="budget_exhausted", calls_used=used, calls_left=0,
                error=f"story {req.story_key} used its {limits.max_calls_per_story} research calls",
            )
        budget[counted_as] = used + 1  # the call is charged whether it answers or not
        _write(budget_path, {"calls": budget})
    try:
        answer = await asyncio.wait_for(_call(inp), timeout=limits.call_timeout_seconds)
    except asyncio.TimeoutError:
        return ResearchResult(
            **base, status="timeout", calls_used=used + 1, calls_left=left - 1,
            error=f"no answer within {limits.call_timeout_seconds}s",
        )
    except LookupError as err:
        return ResearchResult(**base, status="unavailable", calls_used=used + 1, calls_left=left - 1, error=str(err))
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        index = _read_or_set_aside(index_path, CacheIndex.model_validate, CacheIndex())
        index, evicted = insert(index, req.query, answer, datetime.now(timezone.utc), limits.max_cache_entries)
        _write(index_path, index.model_dump(mode="json"))
    if evicted:
        activity.logger.info("knowledge cache: evicted %d least recently used entries", len(evicted))
    return ResearchResult(**base, status="answered", answer=answer, calls_used=used + 1, calls_left=left - 1)
