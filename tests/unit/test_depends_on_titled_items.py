"""`Depends on:` lines naming stories with their titles: every story named is a dependency (the title's words are
items naming no story, ignored and said so). A stricter reading tried on 2026-11-29 (a whole line read as one
story reference with its title) swallowed every story after the first into the title, without a word: a lost
dependency lets a story run before the one it depends on."""

from __future__ import annotations

import pytest

from bso.sprint_status import parse_story_file


@pytest.mark.parametrize(
    "line",
    [
        "1-1 (login) and 1-2 (logout)",  # ['1-1', '(login)', '1-2', '(logout)']
        "1.1 (Login) and 1.2 (Logout)",  # ['1-1', '(Login)', '1-2', '(Logout)']
        "Story 1.1 (Login) and Story 1.2 (Logout)",
        "1.1 - Login and 1.2 - Logout",  # ['1-1', 'Login', '1-2', 'Logout']
    ],
)
def test_a_second_story_after_a_titled_one_is_not_swallowed_by_its_title(line: str) -> None:
    depends_on = parse_story_file(f"# Story 2.1: X\n\nDepends on: {line}\n").depends_on
    assert "1-1" in depends_on and "1-2" in depends_on, depends_on
