"""The chat page of `infer serve` (cli/serve/webui.py, cli/serve/static/).

In-process: the routes, their headers, `--no-webui`, the API key. In a real browser (Debian's headless
`chromium` through Playwright's Python package, never a downloaded browser) against a real `infer serve`
on the default model: text appears while the reply streams, Stop frees the sequence (/metrics), a
reload keeps the conversation, the sampler settings and the JSON schema reach the server, regenerate
and edit-and-resend, keyboard only, phone width, and hostile Markdown runs nothing (and that check
fails on a renderer that lets HTML through); the browser enforces the page's policy. Screenshots at
desktop and phone width go to `artifacts/webui/` (or `$INFER_ARTIFACTS/webui/`).

Every browser test runs under the page's Content-Security-Policy, as a user's browser does: the waits
are locator waits and `expect` (Playwright's utility world, untouched by the policy), never
`wait_for_function` (its predicate is a string evaluated in the page, which the policy's missing
'unsafe-eval' refuses), and any violation the policy reports fails the test that caused it.
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
STATIC = ROOT / "cli" / "serve" / "static"
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


REPORT_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", (event) => {
  console.warn(`csp-violation ${event.effectiveDirective} ${event.blockedURI || "inline"}`);
});
"""
"""An init script (run by the browser before the page's own, whatever the policy) that reports each
violation of the page's Content-Security-Policy on the console, where `Page` collects it."""


class Page:
    """A browser page on the server's chat page under its Content-Security-Policy, failing the test
    on any script error or policy violation (`close`)."""

    def __init__(self, browser: Any, url: str, viewport: dict[str, int], *, bypass_csp: bool = False) -> None:
        # bypass_csp only for the policy test's control: the same injection, run without the policy.
        self.context = browser.new_context(viewport=viewport, bypass_csp=bypass_csp)
        self.context.add_init_script(REPORT_VIOLATIONS)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.violations: list[str] = []
        self.console: list[str] = []
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.on("console", self._on_console)

        def on_dialog(dialog: Any) -> None:
            self.dialogs.append(dialog.message)
            dialog.dismiss()

        self.page.on("dialog", on_dialog)
        self.url = url
        self.page.goto(url)

    def _on_console(self, message: Any) -> None:
        self.console.append(message.text)
        if message.text.startswith("csp-violation "):
            self.violations.append(message.text.removeprefix("csp-violation "))

    def settings(self, **values: str) -> None:
        if not self.page.is_visible("#settings"):
            self.page.click("#toggle-settings")
        for name, value in values.items():
            self.page.fill(f"#{name}", value)
        self.page.click("#toggle-settings")

    def wait_idle(self, timeout: float = 120) -> None:
        self.page.wait_for_selector("body:not(.busy)", timeout=timeout * 1000)

    def focused(self) -> str | None:
        """The id of the element that has the focus (None when none has), read now, without waiting."""
        node = self.page.locator(":focus")
        return node.first.get_attribute("id") if node.count() else None

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

    def close(self, *, violations: bool = False) -> None:
        """Close the tab; the test fails on a script error, and on a policy violation unless the test
        expected some (`violations`)."""
        self.context.close()
        assert not self.errors, self.errors
        assert violations or not self.violations, (self.violations, self.console)


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
    from playwright.sync_api import expect

    url = server.wait_ready(5)
    tab = Page(browser, url, DESKTOP)
    page = tab.page
    cancelled = _metric(url, "infer:request_success_total", finished_reason="cancelled")
    generated = _metric(url, "infer:generation_tokens_total")
    tab.settings(seed="1", max_tokens="400", temperature="0.8")
    page.fill("#prompt", STORY)
    page.keyboard.press("Enter")
    streaming = page.locator(".msg.streaming .content")  # the reply while it streams, and only then
    expect(streaming).to_have_text(re.compile(r"\S"), timeout=60_000)
    early = streaming.text_content(timeout=1_000) or ""
    assert early.strip() and page.locator("body.busy").count() == 1, early  # text while it still streams
    expect(streaming).to_have_text(re.compile(r"[\s\S]{61}"), timeout=60_000)  # over 60 characters
    assert page.is_visible("#stop") and not page.is_visible("#send")
    page.click("#stop")
    tab.wait_idle(30)
    stopped = page.inner_text(".msg.assistant .content")
    whole = page.text_content(".msg.assistant .content") or ""
    assert early.strip()[:10] in whole and len(whole) > len(early)
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
    from playwright.sync_api import expect

    url = server.wait_ready(5)
    tab = Page(browser, url, PHONE)
    page = tab.page
    bodies = _request_bodies(page)
    expect(page.locator("#prompt")).to_be_focused()  # ready to type on load
    # Settings by keyboard alone: back to the settings button, Enter, then Tab from field to field.
    page.keyboard.press("Shift+Tab")
    expect(page.locator("#toggle-settings")).to_be_focused()
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
        expect(page.locator(f"#{field}")).to_be_focused()
        page.keyboard.type(value)
    for _ in range(6):  # past the schema and key boxes to the message box
        page.keyboard.press("Tab")
        if tab.focused() == "prompt":
            break
    expect(page.locator("#prompt")).to_be_focused()
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
    expect(page.locator("#new-chat")).to_be_focused()
    tab.screenshot("phone-conversations.png")
    page.keyboard.press("Escape")  # closes the drawer, back on its button
    page.wait_for_selector("#conversations", state="hidden")
    expect(page.locator("#toggle-sidebar")).to_be_focused()

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
    page.keyboard.press("Enter") if tab.focused() == "prompt" else page.click("#send")
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
    # Nothing the policy had to stop: the renderer made no handler, script, frame or remote load.
    assert tab.violations == [], tab.violations


def _hostile_reply(tab: Page) -> None:
    """Send a prompt whose reply, through the page's own streaming path, is HOSTILE."""
    tab.page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(status=200, content_type="text/event-stream", body=_sse(HOSTILE)),
    )
    tab.page.fill("#prompt", "say something hostile")
    tab.page.keyboard.press("Enter")
    tab.wait_idle(30)


@pytest.mark.real_model
@pytest.mark.slow
def test_hostile_markdown_in_a_reply_executes_nothing(browser: Any, server: ServerProcess) -> None:
    url = server.wait_ready(5)
    tab = Page(browser, url, DESKTOP)
    page = tab.page
    fetched: list[str] = []
    page.on("request", lambda request: fetched.append(request.url))
    _hostile_reply(tab)
    _assert_inert(tab)
    page.reload()  # the stored conversation goes through the same renderer
    page.wait_for_selector("#messages .msg.assistant")
    _assert_inert(tab)
    assert not any("127.0.0.2" in u or u.startswith(("javascript:", "data:")) for u in fetched), fetched
    tab.screenshot("hostile.png")
    tab.close()


LEAKS = {
    "parent.append(document.createTextNode(text.slice(last, m.index)))": (
        'parent.insertAdjacentHTML("beforeend", text.slice(last, m.index))'
    ),
    "parent.append(document.createTextNode(text.slice(last)))": (
        'parent.insertAdjacentHTML("beforeend", text.slice(last))'
    ),
}
"""A one-line renderer bug: markdown.js inserting a reply's plain text as HTML instead of text nodes."""


@pytest.mark.real_model
@pytest.mark.slow
def test_the_hostile_check_catches_a_renderer_that_lets_html_through(
    browser: Any, server: ServerProcess
) -> None:
    leaky = (STATIC / "markdown.js").read_text()
    for safe, unsafe in LEAKS.items():
        assert leaky.count(safe) == 1, safe  # markdown.js changed: update LEAKS
        leaky = leaky.replace(safe, unsafe)
    url = server.wait_ready(5)
    tab = Page(browser, url, DESKTOP)
    page = tab.page
    page.route(
        "**/webui/markdown.js",
        lambda route: route.fulfill(status=200, content_type="text/javascript", body=leaky),
    )
    page.reload()
    _hostile_reply(tab)
    with pytest.raises(AssertionError):
        _assert_inert(tab)
    assert page.locator("#messages img").count() > 0  # the model's <img onerror> became an element
    # ... and the policy, the second wall, kept its handler from running (and was seen doing so)
    _poll(tab, lambda: "script-src-attr inline" in tab.violations)
    assert page.evaluate("window.__pwned") is None
    assert "script-src-attr inline" in tab.violations, tab.violations
    tab.close(violations=True)


INJECT = """() => {
  window.__ran = [];
  const script = document.createElement("script");
  script.textContent = "window.__ran.push('inline script')";
  document.body.append(script);
  const img = document.createElement("img");
  img.setAttribute("onerror", "window.__ran.push('inline handler')");
  img.src = "/webui/missing.png";
  document.body.append(img);
  setTimeout("window.__ran.push('string timer')", 0);
}"""
"""What a renderer bug could put into the page: an inline script, an inline event handler, code in a
string (as `eval` does). `page.evaluate` itself runs (DevTools' calls are exempt from the policy);
what it leaves in the page runs later, under the policy."""
RAN = ["inline script", "inline handler", "string timer"]
ALL_RAN = "window.__ran.length === 3"


def _poll(tab: Page, done: Any, timeout: float = 10) -> None:
    """Let the page run (events arrive while Playwright waits) until `done()` or the timeout."""
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        tab.page.wait_for_timeout(50)


@pytest.mark.real_model
@pytest.mark.slow
def test_the_browser_enforces_the_pages_policy(browser: Any, server: ServerProcess) -> None:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import expect

    url = server.wait_ready(5)
    # The control: without the policy the same injection runs (so the checks below can fail), and
    # a string predicate can be waited on.
    loose = Page(browser, url, DESKTOP, bypass_csp=True)
    loose.page.evaluate(INJECT)
    loose.page.wait_for_function(ALL_RAN, timeout=10_000)
    assert sorted(loose.page.evaluate("window.__ran")) == sorted(RAN)
    loose.close()

    tab = Page(browser, url, DESKTOP)
    page = tab.page
    page.evaluate(INJECT)
    _poll(tab, lambda: len(tab.violations) >= len(RAN))
    assert page.evaluate("window.__ran") == [], tab.console
    assert sorted(tab.violations) == ["script-src eval", "script-src-attr inline", "script-src-elem inline"]
    # Why no test here waits with wait_for_function: past its first try (inside DevTools' call), its
    # predicate is a string evaluated in the page, and the policy has no 'unsafe-eval'.
    with pytest.raises(PlaywrightError, match="unsafe-eval"):
        page.wait_for_function(ALL_RAN, timeout=5_000)
    # (a try already scheduled may throw the same refusal again, uncaught: a page error, not the page's)
    tab.errors = [error for error in tab.errors if "'unsafe-eval' is not an allowed source" not in error]
    page.click("#toggle-settings")  # while the page's own scripts run as ever
    expect(page.locator("#settings")).to_be_visible()
    tab.close(violations=True)
