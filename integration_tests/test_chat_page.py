"""The chat page in a real browser: headless Chromium (the distribution's package) driven by Playwright, against
lmi serve with two models loaded one at a time. Screenshots go to $LMI_SCREENSHOTS (default: the test's tmp dir)."""

import os
import shutil
from pathlib import Path

import httpx
import pytest

from playwright import sync_api as playwright_api
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
NEEDS_BROWSER = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (scripts/test.sh installs Debian's "
                                                         "package where it can: apt-get install chromium)")
FOX = " The quick brown fox jumps over the lazy dog"
CODE = "Here is code: ```print('hi')``` Done **now**."  # one line: serving.properties holds it


@pytest.fixture(scope="module")
def server(serve_module):
    slow = {"option.rolling_batch": "scheduler", "option.scripted_step_delay_ms": 40, "option.max_new_tokens": 200,
            "option.scripted_text": FOX}
    return serve_module([serve_module.scripted("fox", **slow),
                         serve_module.scripted("coder", **{"option.scripted_text": CODE, "option.max_new_tokens": 48,
                                                           "option.scripted_load_seconds": 1})],
                        args=["--one-at-a-time"])


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    folder = Path(os.environ.get("LMI_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield browser
        browser.close()


def running_sequences(server, model, timeout=10.0):
    """The model's rolling-batch size from /metrics, once it is 0 or the timeout passes."""
    import time

    from prometheus_client.parser import text_string_to_metric_families

    deadline = time.monotonic() + timeout
    while True:
        families = text_string_to_metric_families(httpx.get(server.url + "/metrics").text)
        running = next(s.value for f in families if f.name == "lmi_running_sequences" for s in f.samples
                       if s.labels["model"] == model)
        if running == 0 or time.monotonic() > deadline:
            return running
        time.sleep(0.1)


def answers(page):
    return page.locator(".message.assistant")


@NEEDS_BROWSER
def test_chat_stream_stop_and_switch_model(server, browser, shots):
    page = browser.new_page(viewport={"width": 1100, "height": 750})
    page.goto(server.url + "/")
    status = page.locator("#model-status")
    playwright_api.expect(status).to_have_text("Available")
    assert page.locator("#model").input_value() == "fox"

    # A streamed answer appears piece by piece, then its stats.
    page.click("#settings summary")
    page.fill("#max-tokens", "30")
    page.fill("#prompt", "Tell me about foxes")
    page.press("#prompt", "Enter")
    first = answers(page).last.locator(".content")
    playwright_api.expect(first).to_contain_text("The", timeout=10_000)
    partial = first.inner_text()
    playwright_api.expect(answers(page).last.locator(".stats")).to_contain_text("tokens/s", timeout=20_000)
    assert partial != first.inner_text() and first.inner_text().startswith("The quick brown fox jumps")
    assert "30 tokens" in answers(page).last.locator(".stats").inner_text()

    # Stop mid-answer: the page shows it, and the server's rolling batch lets the sequence go.
    page.fill("#max-tokens", "200")
    page.fill("#prompt", "And a long one")
    page.press("#prompt", "Enter")
    playwright_api.expect(answers(page).last.locator(".content")).to_contain_text("quick", timeout=10_000)
    page.click("#stop-button")
    playwright_api.expect(answers(page).last.locator(".stats")).to_contain_text("stopped")
    stopped = answers(page).last.locator(".content").inner_text()
    assert len(stopped) < len(FOX)
    assert running_sequences(server, "fox") == 0  # the server let the stopped sequence go
    page.screenshot(path=str(shots / "chat-page.png"))

    # Switch model: the other one loads (the first is unloaded), the status says so, then it answers.
    page.select_option("#model", "coder")
    playwright_api.expect(status).to_have_text("Not loaded")
    page.click("#activate")
    playwright_api.expect(status).to_have_text("Available", timeout=60_000)
    models = httpx.get(server.url + "/ui/models").json()["models"]
    assert {m["name"]: m["status"] for m in models} == {"fox": "UNLOADED", "coder": "READY"}
    page.fill("#max-tokens", str(len(CODE)))
    page.fill("#prompt", "Show me code")
    page.press("#prompt", "Enter")
    playwright_api.expect(answers(page).last.locator("pre code")).to_have_text("print('hi')", timeout=20_000)
    playwright_api.expect(answers(page).last.locator("strong")).to_have_text("now")
    assert "coder" in answers(page).last.locator(".stats").inner_text()
    page.screenshot(path=str(shots / "chat-page-switched.png"))

    # Conversations are kept in the browser.
    page.reload()
    playwright_api.expect(answers(page)).to_have_count(3)


@NEEDS_BROWSER
def test_phone_sized_viewport(server, browser, shots):
    page = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    page.goto(server.url + "/")
    playwright_api.expect(page.locator("#model-status")).not_to_have_text("loading...")
    assert not page.locator("#sidebar").is_visible() or page.locator("#sidebar").bounding_box()["x"] < 0
    page.click("#settings summary")
    page.fill("#max-tokens", "20")
    page.click("#settings summary")
    page.fill("#prompt", "hi from a phone")
    page.tap("#send")
    playwright_api.expect(answers(page).last.locator(".stats")).to_contain_text("tokens", timeout=20_000)
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the page scrolls sideways on a phone ({width}px wide)"
    page.screenshot(path=str(shots / "chat-page-phone.png"))
    page.tap("#toggle-sidebar")
    playwright_api.expect(page.locator("#conversations li").first).to_be_in_viewport()
    page.screenshot(path=str(shots / "chat-page-phone-conversations.png"))


def test_page_switches_only_among_the_operators_models(server):
    response = httpx.post(server.url + "/ui/models/elsewhere/activate")
    assert response.status_code == 404 and "not one of the models" in response.json()["message"]
    assert httpx.post(server.url + "/ui/models/%2Ftmp%2Fmodel/activate").status_code == 404
    assert httpx.post(server.url + "/models?url=/tmp").status_code in (404, 405)  # management is elsewhere


def test_page_ships_with_the_server_and_loads_nothing_from_elsewhere(server):
    html = httpx.get(server.url + "/").text
    for asset in ("/ui/chat.js", "/ui/chat.css"):
        assert f'"{asset}"' in html and httpx.get(server.url + asset).status_code == 200
    for text in (html, httpx.get(server.url + "/ui/chat.js").text, httpx.get(server.url + "/ui/chat.css").text):
        assert "http://" not in text and "https://" not in text


def test_activate_over_http_unloads_the_other_model(server):
    """What the page's Activate does, without a browser (also runs where no chromium is installed)."""
    import time

    active = next(m["name"] for m in httpx.get(server.url + "/ui/models").json()["models"] if m["status"] == "READY")
    other = {"fox": "coder", "coder": "fox"}[active]
    assert httpx.post(f"{server.url}/ui/models/{other}/activate", timeout=30).status_code == 202
    deadline = time.monotonic() + 60
    while (statuses := {m["name"]: m["status"] for m in httpx.get(server.url + "/ui/models").json()["models"]})[
            other] == "PENDING" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert statuses == {other: "READY", active: "UNLOADED"}
    answer = httpx.post(server.url + "/v1/chat/completions", timeout=30,
                        json={"model": other, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    content = answer.json()["choices"][0]["message"]["content"]
    assert len(content) == 4 and content.strip() in (FOX if other == "fox" else CODE)


@NEEDS_BROWSER
def test_new_chat_never_leaves_an_empty_conversation_behind(server, browser):
    page = browser.new_page(viewport={"width": 1100, "height": 750})
    page.goto(server.url + "/")
    chats = page.locator("#conversations li")
    playwright_api.expect(page.locator("#model-status")).not_to_have_text("loading...")
    for _ in range(3):
        page.click("#new-chat")
    playwright_api.expect(chats).to_have_count(1)

    page.fill("#prompt", "hello")
    page.press("#prompt", "Enter")
    playwright_api.expect(answers(page).last.locator(".stats")).to_contain_text("tokens", timeout=20_000)
    page.click("#new-chat")
    page.click("#new-chat")
    playwright_api.expect(chats).to_have_count(2)  # "hello", and one empty chat to write in

    chats.nth(1).click()  # back to "hello": the empty chat goes, here and in what the page keeps
    playwright_api.expect(chats).to_have_count(1)
    page.reload()
    playwright_api.expect(chats).to_have_count(1)
    playwright_api.expect(chats.first).to_have_text("hello")


CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
WEATHER_TOOL = '[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]'


@NEEDS_BROWSER
def test_tool_calls_show_as_calls_and_json_mode_reaches_the_server(serve, browser, shots):
    caller = serve.scripted("caller", **{"option.rolling_batch": "scheduler", "option.scripted_text": CALL,
                                         "option.max_new_tokens": len(CALL), "option.enable_auto_tool_choice": "true",
                                         "option.tool_call_parser": "hermes"})
    server = serve([caller])
    page = browser.new_page(viewport={"width": 1100, "height": 750})
    page.goto(server.url + "/")
    playwright_api.expect(page.locator("#model-status")).to_have_text("Available")
    page.click("#settings summary")
    page.fill("#max-tokens", str(len(CALL)))  # the scripted text once: one call
    page.fill("#tools", WEATHER_TOOL)
    page.fill("#prompt", "Weather in Paris?")
    page.press("#prompt", "Enter")
    call = answers(page).last.locator(".tool-call")
    playwright_api.expect(call).to_have_text('tool call: get_weather({"city":"Paris"})', timeout=20_000)
    page.screenshot(path=str(shots / "chat-page-tool-call.png"))

    # JSON mode sends response_format; this backend cannot enforce it, and the page shows the server's reason.
    page.fill("#tools", "")
    page.check("#json-mode")
    page.fill("#prompt", "JSON please")
    page.press("#prompt", "Enter")
    playwright_api.expect(page.locator(".message.error").last).to_contain_text("response_format", timeout=20_000)
