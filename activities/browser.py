"""The e2e-live resident's activity: one BROWSER_REQUEST in a real headless Chromium driven by Playwright.

The browser is the system's Chromium (`BSO_CHROMIUM`, else `chromium`, `chromium-browser`, `google-chrome` on
PATH); nothing is downloaded at run time. No browser or no Playwright: `no_browser_tool`."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pydantic import BaseModel, ConfigDict
from temporalio import activity

from bso.browser import MAX_DOM_CHARS, BrowserRequest, BrowserResult, problem, target_url
from bso.sprint_status import resolve_inside


class BrowseInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project_root: str
    request: BrowserRequest
    base_url: str | None = None


def find_chromium() -> str | None:
    configured = os.environ.get("BSO_CHROMIUM")
    if configured:
        return configured if os.path.exists(configured) else None
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@activity.defn
async def browse(inp: BrowseInput) -> BrowserResult:
    return await perform(inp)


async def perform(inp: BrowseInput) -> BrowserResult:
    req = inp.request
    result = {"request_id": req.request_id}
    why = problem(req, inp.base_url)
    if why is not None:
        return BrowserResult(**result, status="invalid_request", error=why)
    shot: Path | None = None
    if req.screenshot_path:
        try:
            shot = Path(resolve_inside(inp.project_root, req.screenshot_path))
        except Exception as err:  # noqa: BLE001 - outside the project, or unsafe
            return BrowserResult(**result, status="invalid_request", error=f"screenshot_path: {err}")
    chromium = find_chromium()
    try:
        from playwright.async_api import Error as PlaywrightError
        from playwright.async_api import TimeoutError as PlaywrightTimeout
        from playwright.async_api import async_playwright
    except ImportError:
        return BrowserResult(**result, status="no_browser_tool", error="playwright is not installed")
    if chromium is None:
        return BrowserResult(**result, status="no_browser_tool", error="no chromium on this machine")
    url = target_url(req, inp.base_url)
    stage = "navigate"
    try:
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            try:
                page = await browser.new_page()
                page.set_default_timeout(req.timeout_ms)
                await page.goto(url, timeout=req.timeout_ms)
                data: dict = {"url": page.url, "page_title": await page.title()}
                stage = "element"
                if req.operation in ("click", "type", "check_element"):
                    element = await page.wait_for_selector(req.selector, state="attached", timeout=req.timeout_ms)
                    if req.operation == "click":
                        await element.click(timeout=req.timeout_ms)
                    elif req.operation == "type":
                        await element.fill(req.input_value or "", timeout=req.timeout_ms)
                        data["value"] = await element.input_value()
                    data["visible"] = await element.is_visible()
                    data["text"] = (await element.inner_text())[:2000]
                elif req.operation == "read_dom":
                    if req.selector:
                        element = await page.wait_for_selector(req.selector, state="attached", timeout=req.timeout_ms)
                        data["html"] = (await element.inner_html())[:MAX_DOM_CHARS]
                    else:
                        data["html"] = (await page.content())[:MAX_DOM_CHARS]
                stage = "screenshot"
                if shot is not None:
                    shot.parent.mkdir(parents=True, exist_ok=True)
                    await page.screenshot(path=str(shot))
                data["url"] = page.url
                return BrowserResult(**result, status="success", result_data=data, screenshot_path=req.screenshot_path)
            finally:
                await browser.close()
    except PlaywrightTimeout as err:
        status = "element_not_found" if stage == "element" else "timeout"
        return BrowserResult(**result, status=status, error=str(err).splitlines()[0])
    except PlaywrightError as err:
        return BrowserResult(**result, status="browser_error", error=str(err).splitlines()[0])
