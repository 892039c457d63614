"""Reading what a coding-agent CLI said: its AGENT_COMPLETE and its token use (pure).

The agent is asked to write AGENT_COMPLETE as JSON to `$BSO_RESULT_FILE`. Where it did not, the CLI's
own final JSON output is searched: Claude Code's `result` text, Codex's last `agent_message`, Gemini's
`response`, or any JSON object in plain text that carries `"status"`, except the prompt's own (its example
AGENT_COMPLETE, which a CLI that echoes its prompt prints).

Token use comes from the CLI's JSON: Claude Code (`usage.input_tokens`, `output_tokens`,
`cache_creation_input_tokens`, `cache_read_input_tokens`), Codex (`turn.completed` events:
`usage.input_tokens` of which `cached_input_tokens` were cache reads, `output_tokens`), Gemini
(`stats.models.*.tokens`: `prompt` of which `cached`, `candidates`), OpenCode (`tokens.input/output/
cache.read/cache.write`).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from bso.messages import MAX_FINDINGS, MAX_SUMMARY_CHARS


@dataclass(frozen=True)
class TokenUse:
    input: int = 0  # uncached input
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0

    def __add__(self, other: TokenUse) -> TokenUse:
        return TokenUse(
            self.input + other.input,
            self.output + other.output,
            self.cache_read + other.cache_read,
            self.cache_write + other.cache_write,
        )

    def weighted(self, cache_read_weight: float, cache_write_weight: float = 1.0) -> int:
        """What feeds the token budget: cache reads count at `cache_read_weight`."""
        return int(
            round(self.input + self.output + cache_read_weight * self.cache_read + cache_write_weight * self.cache_write)
        )


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _parsed_or_not_json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
        return _NOT_JSON


_NOT_JSON = object()


def json_documents(text: str) -> list[Any]:
    """The JSON in a CLI's stdout: the whole text as one document, else one document per line."""
    text = text.strip()
    if not text:
        return []
    if (whole := _parsed_or_not_json(text)) is not _NOT_JSON:
        return [whole]
    return list(line_documents(text.split("\n")))


def line_documents(lines: Iterable[str]) -> Iterator[Any]:
    """The JSON documents of a JSON-lines CLI, one per line. A line ends at `\n` or `\r` (a spinner redrawn
    before an event), not at other Unicode line breaks: Node's JSON holds U+2028 raw in its strings."""
    for chunk in lines:
        for line in chunk.split("\r"):
            line = line.strip()
            if line.startswith(("{", "[")) and (doc := _parsed_or_not_json(line)) is not _NOT_JSON:
                yield doc


def _usage_of(doc: dict[str, Any]) -> TokenUse:
    usage = doc.get("usage")
    if isinstance(usage, dict) and ("input_tokens" in usage or "output_tokens" in usage):
        cached = _int(usage.get("cached_input_tokens"))
        if cached:  # Codex: input_tokens includes the cached part
            return TokenUse(
                input=max(_int(usage.get("input_tokens")) - cached, 0),
                output=_int(usage.get("output_tokens")),
                cache_read=cached,
            )
        return TokenUse(
            input=_int(usage.get("input_tokens")),
            output=_int(usage.get("output_tokens")),
            cache_read=_int(usage.get("cache_read_input_tokens")),
            cache_write=_int(usage.get("cache_creation_input_tokens")),
        )
    stats = doc.get("stats")
    if isinstance(stats, dict) and isinstance(stats.get("models"), dict):  # Gemini CLI
        total = TokenUse()
        for model in stats["models"].values():
            tokens = model.get("tokens") if isinstance(model, dict) else None
            if isinstance(tokens, dict):
                cached = _int(tokens.get("cached"))
                total += TokenUse(
                    input=max(_int(tokens.get("prompt")) - cached, 0),
                    output=_int(tokens.get("candidates")),
                    cache_read=cached,
                )
        return total
    part = doc.get("part") if isinstance(doc.get("part"), dict) else doc
    tokens = part.get("tokens")
    if isinstance(tokens, dict) and "input" in tokens:  # OpenCode step-finish
        cache = tokens.get("cache") if isinstance(tokens.get("cache"), dict) else {}
        return TokenUse(
            input=_int(tokens.get("input")),
            output=_int(tokens.get("output")),
            cache_read=_int(cache.get("read")),
            cache_write=_int(cache.get("write")),
        )
    return TokenUse()


# The end of a plain-text answer searched for an AGENT_COMPLETE (an aider-style footer may follow it), and how
# many `{` of it are tried as an object's start.
TEXT_TAIL_CHARS = 64_000
_MAX_OBJECT_STARTS = 2_000


def _objects_with_status(text: str, starts: Iterable[int]) -> Iterator[tuple[dict[str, Any], int]]:
    """Each JSON object with a `status` that starts at one of `starts` in `text`, and where it ends."""
    decoder = json.JSONDecoder()
    for start in starts:
        try:
            obj, end = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict) and "status" in obj:
            yield obj, end


def prompt_examples(prompt: str) -> list[dict[str, Any]]:
    """The objects with a `status` the agent's prompt itself holds (its example AGENT_COMPLETE, JSON quoted from
    a failed verification): a plain-text CLI that echoes its prompt prints them too, and they are never its
    answer (the example, taken for one, answered `success` for an agent that said nothing)."""
    # one entry per occurrence: an output that holds one more often than its prompt gave it as its own too
    return [obj for obj, _ in _objects_with_status(prompt, (m.start() for m in re.finditer(r"\{", prompt)))]


def _complete_in_text(text: str, examples: Sequence[dict[str, Any]] = ()) -> tuple[dict[str, Any] | None, bool]:
    """The last JSON object in free text that has a `status`: fenced or not, on one line or pretty-printed over
    many, with text after it. Of objects one inside another, the outermost (a finding may carry a `status`).
    The prompt's own objects (`examples`) are passed over, as often as the prompt holds them and first in the
    text (an echo of it); one the text holds more often is the agent's too (its answer may be a template's
    minimal example). Also whether one was passed over."""
    echoes_left = Counter(_key(example) for example in examples)
    found: tuple[dict[str, Any], int] | None = None  # the object and where it ends
    echoed = False
    starts = [m.start() for m in re.finditer(r"\{", text)][-_MAX_OBJECT_STARTS:]
    for obj, end in _objects_with_status(text, starts):
        if echoes_left[key := _key(obj)] > 0:
            echoes_left[key] -= 1
            echoed = True
        elif found is None or end > found[1]:
            found = (obj, end)  # the one ending last: around the ones inside it, after the ones before it
    return (found[0] if found else None), echoed


def _key(obj: dict[str, Any]) -> str:
    """An object as a key: equal objects, equal keys (their fields in any order)."""
    return json.dumps(obj, sort_keys=True, default=str)


def _answer_text(doc: dict[str, Any]) -> str | None:
    """The agent's answer text a CLI's JSON document carries, if any."""
    text = None
    if isinstance(doc.get("result"), str):  # Claude Code
        text = doc["result"]
    elif isinstance(doc.get("response"), str):  # Gemini
        text = doc["response"]
    item = doc.get("item") if isinstance(doc.get("item"), dict) else None
    if item and item.get("type") == "agent_message" and isinstance(item.get("text"), str):  # Codex
        text = item["text"]
    part = doc.get("part") if isinstance(doc.get("part"), dict) else None
    if part and part.get("type") == "text" and isinstance(part.get("text"), str):  # OpenCode
        text = part["text"]
    return text


def _cli_error(doc: dict[str, Any]) -> str | None:
    """Claude Code's `is_error` / a `type: error` event: the CLI itself says the run failed."""
    if doc.get("is_error") is True:
        return str(doc.get("result") or doc.get("subtype") or "CLI reported an error")[:500]
    if doc.get("type") == "error":
        return str(doc.get("message") or doc)[:500]
    return None


@dataclass(frozen=True)
class CliOutput:
    """What BSO takes from a CLI's output."""

    complete: dict[str, Any] | None = None  # the agent's own AGENT_COMPLETE, if it gave one
    echoed_prompt: bool = False  # the output repeats an AGENT_COMPLETE of the prompt's (its example), passed over
    tokens: TokenUse = TokenUse()  # summed over every document (Codex and OpenCode report per turn/step)
    cli_error: str | None = None  # the first error the CLI itself reported
    documents: int = field(default=0, compare=False)  # how many JSON documents the output held (not what it says)


def read_cli_output(documents: Iterable[Any], text_tail: str, examples: Sequence[dict[str, Any]] = ()) -> CliOutput:
    """One pass over the CLI's JSON documents (a JSON-lines CLI's may run to hundreds of MB: none is kept), then,
    unless one of them is an AGENT_COMPLETE, the agent's last answer text searched for one: the last document's
    text, else `text_tail` (the output's last TEXT_TAIL_CHARS). The prompt's own objects (`examples`,
    prompt_examples) are no answer."""
    tokens = TokenUse()
    complete: dict[str, Any] | None = None
    echoed = False
    text: str | None = None
    error: str | None = None
    count = 0
    for count, doc in enumerate(documents, 1):
        if not isinstance(doc, dict):
            continue
        tokens += _usage_of(doc)
        error = error or _cli_error(doc)
        if doc.get("msg_type") == "AGENT_COMPLETE":
            if doc in examples:
                echoed = True
            else:
                complete = doc
        text = found if (found := _answer_text(doc)) is not None else text
    if complete is None:
        # A CLI's own answer text (Claude's `result`, Codex's agent_message, ...) is the agent's words, never an
        # echo of its prompt: an answer there equal to the prompt's example (a template's minimal one) is its own.
        complete, seen = _complete_in_text(text, ()) if text is not None else _complete_in_text(text_tail, examples)
        echoed = echoed or seen
    return CliOutput(complete, echoed, tokens, error, count)


def cli_output(stdout: str, examples: Sequence[dict[str, Any]] = ()) -> CliOutput:
    """read_cli_output of an output held whole."""
    return read_cli_output(json_documents(stdout), stdout.strip()[-TEXT_TAIL_CHARS:], examples)


# What real agents write for a severity BSO names otherwise.
_SEVERITY_WORDS = {
    "INFO": "LOW", "MINOR": "LOW", "NIT": "LOW", "TRIVIAL": "LOW", "SUGGESTION": "LOW", "WARNING": "MEDIUM",
    "MODERATE": "MEDIUM", "MAJOR": "HIGH", "ERROR": "HIGH", "BLOCKER": "CRITICAL", "BLOCKING": "CRITICAL",
}
_LEADING_NUMBER = re.compile(r"\s*(\d{1,9})")


def _cut(value: Any, limit: int) -> Any:
    return value[: limit - 1] + "…" if isinstance(value, str) and len(value) > limit else value


def _finding(item: Any) -> Any:
    if isinstance(item, str):  # a finding written as a sentence: its weight is not said
        return {"severity": "MEDIUM", "summary": _cut(item, MAX_SUMMARY_CHARS) or "(empty)"}
    if not isinstance(item, dict):
        return item
    item = dict(item)
    if isinstance(item.get("severity"), str):
        word = item["severity"].strip().upper()
        item["severity"] = _SEVERITY_WORDS.get(word, word)
    item["summary"] = _cut(item.get("summary"), MAX_SUMMARY_CHARS)
    if isinstance(item.get("line"), str) and (m := _LEADING_NUMBER.match(item["line"])):  # "12-15", "L12"
        item["line"] = int(m.group(1))
    elif isinstance(item.get("line"), str):
        item["line"] = None
    return item


def lenient_answer(raw: dict[str, Any]) -> dict[str, Any]:
    """An AGENT_COMPLETE as real agents write it, brought to BSO's shape before it is validated: a summary or an
    error past MAX_SUMMARY_CHARS cut (BSO keeps 400 characters of a summary anyway), `SUCCESS` or `Passed` in
    lower case, `INFO` or `major` severities as BSO names them, findings written as sentences, `"line": "12-15"`,
    past MAX_FINDINGS findings the most severe kept, a fractional score rounded. What stays wrong (a status that is
    no status) is still refused, naming the field."""
    out = dict(raw)
    for key in ("summary", "error"):
        out[key] = "" if key == "summary" and out.get(key) is None else _cut(out.get(key), MAX_SUMMARY_CHARS)
    if out.get("error") is None:
        out.pop("error", None)
    for key in ("status", "verdict"):
        if isinstance(out.get(key), str):
            out[key] = out[key].strip().lower()
    if isinstance(out.get("findings"), list):
        findings = [_finding(f) for f in out["findings"]]
        if len(findings) > MAX_FINDINGS:
            rank = {"CRITICAL": 0, "HIGH": 1, "MEDIUM": 2, "LOW": 3}
            findings = sorted(
                findings, key=lambda f: rank.get(f.get("severity"), 4) if isinstance(f, dict) else 4
            )[:MAX_FINDINGS]
        out["findings"] = findings
    if isinstance(out.get("score"), float) and math.isfinite(out["score"]):  # (Infinity stays refused)
        out["score"] = round(out["score"])
    for key in ("blocking_issues", "feedback"):
        if isinstance(out.get(key), list) and len(out[key]) > MAX_FINDINGS:
            out[key] = out[key][:MAX_FINDINGS]
    return out
