"""Where a worker process spends its CPU: py-spy samples the thread that holds the GIL (`--gil`), so idle waits
(polls, fsyncs in threads) do not count. The benchmark takes one with `--profile`, of a sprint of its own:

    .venv/bin/python -m bench.run --sizes 1000 --repeat 1 --profile
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SAMPLES_PER_SECOND = 100
_LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")
_FRAME_LINE = re.compile(r":\d+\)$")  # `fn (file.py:123)`: the line number apart, one function is one frame


@dataclass(frozen=True)
class Hotspot:
    function: str  # `name (file)`
    inclusive: float  # share of the samples with the function on the stack
    own: float  # share of the samples with the function running itself


def py_spy() -> str:
    """The py-spy of this environment (`pip install py-spy`, in the dev extras)."""
    found = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if found is None:
        raise SystemExit("py-spy not found: `.venv/bin/pip install py-spy` (it is in the dev extras)")
    return found


def hotspots(raw: Iterable[str], limit: int = 25, by: str = "inclusive") -> tuple[int, list[Hotspot]]:
    """py-spy's raw (collapsed) output, `frame;frame;... count` per line: the number of samples, and the
    functions with the largest shares, on the stack (`by="inclusive"`) or running themselves (`by="own"`). A
    thread's name (`thread (N): name`) is not a function."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in raw:
        match = _LINE.match(line.rstrip("\n"))
        if match is None:
            continue
        count = int(match["count"])
        frames = [_FRAME_LINE.sub(")", f) for f in match["stack"].split(";") if f and not f.startswith("thread (")]
        if not frames:
            continue
        total += count
        for frame in dict.fromkeys(frames):  # once per sample, however deep it recurses
            inclusive[frame] += count
        own[frames[-1]] += count
    ranked = (inclusive if by == "inclusive" else own).most_common(limit)
    return total, [Hotspot(f, round(inclusive[f] / total, 3), round(own[f] / total, 3)) for f, _ in ranked]


class Profile:
    """py-spy recording a process until `stop()`; the samples then go through `hotspots`."""

    def __init__(self, pid: int, output: Path) -> None:
        self.output = output
        self.proc = subprocess.Popen(
            [py_spy(), "record", "-p", str(pid), "-o", str(output), "--format", "raw",
             "-r", str(SAMPLES_PER_SECOND), "--nonblocking", "--gil"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip

    def stop(self) -> list[str]:
        """The samples, in py-spy's raw format (for `hotspots`)."""
        self.proc.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
        _, err = self.proc.communicate(timeout=60)
        if not self.output.exists():
            raise RuntimeError(f"py-spy wrote no profile: {err.decode(errors='replace').strip()[-500:]}")
        return self.output.read_text().splitlines()
