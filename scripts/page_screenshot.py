"""The chat page's screenshot in docs/ (docs/chat-page.png): `specedge serve` on the default pair, a
code question asked in Debian's chromium (headless, through selenium and chromium-driver, as
tests/serve/test_page_browser.py drives it), greedy, and the page saved once the answer is done.

    .venv/bin/python scripts/page_screenshot.py [--out docs/chat-page.png] [--prompt TEXT]
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Write a Python function that merges overlapping intervals, with a short docstring."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "chat-page.png")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--size", default="1200,900", help="the window's width,height in pixels")
    args = parser.parse_args()

    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "specedge", "serve", "--port", str(port), "--temperature", "0",
                               "-n", "400"], cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None:
                return server.returncode or 1
            time.sleep(1)
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        with tempfile.TemporaryDirectory() as profile:
            for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--no-first-run", f"--window-size={args.size}", f"--user-data-dir={profile}"):
                options.add_argument(flag)
            driver = webdriver.Chrome(options=options,
                                      service=webdriver.ChromeService(executable_path="/usr/bin/chromedriver"))
            try:
                driver.get(f"{url}/")
                wait = WebDriverWait(driver, 600)
                prompt = driver.find_element(By.ID, "prompt")
                wait.until(lambda d: prompt.is_enabled())
                prompt.send_keys(args.prompt, Keys.ENTER)
                wait.until(lambda d: d.find_element(By.ID, "status").text.startswith(("done", "stopped")))
                driver.execute_script("document.getElementById('log').scrollTop = 0")
                driver.save_screenshot(str(args.out))
            finally:
                driver.quit()
        print(f"wrote {args.out}")
        return 0
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
