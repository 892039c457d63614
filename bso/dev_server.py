"""The arguments BSO starts the embedded Temporal dev server (`temporal server start-dev`) with: one list for
`bso server`, `make server`, the demo, the benchmark, the crash trials and the tests.

The dev server has one history shard, and the history service reads a shard's transfer queue (which hands
new workflow and activity tasks to matching) at most `history.transferProcessorMaxPollRPS` times a second,
20 by default. A workflow whose activity had just completed therefore waited ~40 ms for its next workflow
task to be handed out, on every step of every story (a lone workflow of no-op activities: 37-40 ms between
a workflow task's scheduling and its start; 2 ms with the limit raised). A busy production cluster spreads
workflows over many shards and barely sees the limit; a one-shard dev server sees it on every step.

Its SQLite file runs in write-ahead-log mode. SQLite's default (a rollback journal) writes a journal file and
the database and fsyncs both for every commit, and the server commits several times per workflow step: the
same sprint of 1,000 stories ran at 30 dispatches/s with it, 37-42 in WAL mode (2026-11-27, `bench.run`).
`synchronous=full` fsyncs the log on every commit, so a committed step survives a power cut as with the
default (`normal` would be faster still, 42-46/s, but may lose the last commits to one). WAL needs the file
on a local disk (it shares memory through `<db>-shm`), and keeps `<db>-wal` beside it: copy all three.
"""

from __future__ import annotations

from temporalio.common import SearchAttributeIndexedValueType

from bso.constants import SEARCH_ATTRIBUTES

DYNAMIC_CONFIG: dict[str, int] = {"history.transferProcessorMaxPollRPS": 1000}
SQLITE_PRAGMAS: dict[str, str] = {"journal_mode": "wal", "synchronous": "full"}

SEARCH_ATTRIBUTE_TYPE_NAMES = {
    SearchAttributeIndexedValueType.TEXT: "Text",
    SearchAttributeIndexedValueType.KEYWORD: "Keyword",
    SearchAttributeIndexedValueType.INT: "Int",
    SearchAttributeIndexedValueType.DOUBLE: "Double",
    SearchAttributeIndexedValueType.BOOL: "Bool",
    SearchAttributeIndexedValueType.DATETIME: "Datetime",
    SearchAttributeIndexedValueType.KEYWORD_LIST: "KeywordList",
}


def dynamic_config_args() -> list[str]:
    """`--dynamic-config-value key=value` for each of DYNAMIC_CONFIG (values are JSON)."""
    return [arg for key, value in DYNAMIC_CONFIG.items() for arg in ("--dynamic-config-value", f"{key}={value}")]


def dev_server_args() -> list[str]:
    """BSO's search attributes, registered at start, the dynamic config and the SQLite pragmas above (for a
    server on a database file)."""
    args: list[str] = []
    for key in SEARCH_ATTRIBUTES:
        args += ["--search-attribute", f"{key.name}={SEARCH_ATTRIBUTE_TYPE_NAMES[key.indexed_value_type]}"]
    for pragma, value in SQLITE_PRAGMAS.items():
        args += ["--sqlite-pragma", f"{pragma}={value}"]
    return args + dynamic_config_args()
