"""BMAD's key grammar for sprint-status.yaml: epics, retrospectives and stories (`3-2-chunk-manager`, `3-2a-...`).

A leaf module (no BSO imports), so every module that reads keys takes the one grammar. Epic and story numbers
have at most MAX_NUMBER_DIGITS digits: a longer one is no key (its line is named as such) rather than a number
Python refuses to read past 4,300 digits, or a story whose agents' dispatch ids outgrow what an answer may name.
"""

from __future__ import annotations

import re

MAX_NUMBER_DIGITS = 9
_N = rf"(\d{{1,{MAX_NUMBER_DIGITS}}})"

# \Z, not $: `$` also matches before a final line break, and a quoted key "1-1-login\n" passed for a story.
EPIC_KEY_RE = re.compile(rf"^epic-{_N}\Z")
RETRO_KEY_RE = re.compile(rf"^epic-{_N}-retrospective\Z")
STORY_KEY_RE = re.compile(rf"^{_N}-{_N}([a-z]?)-([a-z0-9][a-z0-9-]*)\Z")
SHORT_KEY_RE = re.compile(rf"^{_N}-{_N}([a-z]?)\Z")
