"""The data converter every BSO client and worker uses: Temporal's pydantic converter, lenient with one kind of
JSON it refuses.

JSON may carry a lone UTF-16 surrogate (`"\\ud800"`, what a JavaScript agent writes when it cuts a string between
the two halves of an emoji): valid JSON, but not valid Unicode, so pydantic's parser refuses the whole payload.
For a signal the SDK then drops it with only a line in the worker's log: an agent's AGENT_COMPLETE was lost
without a trace in the sprint's status. Such a payload is read with Python's own parser instead, each lone
surrogate replaced by U+FFFD, and validated as usual.

JSON no parser here reads (nested deeper than pydantic's parser goes, a number of more than 4,300 digits) was
dropped the same way. For a handler that takes Any (every BSO signal and update) it is handed on as an
UnreadablePayload, which workflows.inbound_guard records as rejected; for a workflow's input, which
workflows.inputs refuses in one line (it failed the workflow with pydantic's report of the whole union)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, get_args

from pydantic import JsonValue, TypeAdapter, ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter
from temporalio.converter import CompositePayloadConverter, DataConverter, DefaultPayloadConverter, JSONPlainPayloadConverter

from bso.messages import map_strings


class _RescuedDict(dict):
    """A payload read past its lone surrogates (workflows.inbound_guard tells it apart: PATCH_RESCUED_SIGNALS)."""


class _RescuedList(list):
    pass


class _RescuedStr(str):
    pass


_RESCUED = {dict: _RescuedDict, list: _RescuedList, str: _RescuedStr}


def is_rescued(value: Any) -> bool:
    """Was `value` read past a lone surrogate by this converter (a signal's input, decoded without a type)?"""
    return isinstance(value, _RescuedDict | _RescuedList | _RescuedStr)


class UnreadablePayload:
    """A signal's or update's input no parser could read, with the parser's words."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"<unreadable input: {self.reason}>"


def _without_lone_surrogate(text: str) -> str:
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _bad_unicode(err: ValidationError) -> bool:
    """Refused for a lone surrogate only (not, say, for a NaN, which Python's parser would take too)."""
    return any(
        e["type"] == "json_invalid" and ("unicode code point" in e["msg"] or "hex escape" in e["msg"]) for e in err.errors()
    )


def _takes_any_json(type_hint: Any) -> bool:
    """A handler that takes Any (BSO's signals and updates), or a workflow input that keeps JSON fitting no model
    (workflows.inputs.RawInput): what it cannot read reaches it as an UnreadablePayload, to refuse in one line."""
    return type_hint is Any or JsonValue in get_args(type_hint)


class LenientJSONPayloadConverter(PydanticJSONPlainPayloadConverter):
    def from_payload(self, payload: Payload, type_hint: type | None = None) -> Any:
        try:
            return super().from_payload(payload, type_hint)
        except ValidationError as err:
            if not _bad_unicode(err):
                if _takes_any_json(type_hint) and all(e["type"] == "json_invalid" for e in err.errors()):
                    return UnreadablePayload(err.errors()[0]["msg"])
                raise
            try:
                value = json.loads(payload.data)  # Python's parser takes lone surrogates
            except ValueError:
                raise err from None
            value = TypeAdapter(type_hint if type_hint is not None else Any).validate_python(map_strings(value, _without_lone_surrogate))
            return _RESCUED[type(value)](value) if type(value) in _RESCUED else value  # (BSO's signals take Any)


class BsoPayloadConverter(CompositePayloadConverter):
    def __init__(self) -> None:
        json_converter = LenientJSONPayloadConverter()
        super().__init__(
            *(
                json_converter if isinstance(c, JSONPlainPayloadConverter) else c
                for c in DefaultPayloadConverter.default_encoding_payload_converters
            )
        )

    def from_payloads(self, payloads: Sequence[Payload], type_hints: list[type] | None = None) -> list[Any]:
        """A payload of an encoding BSO does not read (none, `text/yaml`, `json/protobuf`: another client's
        converter, `--input-meta encoding=...`) for a handler or input that takes any JSON is an UnreadablePayload
        too: as a start input it failed the workflow task in a loop, as a signal it was dropped unrecorded."""
        hints: list[Any] = list(type_hints or [])
        values = []
        for index, payload in enumerate(payloads):
            hint = hints[index] if index < len(hints) else None
            try:
                values += super().from_payloads([payload], [hint] if hint is not None else None)
            except Exception as err:  # noqa: BLE001 - KeyError (unknown encoding) or the converter's own failure
                if not _takes_any_json(hint):
                    raise
                encoding = payload.metadata.get("encoding", b"").decode(errors="replace") or "none given"
                values.append(UnreadablePayload(f"payload encoding {encoding!r} not read ({err}); BSO reads json/plain"))
        return values


data_converter = DataConverter(payload_converter_class=BsoPayloadConverter)
