"""The knowledge researcher's protocol (RESEARCH_REQUEST / RESEARCH_RESULT) and its cache rules, pure.

Answers are cached in `index.yaml` (at most `max_cache_entries`, least recently used evicted first, an entry
older than `cache_ttl_days` is stale); a cache hit costs no call. Each story may make at most
`max_calls_per_story` research calls; each call may take at most `call_timeout_seconds`. The cache and the
budget live in files the resident owns (`.sprint-session/knowledge-cache/`), so they survive a restart.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from bso.story_keys import SHORT_KEY_RE, STORY_KEY_RE

CACHE_DIR = "knowledge-cache"
INDEX_FILE = "index.yaml"
BUDGET_FILE = "budget.yaml"


def budget_key(story_key: str) -> str | None:
    """The key a story's research calls are counted under: its short key (`1-2` for `1-2-login-form`), so that
    the short and the full key share one budget; None for what is not a story key (no budget of its own)."""
    match = STORY_KEY_RE.match(story_key) or SHORT_KEY_RE.match(story_key)
    return f"{match.group(1)}-{match.group(2)}{match.group(3)}" if match else None


class ResearchRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    msg_type: Literal["RESEARCH_REQUEST"] = "RESEARCH_REQUEST"
    request_id: str = Field(min_length=1, max_length=200)
    story_key: str = Field(min_length=1)
    query: str = Field(min_length=1, max_length=2000)
    report_to: str | None = None  # a workflow id to signal RESEARCH_RESULT to (agents use the update instead)
    priority: Literal["critical", "high", "normal", "low"] | None = None  # message-schemas: the research activity's Temporal priority


class ResearchResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    msg_type: Literal["RESEARCH_RESULT"] = "RESEARCH_RESULT"
    request_id: str
    story_key: str
    query: str
    status: Literal["answered", "cached", "budget_exhausted", "timeout", "unavailable", "error"]
    answer: str = ""
    cached: bool = False
    calls_used: int = 0  # the story's research calls so far (cache hits are free)
    calls_left: int = 0
    error: str | None = None


class CacheEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str
    answer: str
    created_at: datetime
    last_used: datetime
    hits: int = 0


class CacheIndex(BaseModel):
    model_config = ConfigDict(extra="forbid")

    entries: dict[str, CacheEntry] = Field(default_factory=dict)


def cache_key(query: str) -> str:
    normalised = " ".join(query.lower().split())
    return hashlib.sha256(normalised.encode()).hexdigest()[:16]


def lookup(index: CacheIndex, query: str, now: datetime, ttl_days: int) -> CacheEntry | None:
    entry = index.entries.get(cache_key(query))
    if entry is None or now - entry.created_at > timedelta(days=ttl_days):
        return None
    return entry


def touch(index: CacheIndex, query: str, now: datetime) -> CacheIndex:
    key = cache_key(query)
    entry = index.entries[key]
    entries = dict(index.entries)
    entries[key] = entry.model_copy(update={"last_used": now, "hits": entry.hits + 1})
    return CacheIndex(entries=entries)


def insert(index: CacheIndex, query: str, answer: str, now: datetime, max_entries: int) -> tuple[CacheIndex, list[str]]:
    """The index with the answer cached; least recently used entries evicted beyond `max_entries`."""
    entries = dict(index.entries)
    entries[cache_key(query)] = CacheEntry(query=query, answer=answer, created_at=now, last_used=now)
    evicted: list[str] = []
    while len(entries) > max_entries:
        oldest = min(entries, key=lambda k: (entries[k].last_used, k))
        evicted.append(entries.pop(oldest).query)
    return CacheIndex(entries=entries), evicted
