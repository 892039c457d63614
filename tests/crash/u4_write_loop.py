"""Child process of test_u4_torn_writes: toggles one story between two values with U4 writes, forever.
Prints `ready` once the first write is done; killed with -9 by the test."""

from __future__ import annotations

import sys

from activities.status_file import _write_sync
from bso.models import StatusWriteInput

root, status_file, key, a, b = sys.argv[1:6]
current = a
first = True
while True:
    new = b if current == a else a
    result = _write_sync(StatusWriteInput(project_root=root, status_file=status_file, story_key=key, expected=current, new=new))
    current = result.current
    if first:
        print("ready", flush=True)
        first = False
