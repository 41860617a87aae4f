"""The chat page in a real browser (Debian's chromium, driven by selenium through chromium-driver):
load `/` of `specedge serve` on SmolLM2 (the fp32 export as the target, its int4 export as the
draft), send a prompt, see the answer stream in, coloured by origin, with the decoding's figures;
greedy, so the page's answer is the API's answer to the same chat, token for token. SmolLM2 answers
the prompt with a Python code block: it is highlighted, its copy button puts the code on the
clipboard (pasted back into the page), and the conversation is kept in the browser (a reload shows
it; new, switch, delete); the settings go into the request, and the stop button stops an answer."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.serve.conftest import MODEL, ServerProcess, start_server, stop_server

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
PROMPT = "Write a Python function that adds two numbers."
SCREENSHOT_ENV = "SPECEDGE_PAGE_SCREENSHOT"  # where to keep the page's screenshot (docs/chat-page.png)

pytestmark = [
    pytest.mark.slow,  # 20-40 s: a browser and a server process
    pytest.mark.skipif(not (Path(CHROMIUM).is_file() and Path(DRIVER).is_file()) and not os.environ.get("CI"),
                       reason="no chromium here (apt-get install chromium chromium-driver)"),
]


@pytest.fixture(scope="module")
def greedy_server(smollm2: dict[str, Path]) -> Iterator[ServerProcess]:
    server = start_server(smollm2["fp32"], smollm2["int4"], "--temperature", "0", "-n", "48")
    yield server
    assert stop_server(server) == 0, "\n".join(server.log)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[object]:
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1100,800", f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def test_the_page_streams_an_answer_coloured_by_origin(greedy_server: ServerProcess, browser, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    driver, wait = browser, WebDriverWait(browser, 120)
    driver.get(f"{greedy_server.url}/")
    prompt = driver.find_element(By.ID, "prompt")
    wait.until(lambda d: prompt.is_enabled())  # /health ready and the model card read
    assert MODEL in driver.find_element(By.ID, "model").text
    assert "logical CPUs" in driver.find_element(By.ID, "device").text
    prompt.send_keys(PROMPT, Keys.ENTER)
    wait.until(lambda d: d.find_element(By.ID, "status").text.startswith(("done", "stopped")))
    answer = driver.find_element(By.CSS_SELECTOR, ".message.assistant")
    spans = answer.find_elements(By.CSS_SELECTOR, ".drafted, .own")
    classes = {span.get_attribute("class") for span in spans}
    assert classes == {"drafted", "own"}, classes  # the int4 draft agrees with its fp32 target often, not always
    text = stored(driver)[0]["messages"][1]["content"]  # the answer as the page keeps it
    for figure in ("tps", "acc", "tpp", "bpt"):
        assert driver.find_element(By.ID, figure).text not in ("", "–"), figure
    assert driver.find_element(By.ID, "acc").text.endswith("%")
    shot = Path(os.environ.get(SCREENSHOT_ENV) or tmp_path / "page.png")
    assert driver.save_screenshot(str(shot)) and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    logs = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not logs, logs  # no script error, no request the page's policy refused

    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}]}
    api = httpx.post(f"{greedy_server.url}/v1/chat/completions", json=body, timeout=120).json()
    assert text == api["choices"][0]["message"]["content"] and text.strip()


def stored(driver) -> list[dict]:
    """The conversations the page keeps in the browser's localStorage."""
    return json.loads(driver.execute_script("return localStorage.getItem('specedge.chats') || '[]'"))


def listed(driver) -> list[str]:
    from selenium.webdriver.common.by import By

    return [b.text for b in driver.find_elements(By.CSS_SELECTOR, "#chat-list .open")]


RECORD_REQUESTS = """
window.sent = [];
const real = window.fetch;
window.fetch = (url, options) => {
  if (String(url).includes('/chat/completions')) window.sent.push(JSON.parse(options.body));
  return real(url, options);
};"""


def test_a_code_answer_highlighted_copied_and_kept(greedy_server: ServerProcess, browser) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    driver, wait = browser, WebDriverWait(browser, 120)
    permissions = ["clipboardReadWrite", "clipboardSanitizedWrite"]
    driver.execute_cdp_cmd("Browser.grantPermissions", {"origin": greedy_server.url, "permissions": permissions})
    driver.get(f"{greedy_server.url}/")
    prompt = driver.find_element(By.ID, "prompt")
    wait.until(lambda d: prompt.is_enabled())
    prompt.send_keys(PROMPT, Keys.ENTER)
    wait.until(lambda d: d.find_element(By.ID, "status").text.startswith(("done", "stopped")))

    # a highlighted Python block: keywords and the function's name in their colours, the code exact
    block = driver.find_element(By.CSS_SELECTOR, ".message.assistant .code")
    code = block.find_element(By.CSS_SELECTOR, "pre code.language-python")
    assert block.find_element(By.CSS_SELECTOR, ".lang").text == "python"
    assert [k.text for k in code.find_elements(By.CSS_SELECTOR, ".tok-kw")][:2] == ["def", "return"]
    assert code.find_element(By.CSS_SELECTOR, ".tok-fn").text == "add_two_numbers"
    keyword, plain = (driver.execute_script("return getComputedStyle(arguments[0]).color", e) for e in
                      (code.find_element(By.CSS_SELECTOR, ".tok-kw"), code))
    assert keyword != plain  # coloured
    api = httpx.post(f"{greedy_server.url}/v1/chat/completions", timeout=120, json={
        "model": MODEL, "messages": [{"role": "user", "content": PROMPT}]}).json()["choices"][0]["message"]["content"]
    expected = api.split("```python\n", 1)[1].split("\n```", 1)[0]
    assert code.text == expected and "    return" in expected  # the code as the model wrote it, indented
    inline = driver.find_elements(By.CSS_SELECTOR, ".message.assistant p code")
    assert inline and inline[0].text == "add"  # `add` in the prose: inline code, no backticks shown

    # the copy button: the clipboard holds the code, as pasting it back into the page shows
    button = block.find_element(By.CSS_SELECTOR, "button.copy")
    button.click()
    wait.until(lambda d: button.text == "Copied")
    prompt.click()
    prompt.send_keys(Keys.CONTROL, "v")
    assert prompt.get_attribute("value") == expected
    prompt.clear()

    # kept in the browser: a reload shows the conversation, listed by its first message
    chats = stored(driver)
    assert len(chats) == 1 and chats[0]["title"] == PROMPT
    assert [m["role"] for m in chats[0]["messages"]] == ["user", "assistant"]
    assert chats[0]["messages"][1]["content"] == api
    driver.refresh()
    wait.until(lambda d: d.find_element(By.ID, "prompt").is_enabled())
    assert listed(driver) == [PROMPT]
    assert driver.find_element(By.CSS_SELECTOR, ".message.user").text == PROMPT
    assert driver.find_element(By.CSS_SELECTOR, ".message.assistant pre code").text == expected

    # a new conversation with the settings: sampling fields and the system prompt go into the request
    driver.find_element(By.ID, "new-chat").click()
    assert not driver.find_elements(By.CSS_SELECTOR, ".message")
    driver.find_element(By.CSS_SELECTOR, "#settings summary").click()
    for field, value in (("temperature", "0"), ("top-p", "0.9"), ("max-tokens", "12"), ("system", "Be brief.")):
        driver.find_element(By.ID, field).send_keys(value)
    driver.execute_script(RECORD_REQUESTS)
    driver.find_element(By.ID, "prompt").send_keys("Name a colour.", Keys.ENTER)
    wait.until(lambda d: d.find_element(By.ID, "status").text.startswith(("done", "stopped")))
    sent = driver.execute_script("return window.sent")[-1]
    assert sent["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Name a colour."}]
    assert (sent["temperature"], sent["top_p"], sent["max_tokens"]) == (0, 0.9, 12)
    status = driver.find_element(By.ID, "status").text
    assert "12 tokens" in status or status.startswith("done"), status  # at most 12
    assert listed(driver) == ["Name a colour.", PROMPT]  # the latest first

    # switch back, then delete the newer one (a click arms the button, a second deletes)
    driver.find_elements(By.CSS_SELECTOR, "#chat-list .open")[1].click()
    assert driver.find_element(By.CSS_SELECTOR, ".message.user").text == PROMPT
    delete = driver.find_elements(By.CSS_SELECTOR, "#chat-list .delete")[0]
    delete.click()
    assert listed(driver) == ["Name a colour.", PROMPT] and delete.text == "Delete?"
    delete.click()
    assert listed(driver) == [PROMPT] and [c["title"] for c in stored(driver)] == [PROMPT]
    driver.refresh()
    wait.until(lambda d: d.find_element(By.ID, "prompt").is_enabled())
    assert listed(driver) == [PROMPT] and driver.find_element(By.ID, "max-tokens").get_attribute("value") == "12"

    # the stop button stops an answer mid-way; what came is kept
    driver.find_element(By.CSS_SELECTOR, "#settings summary").click()
    driver.find_element(By.ID, "max-tokens").clear()
    driver.find_element(By.ID, "max-tokens").send_keys("400")
    driver.find_element(By.ID, "prompt").send_keys("Tell me a very long story about the sea.", Keys.ENTER)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".message.assistant")[-1].text.strip())
    driver.find_element(By.ID, "stop").click()
    wait.until(lambda d: d.find_element(By.ID, "status").text == "stopped")
    kept = stored(driver)[0]["messages"]
    assert len(kept) == 4 and kept[3]["status"] == "stopped" and kept[3]["content"]
    logs = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not logs, logs


MARKDOWN = """# Title with `code`

A paragraph with **bold**, *em*, snake_case_name, a [link](https://example.org) and a [bad](javascript:void).
<b>not html</b>
second line

1. first
2. second
   - nested *item*
   - with code:

     ```js
     const x = 1; // one
     ```
3. third

> quoted

| name | value |
|:-----|------:|
| a \\| b | `1` |

---
```python
def f():
    return "unfinished
"""

RENDERED = {  # selector -> the texts of what it selects
    "h3": ["Title with code"], "h3 code": ["code"], "strong": ["bold"], "em": ["em", "item"],
    "a": ["link"], "ol > li": None, "ol ul > li": None, "blockquote p": ["quoted"], "th": ["name", "value"],
    "td": ["a | b", "1"], "td code": ["1"], "hr": [""], "pre code.language-javascript": ["const x = 1; // one"],
    "pre code.language-python": ['def f():\n    return "unfinished'],
    "pre code.language-python .tok-kw": ["def", "return"], "pre code.language-python .tok-str": ['"unfinished'],
    ".language-javascript .tok-com": ["// one"], ".language-javascript .tok-num": ["1"],
}


def test_the_markdown_renderer(greedy_server: ServerProcess, browser) -> None:
    """markdown.js and highlight.js on a text with every construct they render: what each becomes,
    links only to http(s), markup in the text shown as text, an unfinished code block rendered."""
    from selenium.webdriver.common.by import By

    driver = browser
    driver.get(f"{greedy_server.url}/")
    out = driver.execute_script("""
        const div = document.createElement('div');
        document.body.appendChild(div);
        window.SpecedgeMarkdown.render(arguments[0], div, [[20, 1], [arguments[0].length, 0]], true);
        return div;""", MARKDOWN)
    texts = {selector: [e.get_attribute("textContent") for e in out.find_elements(By.CSS_SELECTOR, selector)]
             for selector in RENDERED}
    for selector, want in RENDERED.items():
        if want is not None:
            assert texts[selector] == want, (selector, texts[selector])
    assert len(texts["ol > li"]) == 3 and len(texts["ol ul > li"]) == 2 and texts["ol > li"][2] == "third"
    assert [a.get_attribute("href") for a in out.find_elements(By.TAG_NAME, "a")] == ["https://example.org/"]
    assert "[bad]" not in out.text and "bad" in out.text  # a javascript: link is text, not a link
    assert "<b>not html</b>" in out.text and not out.find_elements(By.TAG_NAME, "b")
    assert out.find_elements(By.CSS_SELECTOR, "p br")  # a single newline is a line break
    assert "snake_case_name" in out.text  # no emphasis inside a word
    spans = out.find_elements(By.CSS_SELECTOR, ".drafted")
    assert "".join(s.get_attribute("textContent") for s in spans) == "Title with code"  # the first 20 characters
    assert len(out.find_elements(By.CSS_SELECTOR, "button.copy")) == 2


def test_chromium_is_where_the_test_looks() -> None:
    """CI installs Debian's chromium and chromium-driver: the browser test above must not skip there."""
    assert shutil.which("chromium") == CHROMIUM and shutil.which("chromedriver") == DRIVER
