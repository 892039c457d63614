"""The e2e-live resident's protocol (BROWSER_REQUEST / BROWSER_RESULT), pure.

Operations: navigate, click, type, screenshot, read_dom, check_element, against the project's app (base URL
from the config knob `e2e_live_base_url`; a relative `url` is joined to it). Each request is self-contained:
the browser opens `url` (or the base URL), then performs the operation.
"""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urljoin, urlparse

from pydantic import BaseModel, ConfigDict, Field

Operation = Literal["navigate", "click", "type", "screenshot", "read_dom", "check_element"]
BrowserStatus = Literal[
    "success", "no_browser_tool", "invalid_request", "element_not_found", "timeout", "browser_error"
]
NEEDS_SELECTOR = ("click", "type", "check_element")
MAX_DOM_CHARS = 20_000


class BrowserRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    msg_type: Literal["BROWSER_REQUEST"] = "BROWSER_REQUEST"
    request_id: str = Field(min_length=1, max_length=200)
    operation: str  # checked by `problem`, so that a bad one answers invalid_request
    url: str | None = None
    selector: str | None = None
    input_value: str | None = None
    screenshot_path: str | None = None  # relative to the project root
    timeout_ms: int = Field(10_000, gt=0, le=120_000)
    report_to: str | None = None  # a workflow id to signal BROWSER_RESULT to (agents use the update)
    priority: Literal["critical", "high", "normal", "low"] | None = None  # message-schemas: the browser activity's Temporal priority


class BrowserResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    msg_type: Literal["BROWSER_RESULT"] = "BROWSER_RESULT"
    request_id: str
    status: BrowserStatus
    result_data: dict[str, Any] = Field(default_factory=dict)
    screenshot_path: str | None = None
    error: str | None = None


def target_url(request: BrowserRequest, base_url: str | None) -> str | None:
    if request.url and urlparse(request.url).scheme in ("http", "https"):
        return request.url
    if base_url:
        return urljoin(base_url, request.url or "")
    return None


def problem(request: BrowserRequest, base_url: str | None) -> str | None:
    """Why the request cannot be performed (invalid_request), or None."""
    if request.operation not in ("navigate", "click", "type", "screenshot", "read_dom", "check_element"):
        return f"unknown operation {request.operation!r}"
    if target_url(request, base_url) is None:
        return "no url, and no e2e_live_base_url configured"
    if request.operation in NEEDS_SELECTOR and not request.selector:
        return f"{request.operation} needs a selector"
    if request.operation == "type" and request.input_value is None:
        return "type needs an input_value"
    if request.operation == "screenshot" and not request.screenshot_path:
        return "screenshot needs a screenshot_path"
    return None
