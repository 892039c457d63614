"""The launcher (activities/agent_launcher.py): its check for a cancelled sprint's request to stop its agent, and
its pump of the agent's output."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from activities.agent_launcher import (
    CANCELLED_FILE,
    LAST_LINE_CHARS,
    PUMP_PIECE_BYTES,
    StreamRedactor,
    cancel_requested,
    pump,
    redact_forms,
    secret_forms,
)

RECORD = {"dispatch_id": "s1/batch-1/1-1/1", "run_id": "run-2", "attempt": 1}


@pytest.mark.parametrize(
    ("content", "requested"),
    [
        (json.dumps({"dispatch_id": "s1/batch-1/1-1/1", "run_id": "run-2"}), True),
        # a sprint run earlier under the same id (its dispatch ids repeat): not this agent's
        (json.dumps({"dispatch_id": "s1/batch-1/1-1/1", "run_id": "run-1"}), False),
        (json.dumps({"dispatch_id": "s1/batch-1/1-1/2", "run_id": "run-2"}), False),
        (None, False),
        ("{torn", False),
        ("[1, 2]", False),
        ("", False),
    ],
)
def test_only_this_runs_request_stops_the_agent(tmp_path: Path, content: str | None, requested: bool) -> None:
    if content is not None:
        (tmp_path / CANCELLED_FILE).write_text(content, encoding="utf-8")
    assert cancel_requested(tmp_path, RECORD) is requested


class Printing:
    """An agent's stdout (a pipe read by `readline(limit)`) that prints `parts` in turn, never holding them whole."""

    def __init__(self, *parts: tuple[bytes, int]) -> None:
        self._parts = [part for part, times in parts for _ in range(times)]

    def readline(self, limit: int = -1) -> bytes:
        limit = limit if limit >= 0 else 1 << 62
        line = b""
        while self._parts and len(line) < limit and not line.endswith(b"\n"):
            part = self._parts[0][: limit - len(line)]
            end = part.find(b"\n") + 1 or len(part)
            line += part[:end]
            self._parts[0] = self._parts[0][end:]
            if not self._parts[0]:
                self._parts.pop(0)
        return line


def test_a_line_of_hundreds_of_mb_is_pumped_in_pieces_its_secrets_redacted(tmp_path: Path) -> None:
    """The launcher read the agent's output a whole line at a time: a line of hundreds of MB with no newline (a
    tool's output relayed in one JSON event) was held whole. Now in pieces, and a secret a piece cuts in two (its
    JSON-escaped form too) is still redacted; a line shows at once, as before."""
    secret = "sk-live-" + "q" * 40 + "\u00e9"  # (é: its bytes cut between two pieces too)
    forms = secret_forms([secret])
    chunk = b"x" * (PUMP_PIECE_BYTES - 20) + json.dumps(secret).encode() + b"y" * 7  # each cut inside a secret
    out, last = tmp_path / "stdout.log", [""]
    tracemalloc.start()
    try:
        pump(Printing((b"first line " + secret.encode() + b"\n", 1), (chunk, 500), (b" end\n", 1)), out, forms, last)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * 1024 * 1024, peak  # the line is 32 MB
    whole = ("first line " + secret + "\n" + (chunk * 500).decode() + " end\n")
    written = out.read_text(encoding="utf-8")
    assert written == redact_forms(whole, forms)
    assert secret not in written and json.dumps(secret)[1:-1] not in written
    assert last[0] == "x" * LAST_LINE_CHARS  # the start of the last line


def test_the_last_output_of_a_line_of_many_pieces_is_its_start(tmp_path: Path) -> None:
    """The exit record's last output was the start of the line's last piece (of 64 KB), not of the line."""
    long_line = b"  Error: the build failed " + b"y" * (3 * PUMP_PIECE_BYTES) + b" (tail)\n"
    last = [""]
    pump(Printing((b"first\n", 1), (long_line, 1), (b"   \n", 1)), tmp_path / "stdout.log", [], last)
    assert last[0] == long_line.decode().strip()[:LAST_LINE_CHARS]


def test_the_last_output_of_an_agent_that_ends_without_a_newline_is_its_last_line(tmp_path: Path) -> None:
    """The end of the output the redactor held back (where a secret could still begin) was written to the log but
    never shown: the exit record's last output was the line before."""
    last = [""]
    pump(Printing((b"working\n", 1), (b"done: 3 tests pass", 1)), tmp_path / "stdout.log", secret_forms(["hunter2-token"]), last)
    assert (tmp_path / "stdout.log").read_text() == "working\ndone: 3 tests pass"
    assert last[0] == "done: 3 tests pass"


def test_a_secret_overlapping_itself_is_redacted_in_pieces_none_held_long(tmp_path: Path) -> None:
    """A secret `aaaa...` in a text of endless `a`s: where it could begin at the end of a piece, it could begin
    one character earlier, and so on: the end held for the next piece grew to the whole text (32 MB here)."""
    forms = secret_forms(["a" * 12])
    text = "a" * (12 * 2_800_000 + 5)
    piece = 64 * 1024
    redactor = StreamRedactor(forms)
    written, held = 0, 0
    tracemalloc.start()
    try:
        for start in range(0, len(text), piece):
            out = redactor.feed(text[start:start + piece])
            written += len(out)
            held = max(held, min(start + piece, len(text)) - written * 4)  # (each *** stands for 12 characters)
        tail = redactor.finish()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * piece * 12, peak  # the text is 32 MB: one piece and its matches, not the whole
    assert written + len(tail) == len(redact_forms(text, forms)) and tail.endswith("a" * 5)
    assert redactor.redacted and held < 2 * piece


@settings(max_examples=300, deadline=None)
@given(
    forms=st.lists(st.text("ab\n", min_size=1, max_size=6), min_size=1, max_size=3, unique=True),
    text=st.text("ab\n", max_size=60),
    cuts=st.lists(st.integers(1, 7), max_size=30),
)
def test_redacting_in_pieces_is_redacting_the_whole(forms: list[str], text: str, cuts: list[int]) -> None:
    """However the text is cut into pieces, and whatever its forms overlap (each other, themselves)."""
    forms = sorted(forms, key=len, reverse=True)
    redactor = StreamRedactor(forms)
    out, at = "", 0
    for size in cuts:
        out += redactor.feed(text[at:at + size])
        at += size
    out += redactor.feed(text[at:]) + redactor.finish()
    assert out == redact_forms(text, forms)
    assert redactor.redacted == (redact_forms(text, forms) != text)
