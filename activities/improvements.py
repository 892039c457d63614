"""The improvement cycle's I/O: the scrum-master's proposals, and adding the chosen ones as stories.

`propose_improvements`: simulated agents propose what the simulation script says; any other backend reads
`.sprint-session/improvements/<session id>.json`, else `.sprint-session/improvements.json` (a list of
IMPROVEMENT_REQUESTED payloads or Gear 2 `improvement_requested` messages; BSO runs no agent to write it). Invalid proposals are skipped and reported (validation_failed).
`add_improvement_stories`: each becomes a `ready-for-dev` story (status entry after the epic's last story,
story file with the proposal's acceptance criteria), under the status file's lock; idempotent.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import re
import stat
from pathlib import Path

from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.session_files import SESSION_DIR
from activities.status_file import _atomic_replace, _read_text, file_work_heartbeats, status_lock_path
from bso.improvements import AddStoriesInput, Proposals, ProposeInput, insert_after
from bso.messages import ImprovementRequestedPayload, parse_message, validation_failed
from bso.models import StoryMeta, short_key
from bso.sprint_status import (
    StatusFileError,
    StoryKeyError,
    epic_key_of,
    insert_story_entry,
    parse_status_text,
    render_story_file,
    resolve_inside,
)

PROPOSALS_FILE = "improvements.json"  # shared by every sprint of the project
PROPOSALS_DIR = "improvements"  # improvements/<session id>.json: this sprint's own, preferred


def proposals_path(project_root: str, session_id: str) -> Path:
    """This sprint's proposals file when there is one, else the project's shared one."""
    shared = Path(project_root, SESSION_DIR, PROPOSALS_FILE)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", session_id):  # not a plain file name: no file of its own
        return shared
    own = Path(project_root, SESSION_DIR, PROPOSALS_DIR, f"{session_id}.json")
    return own if own.exists() else shared


def _read_proposals(inp: ProposeInput) -> Proposals:
    path = proposals_path(inp.project_root, inp.session_id)
    if not path.exists():
        return Proposals()
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return Proposals(rejected=[f"{path}: unreadable ({err})"])
    if not isinstance(raw, list):
        return Proposals(rejected=[f"{path}: must be a list of improvements"])
    proposals, rejected = [], []
    for index, item in enumerate(raw):
        try:
            if isinstance(item, dict) and ("message_type" in item or "type" in item):
                message = parse_message(item)  # an error message (validation_failed, ...) has no payload
                proposals.append(getattr(message, "payload", message))
            else:
                proposals.append(ImprovementRequestedPayload.model_validate(item))
        except ValidationError as err:
            rejected.append(f"[{index}] validation_failed: {validation_failed(item, err).describe()}")
    kept = [p for p in proposals if isinstance(p, ImprovementRequestedPayload)]
    rejected += [f"not an improvement_requested: {type(p).__name__}" for p in proposals if p not in kept]
    return Proposals(proposals=kept, rejected=rejected)


@activity.defn
async def propose_improvements(inp: ProposeInput) -> Proposals:
    if inp.backend == "simulated":
        return Proposals(proposals=list(inp.simulated))
    async with file_work_heartbeats("reading the improvement proposals"):
        return await asyncio.to_thread(_read_proposals, inp)


def _add_sync(inp: AddStoriesInput) -> list[StoryMeta]:
    target = inp.status_file
    lock_fd = os.open(status_lock_path(target), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        text = _read_text(target)
        mode = stat.S_IMODE(os.stat(target).st_mode)
        out: list[StoryMeta] = []
        changed = False
        for story in inp.stories:
            keys = [e.key for e in parse_status_text(text, target).entries]
            if story.key not in keys:
                after = insert_after(keys, inp.epic) or (f"epic-{inp.epic}" if f"epic-{inp.epic}" in keys else None)
                if after is None:
                    raise ApplicationError(
                        f"{target}: epic-{inp.epic} is not in development_status", type="StatusFileError",
                        non_retryable=True,
                    )
                text = insert_story_entry(text, after, story.key, "ready-for-dev", target)
                changed = True
            rel = f"{inp.story_location.rstrip('/')}/{story.key}.md"
            path = resolve_inside(inp.project_root, rel)
            proposal = story.proposal
            title = proposal.description.strip().rstrip(".")[:120]
            if not os.path.exists(path):
                epic_num, story_num = short_key(story.key).split("-", 1)
                tags = ["improvement"] + ([proposal.category] if proposal.category else [])
                body = render_story_file(
                    story_key=story.key, title=title, epic_num=epic_num, story_num=story_num,
                    status="ready-for-dev", acceptance_criteria=list(proposal.acceptance_criteria), tags=tags,
                )
                os.makedirs(os.path.dirname(path), exist_ok=True)
                # Whole or not at all: a retry skips a story file that exists, so a torn one would stay.
                _atomic_replace(path, body.encode("utf-8"), 0o644)
            out.append(
                StoryMeta(
                    key=story.key, epic=epic_key_of(story.key), short_key=short_key(story.key),
                    state="ready-for-dev", title=title, story_path=rel,
                    tags=["improvement"] + ([proposal.category] if proposal.category else []),
                )
            )
        if changed:
            _atomic_replace(target, text.encode("utf-8"), mode)
        return out
    except (StatusFileError, StoryKeyError, ValueError) as err:
        raise ApplicationError(str(err), type="StatusFileError", non_retryable=True) from None
    finally:
        fcntl.flock(lock_fd, fcntl.LOCK_UN)
        os.close(lock_fd)


@activity.defn
async def add_improvement_stories(inp: AddStoriesInput) -> list[StoryMeta]:
    async with file_work_heartbeats("adding the improvement stories"):
        return await asyncio.to_thread(_add_sync, inp)
