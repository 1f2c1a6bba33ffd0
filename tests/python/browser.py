"""A real headless Chromium for console tests, driven by selenium through Debian's chromedriver.

Shared by the mock-gate console tests (tests/python/gate/test_console.py) and meant for the
runtime's console: nothing here knows about either.

    with Browser.start(workdir, screenshots) as browser:
        browser.open(f"{url}/console/")
        browser.type("#username", "bob@bank")
        browser.click("#login-button")
        browser.wait_for(lambda: browser.rows("#decisions-body"), "the decisions table to fill")
        browser.screenshot("signed-in")          # prints the PNG's path

Chromium runs as the probe of this machine kind does: --headless --no-sandbox --disable-gpu
--disable-quic --no-first-run --disable-background-networking --disable-component-update
--disable-sync, with a new empty --user-data-dir; without the background-networking flags it
keeps trying Google's hosts, which the closed network refuses.

Nothing is skipped: when /usr/bin/chromium or /usr/bin/chromedriver is missing the test fails
with the command that installs them (CI's .ci/run installs them). CHROMIUM_BIN and
CHROMEDRIVER_BIN choose other binaries.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable, TypeVar

from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

CHROMIUM = Path(os.environ.get("CHROMIUM_BIN", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("CHROMEDRIVER_BIN", "/usr/bin/chromedriver"))
INSTALL = "apt-get install -y chromium chromium-driver"

CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1600,1200",
]

T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parents[2]


def screenshot_dir(name: str) -> Path:
    """An emptied `target/console-screenshots/<name>/` (CARGO_TARGET_DIR respected), where a test's
    screenshots go for a reviewer to look at."""
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO_ROOT / "target")
    if not target.is_absolute():
        target = REPO_ROOT / target
    path = target / "console-screenshots" / name
    shutil.rmtree(path, ignore_errors=True)
    return path


def require_chromium() -> None:
    """Fails (never skips) when the browser or its driver is missing, naming the fix."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.is_file()]
    if missing:
        raise AssertionError(
            f"browser tests need Chromium and ChromeDriver; missing: {', '.join(missing)}. "
            f"Install them with `{INSTALL}` (.ci/run does this in CI), or point CHROMIUM_BIN / "
            "CHROMEDRIVER_BIN at them."
        )


class Browser:
    """One headless Chromium with its own empty profile, download folder and screenshot
    folder."""

    def __init__(self, driver: webdriver.Chrome, workdir: Path, screenshots: Path, downloads: Path):
        self.driver = driver
        self.workdir = workdir
        self.screenshots = screenshots
        self.downloads = downloads
        self._shots = 0

    @classmethod
    def start(cls, workdir: Path, screenshots: Path) -> "Browser":
        require_chromium()
        workdir.mkdir(parents=True, exist_ok=True)
        screenshots.mkdir(parents=True, exist_ok=True)
        profile = workdir / "chromium-profile"
        downloads = workdir / "downloads"
        profile.mkdir()
        downloads.mkdir()
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in CHROMIUM_FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--user-data-dir={profile}")
        options.add_experimental_option(
            "prefs",
            {
                "download.default_directory": str(downloads),
                "download.prompt_for_download": False,
                "safebrowsing.enabled": False,
            },
        )
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        service = Service(executable_path=str(CHROMEDRIVER), log_output=str(workdir / "chromedriver.log"))
        try:
            driver = webdriver.Chrome(service=service, options=options)
        except WebDriverException as error:
            log = workdir / "chromedriver.log"
            tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
            raise AssertionError(f"Chromium did not start: {error}\n{tail}") from error
        driver.execute_cdp_cmd(
            "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)}
        )
        browser = cls(driver, workdir, screenshots, downloads)
        print(f"browser screenshots: {screenshots}")
        return browser

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.driver.quit()
        except WebDriverException:
            pass

    # -- navigation and elements ------------------------------------------------------------

    def open(self, url: str) -> None:
        self.driver.get(url)

    def find(self, css: str, within: WebElement | None = None) -> WebElement:
        return (within or self.driver).find_element(By.CSS_SELECTOR, css)

    def find_all(self, css: str, within: WebElement | None = None) -> list[WebElement]:
        return (within or self.driver).find_elements(By.CSS_SELECTOR, css)

    def rows(self, tbody_css: str) -> list[WebElement]:
        return self.find_all(f"{tbody_css} > tr")

    def text(self, css: str) -> str:
        return self.find(css).text

    def visible(self, css: str) -> bool:
        found = self.find_all(css)
        return bool(found) and found[0].is_displayed()

    def type(self, css: str, value: str, within: WebElement | None = None) -> None:
        element = self.find(css, within)
        element.clear()
        element.send_keys(value)

    def click(self, css: str, within: WebElement | None = None) -> None:
        self.find(css, within).click()

    def script(self, source: str, *args):
        return self.driver.execute_script(source, *args)

    def fetch_status(self, path: str, method: str = "GET") -> int:
        """The status of a same-origin fetch made by the page (with its cookies)."""
        return self.driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch(arguments[0], {method: arguments[1], credentials: 'same-origin'})"
            ".then(r => done(r.status), e => done(-1));",
            path,
            method,
        )

    def wait_for(self, condition: Callable[[], T], what: str, timeout: float = 15) -> T:
        """Polls `condition` until it returns something truthy; fails naming `what` and saving
        a screenshot of the page as it was."""
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                value = condition()
                if value:
                    return value
            except WebDriverException as error:  # a row re-rendered under us: try again
                last_error = error
            time.sleep(0.1)
        shot = self.screenshot(f"timeout-{what}")
        raise AssertionError(f"timed out after {timeout}s waiting for {what} (screenshot {shot}); "
                             f"last error: {last_error}; browser log: {self.console_log()}")

    # -- evidence ----------------------------------------------------------------------------

    def screenshot(self, name: str) -> Path:
        self._shots += 1
        safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:80]
        path = self.screenshots / f"{self._shots:02d}-{safe}.png"
        self.driver.execute_script("window.scrollTo(0, 0)")
        self.driver.save_screenshot(str(path))
        print(f"screenshot: {path}")
        return path

    def console_log(self) -> list[dict]:
        """The page's console messages and errors (CSP violations show up here)."""
        try:
            return self.driver.get_log("browser")
        except WebDriverException:
            return []

    def wait_for_download(self, name: str, timeout: float = 15) -> Path:
        """The downloaded file `name`, once Chromium has finished writing it."""
        target = self.downloads / name

        def done() -> Path | None:
            partial = list(self.downloads.glob("*.crdownload"))
            return target if target.is_file() and not partial else None

        try:
            return self.wait_for(done, f"the download of {name}", timeout)
        except AssertionError as error:
            listing = json.dumps(sorted(p.name for p in self.downloads.iterdir()))
            raise AssertionError(f"{error}; downloads folder holds {listing}") from error
