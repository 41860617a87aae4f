"""The chat page in a real browser (Debian's chromium, driven by selenium through chromium-driver):
load `/` of `specedge serve` on SmolLM2 (the fp32 export as the target, its int4 export as the
draft), send a prompt, see the answer stream in, coloured by origin, with the decoding's figures;
greedy, so the page's answer is the API's answer to the same chat, token for token."""

from __future__ import annotations

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


@pytest.fixture
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
    spans = answer.find_elements(By.TAG_NAME, "span")
    classes = {span.get_attribute("class") for span in spans}
    assert classes == {"drafted", "own"}, classes  # the int4 draft agrees with its fp32 target often, not always
    text = driver.execute_script("return arguments[0].textContent", answer)
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


def test_chromium_is_where_the_test_looks() -> None:
    """CI installs Debian's chromium and chromium-driver: the browser test above must not skip there."""
    assert shutil.which("chromium") == CHROMIUM and shutil.which("chromedriver") == DRIVER
