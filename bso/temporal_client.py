"""Connecting to Temporal the same way everywhere (worker, demo, CLI, tests)."""

from __future__ import annotations

import os

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode

from bso.constants import SEARCH_ATTRIBUTES

DEFAULT_ADDRESS = "localhost:7233"
DEFAULT_NAMESPACE = "default"


def address_from_env() -> str:
    return os.environ.get("TEMPORAL_ADDRESS") or DEFAULT_ADDRESS


def namespace_from_env() -> str:
    return os.environ.get("TEMPORAL_NAMESPACE") or DEFAULT_NAMESPACE


async def connect(address: str | None = None, namespace: str | None = None) -> Client:
    return await Client.connect(
        address or address_from_env(),
        namespace=namespace or namespace_from_env(),
        data_converter=pydantic_data_converter,
    )


async def ensure_search_attributes(client: Client) -> list[str]:
    """Register BSO's search attributes on the server if missing; returns the names added."""
    try:
        existing = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=client.namespace)
        )
        known = set(existing.custom_attributes) | set(existing.system_attributes)
    except RPCError as err:
        if err.status != RPCStatusCode.UNIMPLEMENTED:  # the time-skipping test server cannot list
            raise
        known = set()
    missing = {
        key.name: IndexedValueType.ValueType(int(key.indexed_value_type))
        for key in SEARCH_ATTRIBUTES
        if key.name not in known
    }
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing)
        )
    return sorted(missing)
