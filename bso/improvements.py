"""The improvement cycle (Gear 2), as pure rules.

After every story of the sprint is done, the scrum-master proposes improvements (IMPROVEMENT_REQUESTED
payloads, each with a `priority_score`); the top `max_improvements` become stories of the sprint's last
epic and run through the same pipeline. Everything here is deterministic: safe inside workflows.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

from bso.messages import ImprovementRequestedPayload
from bso.story_keys import STORY_KEY_RE


MAX_SLUG_CHARS = 40


class ImprovementRecord(BaseModel):
    """One improvement the sprint took on: the proposal and the story it became."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    improvement_id: str
    story_key: str
    description: str
    priority_score: float
    category: str = ""
    acceptance_criteria: list[str] = Field(default_factory=list)


def select_improvements(
    proposals: list[ImprovementRequestedPayload], max_improvements: int
) -> list[ImprovementRequestedPayload]:
    """The top `max_improvements` by priority_score (ties: proposal order); one per improvement_id."""
    seen: set[str] = set()
    unique = []
    for proposal in proposals:
        if proposal.improvement_id not in seen:
            seen.add(proposal.improvement_id)
            unique.append(proposal)
    ranked = sorted(enumerate(unique), key=lambda pair: (-pair[1].priority_score, pair[0]))
    return [proposal for _, proposal in ranked[: max(max_improvements, 0)]]


def _slug(text: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug[:MAX_SLUG_CHARS].strip("-") or "improvement"


def improvement_story_keys(
    selected: list[ImprovementRequestedPayload], existing_keys: list[str], epic: int
) -> list[str]:
    """New story keys in `epic`, numbered after its highest story: `{epic}-{n}-imp-...` from the improvement id."""
    numbers = [
        int(m.group(2)) for key in existing_keys if (m := STORY_KEY_RE.match(key)) and int(m.group(1)) == epic
    ]
    next_number = max(numbers, default=0) + 1
    keys = []
    for offset, proposal in enumerate(selected):
        slug = _slug(proposal.improvement_id)
        keys.append(f"{epic}-{next_number + offset}-{slug if slug.startswith('imp') else 'imp-' + slug}")
    return keys


def last_epic(story_keys: list[str]) -> int:
    """The highest epic number among the sprint's stories (improvements join it)."""
    epics = [int(m.group(1)) for key in story_keys if (m := STORY_KEY_RE.match(key))]
    return max(epics, default=1)


def insert_after(existing_keys: list[str], epic: int) -> str | None:
    """The status-file key after which a new story of `epic` goes: its last story (None: no story yet)."""
    last = None
    for key in existing_keys:
        m = STORY_KEY_RE.match(key)
        if m and int(m.group(1)) == epic:
            last = key
    return last


# --- activity inputs and results -----------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProposeInput(_Model):
    project_root: str
    session_id: str
    backend: str = "simulated"
    done_stories: list[str] = Field(default_factory=list)
    simulated: list[ImprovementRequestedPayload] = Field(default_factory=list)  # the simulation script's


class Proposals(_Model):
    proposals: list[ImprovementRequestedPayload] = Field(default_factory=list)
    rejected: list[str] = Field(default_factory=list)  # validation_failed descriptions of bad proposals


class NewStory(_Model):
    key: str
    proposal: ImprovementRequestedPayload


class AddStoriesInput(_Model):
    project_root: str
    status_file: str
    story_location: str  # relative to project_root
    epic: int
    stories: list[NewStory]
