"""The chat page of `infer serve` (cli/serve/webui.py, cli/serve/static/).

In-process: the routes, their headers, `--no-webui`, the API key. In a real browser (Debian's headless
`chromium` through Playwright's Python package, never a downloaded browser) against a real `infer serve`
on the default model: text appears while the reply streams, Stop frees the sequence (/metrics), a
reload keeps the conversation, the sampler settings and the JSON schema reach the server, regenerate
and edit-and-resend, keyboard only, phone width, and hostile Markdown runs nothing. Screenshots at
desktop and phone width go to `artifacts/webui/` (or `$INFER_ARTIFACTS/webui/`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cli_process import ROOT, infer_cli, running_server
from fastapi.testclient import TestClient

from infer.cli.serve.app import AppOptions, create_app
from infer.cli.serve.launch import ServerProcess
from infer.engine.runtime.engine import Engine, EngineConfig, load_engine
from infer.profiles.settings import resolve_settings

pytest_plugins = ["conftest_synthetic"]

ARTIFACTS = Path(os.environ.get("INFER_ARTIFACTS", ROOT / "artifacts")) / "webui"
CHROMIUM = os.environ.get("INFER_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
STORY = "Write a long story about a dragon who learns to bake bread."


# -- in-process: routes and headers -----------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_engine(tiny_gguf: Path) -> Engine:
    return load_engine(tiny_gguf, EngineConfig(ctx_size=128, max_num_seqs=2))


def _client(engine: Engine, **options: Any) -> TestClient:
    # No `with`: the lifespan (the engine loop) is not needed to serve files.
    return TestClient(create_app(engine, resolve_settings({}, env={}), AppOptions("m", **options)))


def test_page_and_assets_are_served_with_a_strict_policy(tiny_engine: Engine) -> None:
    client = _client(tiny_engine)
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe" not in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    for asset in re.findall(r'(?:src|href)="(/webui/[^"]+)"', page.text):
        answer = client.get(asset)
        assert answer.status_code == 200 and answer.content, asset
    again = client.get("/", headers={"If-None-Match": page.headers["etag"]})
    assert again.status_code == 304 and not again.content
    assert client.get("/webui/app.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/webui/../webui.py").status_code == 404
    assert client.get("/webui/nothing.js").status_code == 404
    paths = client.get("/openapi.json").json()["paths"]
    assert "/" not in paths and not any(p.startswith("/webui") for p in paths)


def test_no_webui_leaves_slash_404_and_the_api_unchanged(tiny_engine: Engine) -> None:
    on, off = _client(tiny_engine), _client(tiny_engine, webui=False)
    assert off.get("/").status_code == 404 and off.get("/webui/app.js").status_code == 404
    for path in ("/health", "/metrics", "/v1/models", "/openapi.json"):
        assert on.get(path).status_code == off.get(path).status_code == 200, path
    assert on.get("/openapi.json").json() == off.get("/openapi.json").json()


def test_the_page_needs_no_api_key_but_the_api_still_does(tiny_engine: Engine) -> None:
    client = _client(tiny_engine, api_key="sesame")
    assert client.get("/").status_code == 200 and client.get("/webui/app.js").status_code == 200
    assert client.get("/v1/models").status_code == 401
    assert client.get("/metrics").status_code == 401
    assert _client(tiny_engine, api_key="sesame", webui=False).get("/").status_code == 401


def test_serve_help_lists_no_webui() -> None:
    done = infer_cli("serve", "--help")
    assert done.returncode == 0 and "--no-webui" in done.stdout


# -- in a real browser --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright's Python package is not installed (pip install playwright)")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium; or set INFER_CHROMIUM)")
    with sync_playwright() as playwright:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def server(default_model_path: Path) -> Iterator[ServerProcess]:
    with running_server(["--max-num-seqs", "4"]) as process:
        yield process


class Page:
    """A browser page on the server's chat page, failing the test on any script error."""

    def __init__(
        self, browser: Any, url: str, viewport: dict[str, int], *, enforce_csp: bool = False
    ) -> None:
        # bypass_csp: Playwright's waits evaluate strings, which the page's policy forbids. The
        # hostile-Markdown test thus checks the renderer alone, without the policy's second wall.
        self.context = browser.new_context(viewport=viewport, bypass_csp=not enforce_csp)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.console: list[str] = []
        self.page.on("console", lambda message: self.console.append(message.text))

        def on_dialog(dialog: Any) -> None:
            self.dialogs.append(dialog.message)
            dialog.dismiss()

        self.page.on("dialog", on_dialog)
        self.url = url
        self.page.goto(url)

    def settings(self, **values: str) -> None:
        if not self.page.is_visible("#settings"):
            self.page.click("#toggle-settings")
        for name, value in values.items():
            self.page.fill(f"#{name}", value)
        self.page.click("#toggle-settings")

    def wait_idle(self, timeout: float = 120) -> None:
        self.page.wait_for_selector("body:not(.busy)", timeout=timeout * 1000)

    def messages(self) -> list[tuple[str, str]]:
        return [
            (node.get_attribute("data-role"), node.query_selector(".content").inner_text())
            for node in self.page.query_selector_all("#messages .msg")
        ]

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / name
        self.page.screenshot(path=str(path), full_page=False)
        return path

    def close(self) -> None:
        self.context.close()
        assert not self.errors, self.errors


def _metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _wait_metric(url: str, name: str, want: float, timeout: float = 10, **labels: str) -> float:
    deadline = time.monotonic() + timeout
    value = _metric(url, name, **labels)
    while value != want and time.monotonic() < deadline:
        time.sleep(0.05)
        value = _metric(url, name, **labels)
    return value


@pytest.mark.real_model
@pytest.mark.slow
def test_streams_stops_frees_the_sequence_and_survives_a_reload(browser: Any, server: ServerProcess) -> None:
    url = server.wait_ready(5)
    tab = Page(browser, url, DESKTOP)
    page = tab.page
    cancelled = _metric(url, "infer:request_success_total", finished_reason="cancelled")
    generated = _metric(url, "infer:generation_tokens_total")
    tab.settings(seed="1", max_tokens="400", temperature="0.8")
    page.fill("#prompt", STORY)
    page.keyboard.press("Enter")
    reading = "() => ({busy: document.body.classList.contains('busy'), text: document.querySelector('.msg.streaming .content')?.textContent || ''})"  # noqa: E501
    page.wait_for_function(f"({reading})().text.length > 0", timeout=60_000)
    early = page.evaluate(reading)
    assert early["busy"] and early["text"], early  # text on the page while the reply still streams
    page.wait_for_function(f"({reading})().text.length > 60", timeout=60_000)
    assert page.is_visible("#stop") and not page.is_visible("#send")
    page.click("#stop")
    tab.wait_idle(30)
    stopped = page.inner_text(".msg.assistant .content")
    whole = page.text_content(".msg.assistant .content") or ""
    assert early["text"].strip()[:10] in whole and len(whole) > len(early["text"])
    assert "stopped" in page.inner_text(".msg.assistant .stats")
    # The server saw the disconnect: the sequence is gone and was counted as cancelled, short of 400.
    assert _wait_metric(url, "infer:num_requests_running", 0) == 0
    assert _wait_metric(url, "infer:request_success_total", cancelled + 1, finished_reason="cancelled") == (
        cancelled + 1
    )
    assert 0 < _metric(url, "infer:generation_tokens_total") - generated < 400
    assert httpx.get(f"{url}/health", timeout=30).json()["active_sequences"] == 0
    tab.screenshot("desktop.png")

    page.reload()
    page.wait_for_selector("#messages .msg.assistant")
    assert tab.messages() == [("user", STORY), ("assistant", stopped)]
    assert STORY[:20] in page.inner_text("#conversations")
    assert "stopped" in page.inner_text(".msg.assistant .stats")
    tab.close()


def _request_bodies(page: Any) -> list[dict[str, Any]]:
    bodies: list[dict[str, Any]] = []
    page.on(
        "request",
        lambda request: (
            bodies.append(json.loads(request.post_data))
            if request.url.endswith("/v1/chat/completions")
            else None
        ),
    )
    return bodies


@pytest.mark.real_model
@pytest.mark.slow
def test_keyboard_settings_regenerate_edit_and_schema_at_phone_width(
    browser: Any, server: ServerProcess
) -> None:
    url = server.wait_ready(5)
    tab = Page(browser, url, PHONE)
    page = tab.page
    bodies = _request_bodies(page)
    focused = "document.activeElement.id"
    assert page.evaluate(focused) == "prompt"  # ready to type on load
    # Settings by keyboard alone: back to the settings button, Enter, then Tab from field to field.
    page.keyboard.press("Shift+Tab")
    assert page.evaluate(focused) == "toggle-settings"
    page.keyboard.press("Enter")
    assert page.is_visible("#settings")
    for field, value in (
        ("system", "You answer briefly."),
        ("temperature", "0.7"),
        ("top_p", "0.9"),
        ("top_k", "40"),
        ("min_p", "0.05"),
        ("max_tokens", "24"),
        ("seed", "7"),
    ):
        page.keyboard.press("Tab")
        assert page.evaluate(focused) == field
        page.keyboard.type(value)
    for _ in range(6):  # past the schema and key boxes to the message box
        page.keyboard.press("Tab")
        if page.evaluate(focused) == "prompt":
            break
    assert page.evaluate(focused) == "prompt"
    page.keyboard.type("Name three colours.")
    page.keyboard.press("Enter")
    tab.wait_idle()
    first = tab.messages()
    assert [role for role, _ in first] == ["user", "assistant"] and first[1][1].strip()
    stats = page.inner_text(".msg.assistant .stats")
    assert re.search(r"TTFT \d+ ms · \d+\.\d tok/s · \d+ tokens", stats), stats
    sent = bodies[-1]
    assert sent["messages"] == [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "Name three colours."},
    ]
    assert {k: sent[k] for k in ("temperature", "top_p", "top_k", "min_p", "max_tokens", "seed")} == {
        "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "max_tokens": 24, "seed": 7,
    }  # fmt: skip
    assert sent["stream"] is True
    # No horizontal scrolling at phone width; the conversations sit behind the menu button.
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert not page.is_visible("#conversations")
    page.click("#toggle-settings")  # close the settings: the picture shows the conversation
    assert not page.is_visible("#settings")
    tab.screenshot("phone.png")
    page.focus("#toggle-sidebar")
    page.keyboard.press("Enter")
    page.wait_for_selector("#conversations", state="visible")
    assert page.evaluate(focused) == "new-chat"
    tab.screenshot("phone-conversations.png")
    page.keyboard.press("Escape")  # closes the drawer, back on its button
    page.wait_for_selector("#conversations", state="hidden")
    assert page.evaluate(focused) == "toggle-sidebar"

    # Regenerate: the same conversation and seed again, so the same reply (tokens are a function
    # of model, prompt, settings and seed).
    page.click(".msg.assistant button:has-text('Regenerate')")
    tab.wait_idle()
    assert tab.messages() == first and bodies[-1] == sent

    # Edit and resend: the reply to the old text goes, one to the new text comes.
    page.click(".msg.user button:has-text('Edit')")
    page.fill("textarea.edit", "Name three animals.")
    page.keyboard.press("Enter")
    tab.wait_idle()
    edited = tab.messages()
    assert [role for role, _ in edited] == ["user", "assistant"] and edited[0][1] == "Name three animals."
    assert bodies[-1]["messages"][-1] == {"role": "user", "content": "Name three animals."}

    # Structured output: the schema box becomes response_format, and the reply obeys it.
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    tab.settings(json_schema=json.dumps(schema), max_tokens="40")
    page.fill("#prompt", "Give me a number as JSON.")
    page.keyboard.press("Enter")
    tab.wait_idle()
    assert bodies[-1]["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "schema", "schema": schema},
    }
    reply = json.loads(tab.messages()[-1][1])
    assert isinstance(reply["n"], int)
    # A schema that is not JSON is refused on the page, and nothing is sent.
    count = len(bodies)
    tab.settings(json_schema="{not json")
    page.fill("#prompt", "again")
    page.keyboard.press("Enter")
    assert "JSON" in page.inner_text("#settings-error") and page.is_visible("#settings-error")
    assert len(bodies) == count and page.input_value("#prompt") == "again"  # the text is kept
    # A setting the server refuses: its 400 message is shown in the conversation, with Retry.
    tab.settings(json_schema="", top_p="5")
    page.keyboard.press("Enter") if page.evaluate(focused) == "prompt" else page.click("#send")
    tab.wait_idle(30)
    error = page.inner_text(".msg.error .content")
    assert "top_p" in error, error
    assert page.is_visible(".msg.error button:has-text('Retry')")
    tab.close()


HOSTILE = (
    "Look: <img src=x onerror=\"window.__pwned='img'\"> and <script>window.__pwned='script'</script>\n\n"
    "[click me](javascript:window.__pwned='link') [data](data:text/html,<script>alert(1)</script>) "
    "[ok](https://example.org/safe)\n\n"
    "![pixel](http://127.0.0.2:9/tracker.png)\n\n"
    '<a href="javascript:alert(1)">raw anchor</a> <iframe src="javascript:alert(2)"></iframe>\n\n'
    "```html\n<b onmouseover=alert(3)>bold?</b>\n```\n"
)


def _sse(text: str) -> str:
    pieces = [text[i : i + 7] for i in range(0, len(text), 7)]
    chunks = [{"choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in pieces]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def _assert_inert(tab: Page) -> None:
    page = tab.page
    assert page.evaluate("window.__pwned") is None
    assert page.query_selector_all("#messages img, #messages script, #messages iframe, #messages b") == []
    hrefs = page.eval_on_selector_all("#messages a", "nodes => nodes.map(n => n.href)")
    assert hrefs == ["https://example.org/safe", "http://127.0.0.2:9/tracker.png"], hrefs
    text = page.inner_text(".msg.assistant .content")
    assert "<img src=x onerror=" in text and "<script>" in text and "<b onmouseover=alert(3)>" in text
    assert "[click me](javascript:" in text
    page.click("#messages >> text=raw anchor")  # plain text: clicking runs nothing
    page.wait_for_timeout(200)
    assert page.evaluate("window.__pwned") is None and tab.dialogs == []


@pytest.mark.real_model
@pytest.mark.slow
def test_hostile_markdown_in_a_reply_executes_nothing(browser: Any, server: ServerProcess) -> None:
    url = server.wait_ready(5)
    tab = Page(browser, url, DESKTOP)
    page = tab.page
    fetched: list[str] = []
    page.on("request", lambda request: fetched.append(request.url))
    # The reply comes from the page's own streaming path, with the model's words replaced by these.
    page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(status=200, content_type="text/event-stream", body=_sse(HOSTILE)),
    )
    page.fill("#prompt", "say something hostile")
    page.keyboard.press("Enter")
    tab.wait_idle(30)
    _assert_inert(tab)
    page.reload()  # the stored conversation goes through the same renderer
    page.wait_for_selector("#messages .msg.assistant")
    _assert_inert(tab)
    assert not any("127.0.0.2" in u or u.startswith(("javascript:", "data:")) for u in fetched), fetched
    tab.screenshot("hostile.png")
    tab.close()
