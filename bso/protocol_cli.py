"""`bso protocol`: the JSON Schema of every message, and validation of a message file.

Mounted by the main CLI as `bso protocol`; also runnable on its own:
`python -m bso.protocol_cli schema --out schemas/` and `python -m bso.protocol_cli validate msg.json`.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from bso.dispatch import implausible_tokens
from bso.po_agent import with_read_time
from bso.messages import (
    MESSAGE_ADAPTER,
    MESSAGE_CLASSES,
    AgentComplete,
    DeliveryFailed,
    FieldError,
    ResponseTimeout,
    ValidationFailed,
    invalid_message,
    original_id,
    parse_message,
    validation_failed,
)

protocol_app = typer.Typer(help="The message protocol: JSON Schemas and validation.", no_args_is_help=True)

ERROR_SCHEMAS = {"error.delivery_failed": DeliveryFailed, "error.response_timeout": ResponseTimeout,
                 "error.validation_failed": ValidationFailed}


def all_schemas() -> dict[str, dict[str, Any]]:
    """Each message type's JSON Schema (by wire name), plus `messages` for the whole union."""
    schemas = {name: cls.model_json_schema(by_alias=True) for name, cls in MESSAGE_CLASSES.items()}
    schemas.update({name: cls.model_json_schema(by_alias=True) for name, cls in ERROR_SCHEMAS.items()})
    return schemas


@protocol_app.command()
def schema(
    out: Annotated[Path, typer.Option("--out", help="Directory for the schema files")] = Path("message-schemas"),
) -> None:
    """Write the JSON Schema of every message type (one file each) and an index.json."""
    out.mkdir(parents=True, exist_ok=True)
    index: dict[str, Any] = {"union": "messages.schema.json", "discriminator": "type", "types": {}}
    for name, body in all_schemas().items():
        filename = f"{name}.schema.json"
        (out / filename).write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
        index["types"][name] = {"file": filename, "description": body.get("description", "")}
    union = MESSAGE_ADAPTER.json_schema(by_alias=True)
    (out / "messages.schema.json").write_text(json.dumps(union, indent=2) + "\n", encoding="utf-8")
    (out / "index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    typer.echo(f"wrote {len(index['types'])} message schemas, the union and index.json to {out}")


def _load(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() in (".yaml", ".yml"):
        return YAML(typ="safe").load(text)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        if path.suffix.lower() == ".json":  # the JSON parser's words: the YAML parser's came on four lines
            raise ValueError(f"not valid JSON: {err}") from None
        return YAML(typ="safe").load(text)  # JSON is YAML; a .txt or extension-less YAML file works too


def _one_line(err: Exception) -> str:
    """A YAML parser's error on one line (its text spans several, with the offending line drawn)."""
    if isinstance(err, MarkedYAMLError):
        mark = err.problem_mark or err.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        return f"YAML error: {err.problem or err.context or type(err).__name__}{where}"
    return " ".join(str(err).split())


@protocol_app.command()
def validate(
    file: Annotated[Path, typer.Argument(help="A message file (JSON or YAML), envelope or a seed's native shape")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the error message as JSON")] = False,
    po_error: Annotated[bool, typer.Option("--po", help="Answer with Agent-PO's ERROR/INVALID_MESSAGE")] = False,
) -> None:
    """Check one message; print OK, or the validation_failed errors (field, error) and exit 1."""
    try:
        raw = _load(file)
    except (OSError, UnicodeDecodeError, YAMLError, ValueError) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else _one_line(err)  # not `[Errno 2] ...` again
        typer.echo(f"bso: error: cannot read {file}: {why}", err=True)  # as every `bso` error
        raise typer.Exit(2) from None
    # As the sprint reads an agent's answer: a missing timestamp is the time it is read.
    read = with_read_time(raw, datetime.now(UTC)) if isinstance(raw, dict) else raw
    try:
        message = parse_message(read)
    except ValidationError as err:
        if po_error:
            typer.echo(json.dumps(invalid_message(raw, err), indent=2))
        elif as_json:
            typer.echo(json.dumps(validation_failed(raw, err).to_seed(), indent=2))
        else:
            rendered = validation_failed(raw, err)
            typer.echo(f"INVALID {file}: validation_failed")
            for item in rendered.errors:
                typer.echo(f"  {item.field}: {item.error}")
        raise typer.Exit(1) from None
    # The batch's own refusals of an answer it can judge without its dispatch (bso.dispatch: one rule, its words).
    payload = getattr(message, "payload", None)
    refused = implausible_tokens(payload) if isinstance(payload, AgentComplete) else None
    if refused is not None:
        if po_error:
            typer.echo(json.dumps({"message_type": "ERROR",
                                   "error": {"code": "INVALID_MESSAGE", "message": refused.reason,
                                             "original_message_type": message.type},
                                   "action": "Please resubmit with a corrected tokens_used"}, indent=2))
        elif as_json:
            failed = ValidationFailed(original_message_id=original_id(raw),
                                      errors=[FieldError(field="tokens_used", error=refused.reason)])
            typer.echo(json.dumps(failed.to_seed(), indent=2))
        else:
            typer.echo(f"INVALID {file}: the batch refuses this answer (its dispatch stays open)")
            typer.echo(f"  {refused.reason}")
        raise typer.Exit(1)
    filled = " (no timestamp: BSO takes the time it reads the answer)" if read is not raw else ""
    typer.echo(f"OK {message.type} {message.id or ''}".rstrip() + filled)


if __name__ == "__main__":
    protocol_app()
