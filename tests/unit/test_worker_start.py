"""A worker started while the Temporal server is (re)starting waits for it (workers.main._connect_patiently)."""

from __future__ import annotations

import pytest
from temporalio.service import RPCError, RPCStatusCode

import workers.main


class _Server:
    """The answers of a server that comes up after `failures`: each a connect refused, or a first call that fails."""

    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.connects = 0

    async def connect(self, runtime=None):
        self.connects += 1
        if self.failures and isinstance(self.failures[0], RuntimeError):
            raise self.failures.pop(0)
        return "client"

    async def ensure_search_attributes(self, client):
        if self.failures:
            raise self.failures.pop(0)
        return ["BsoSessionId"]


def _patched(monkeypatch: pytest.MonkeyPatch, server: _Server) -> None:
    monkeypatch.setattr(workers.main, "connect", server.connect)
    monkeypatch.setattr(workers.main, "ensure_search_attributes", server.ensure_search_attributes)

    async def no_wait(_seconds: float) -> None:
        return None

    monkeypatch.setattr(workers.main.asyncio, "sleep", no_wait)


async def test_a_server_killed_during_the_first_call_is_waited_for(monkeypatch):
    """A crash trial killed the server while a worker starting up asked it for its search attributes: the worker
    died of `RPCError: transport error`, and the sprint stood still."""
    server = _Server([
        RuntimeError("Failed client connect: connection refused"),
        RPCError("transport error", RPCStatusCode.UNKNOWN, b""),
        RPCError("Frontend is not healthy yet", RPCStatusCode.UNAVAILABLE, b""),
    ])
    _patched(monkeypatch, server)
    assert await workers.main._connect_patiently(None) == ("client", ["BsoSessionId"])
    assert server.connects == 4 and server.failures == []  # a fresh connect after each failure


async def test_a_refusal_that_no_wait_mends_is_raised_at_once(monkeypatch):
    server = _Server([RPCError("no permission", RPCStatusCode.PERMISSION_DENIED, b""), RuntimeError("never reached")])
    _patched(monkeypatch, server)
    with pytest.raises(RPCError, match="no permission"):
        await workers.main._connect_patiently(None)
    assert server.connects == 1


async def test_the_wait_has_an_end_that_names_the_server_of_the_profile_and_the_last_error(monkeypatch, tmp_path):
    """It named TEMPORAL_ADDRESS's server (localhost:7233 without one) where a profile file said another."""
    profile = tmp_path / "temporal.toml"
    profile.write_text('[profile.default]\naddress = "127.0.0.1:1"\nnamespace = "myns"\n')
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(profile))
    for name in ("TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TEMPORAL_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    server = _Server([RuntimeError("Failed client connect: tls handshake eof")] * 1000)
    _patched(monkeypatch, server)
    monkeypatch.setattr(workers.main, "CONNECT_PATIENCE_SECONDS", 0.0)
    with pytest.raises(workers.main.ServerUnreachable) as told:
        await workers.main._connect_patiently(None)
    assert str(told.value).startswith(
        "cannot reach the Temporal server at 127.0.0.1:1 (namespace myns) after 0 s "
        "(last: Failed client connect: tls handshake eof): start it"
    ), told.value
