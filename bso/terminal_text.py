"""Text that others wrote (an agent's error, a test runner's coloured output, an operator's note), made safe to
print on a terminal: `bso sprint status`, `watch`, `report` and `messages` show it as it was written, never as
instructions to the terminal (an ANSI sequence that clears the screen or recolours what follows, a carriage
return that overwrites a line, a NUL) nor to Rich (its `[markup]`, which a `[/x]` broke)."""

from __future__ import annotations

import re
from typing import TypeVar

from pydantic import BaseModel

from bso.messages import map_strings

# C0 controls but newline and tab, DEL, C1 controls; lone surrogates (no terminal encoding takes them).
_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` with each control character (newline and tab kept) shown as its escape: ESC as `\\x1b`."""
    return _UNPRINTABLE.sub(_escaped, text)


M = TypeVar("M", bound=BaseModel)


def printable_model(model: M) -> M:
    """The same model with every string in it (keys too) made printable."""
    return type(model).model_validate(map_strings(model.model_dump(), printable))
