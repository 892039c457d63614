"""bench/profile.py: py-spy's collapsed stacks summed into the functions that take the worker's CPU."""

from __future__ import annotations

from bench.profile import Hotspot, hotspots

RAW = """\
thread (1): MainThread;<module> (workers/main.py:10);run (asyncio/runners.py:118);activate (x/_workflow.py:5) 6
thread (1): MainThread;<module> (workers/main.py:10);run (asyncio/runners.py:118);_write (a/status_file.py:7) 3
thread (2): asyncio_0;_worker (concurrent/futures/thread.py:81);_write (a/status_file.py:9) 1
thread (1): MainThread;<module> (workers/main.py:10);f (m.py:1);f (m.py:2);f (m.py:3) 2
not a stack line
"""


def test_samples_are_summed_per_function_whatever_the_line_and_thread():
    total, top = hotspots(RAW.splitlines())
    assert total == 12
    by_name = {h.function: h for h in top}
    # On the stack in 11 samples of 12; running itself in none.
    assert by_name["<module> (workers/main.py)"] == Hotspot("<module> (workers/main.py)", 0.917, 0.0)
    # Two lines of one function, in two threads: one function.
    assert by_name["_write (a/status_file.py)"] == Hotspot("_write (a/status_file.py)", 0.333, 0.333)
    # A recursion counts once per sample on the stack.
    assert by_name["f (m.py)"].inclusive == round(2 / 12, 3)
    assert not any(h.function.startswith("thread (") for h in top)
    assert top[0].function == "<module> (workers/main.py)"  # the largest share first


def test_the_limit_keeps_the_largest_shares():
    _, top = hotspots(RAW.splitlines(), limit=2)
    assert [h.function for h in top] == ["<module> (workers/main.py)", "run (asyncio/runners.py)"]


def test_ranked_by_the_time_a_function_ran_itself():
    _, top = hotspots(RAW.splitlines(), limit=2, by="own")
    assert [(h.function, h.own) for h in top] == [("activate (x/_workflow.py)", 0.5), ("_write (a/status_file.py)", 0.333)]


def test_no_samples_no_hotspots():
    assert hotspots([]) == (0, [])
