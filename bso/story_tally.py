"""Running counts over a sprint's story views, kept as each view changes.

The Master shows its progress (stories done, stories awaiting a human decision) on every batch start and end
and every `story_updates` signal; counting them by a walk over every story made each of those O(stories), and
a sprint of N stories O(N^2) in all. The Master changes a view only through `_put_view` and `_drop_view`, which
tell this tally.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from bso.models import StoryView
from bso.states import StoryState


def _is_done(view: StoryView | None) -> int:
    return view is not None and view.state == StoryState.DONE


@dataclass
class StoryTally:
    done: int = 0
    awaiting: dict[str, str] = field(default_factory=dict)  # story -> the decision it awaits, first come first

    @classmethod
    def of(cls, views: Mapping[str, StoryView]) -> StoryTally:
        tally = cls()
        for key, view in views.items():
            tally.change(key, None, view)
        return tally

    def change(self, key: str, old: StoryView | None, new: StoryView | None) -> None:
        """`key`'s view goes from `old` to `new` (None: the story has no view)."""
        self.done += _is_done(new) - _is_done(old)
        if new is not None and new.awaiting_decision:
            self.awaiting[key] = new.awaiting_decision
        else:
            self.awaiting.pop(key, None)
