"""optuna-dashboard, for real: ``autotune dashboard`` serves a study and a headless Chromium
shows its name, its trials, their measurements and autotune's note."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def _find_browser() -> tuple[str, str] | None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (chromium, driver) if chromium and driver else None


@pytest.fixture(scope="session")
def browser_paths() -> tuple[str, str]:
    """Debian's Chromium and ChromeDriver. `.ci/run` installs them and sets
    AUTOTUNE_REQUIRE_BROWSER, so CI fails without them; elsewhere the test skips."""
    found = _find_browser()
    if found is None:
        if os.environ.get("AUTOTUNE_REQUIRE_BROWSER"):
            pytest.fail("AUTOTUNE_REQUIRE_BROWSER is set but chromium or chromedriver is missing")
        pytest.skip("no Chromium and ChromeDriver on this machine (.ci/run provides them)")
    return found


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for_port(port: int, process: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the dashboard exited: {process.communicate()[1]}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError("the dashboard did not start")


def test_the_dashboard_shows_the_study_its_trials_and_the_note(seen, browser_paths, tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from autotune.outputs import notes
    from autotune.study import answer_trial

    study, url = seen
    notes.write_note(study, url)
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "autotune", "dashboard", "--storage", url, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    chromium, driver_path = browser_paths
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1400,1000",
        f"--user-data-dir={tmp_path / 'profile'}",
    ):
        options.add_argument(flag)
    browser = None
    try:
        _wait_for_port(port, server)
        browser = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
        wait = WebDriverWait(browser, 60)

        def page_text() -> str:
            return browser.find_element(By.TAG_NAME, "body").text

        study_id = study._study_id
        base = f"http://127.0.0.1:{port}/dashboard/studies/{study_id}"
        browser.get(base)
        wait.until(lambda _: f"seen (id={study_id})" in page_text())
        browser.save_screenshot(str(tmp_path / "study.png"))

        browser.get(f"{base}/note")
        wait.until(lambda _: "autotune: seen" in page_text())
        best = answer_trial(study)
        assert best is not None
        assert f"Best: trial {best.number}" in page_text()  # the note, rendered
        browser.save_screenshot(str(tmp_path / "note.png"))

        browser.get(f"{base}/trials")
        wait.until(lambda _: "samples_per_second" in page_text())
        text = page_text()
        assert "Trial 0" in text and "bottleneck" in text
        browser.save_screenshot(str(tmp_path / "trials.png"))
        assert all(
            (tmp_path / f"{page}.png").stat().st_size > 10_000 for page in ("note", "trials")
        )
    finally:
        if browser is not None:
            browser.quit()
        server.terminate()
        server.communicate(timeout=30)


def test_the_dashboard_logs_no_line_per_request_and_names_each_note(seen, tmp_path):
    """optuna-dashboard's server wrote a line per HTTP request to the terminal; --verbose only.
    It names each study's Note tab, where the answer is."""
    import urllib.request

    from autotune.outputs import notes
    from autotune.testing import start_cli

    study, url = seen
    notes.write_note(study, url)
    port = _free_port()
    server = start_cli("dashboard", "--storage", url, "--port", str(port), cwd=tmp_path)
    try:
        _wait_for_port(port, server)
        for path in ("/dashboard", "/api/studies"):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as page:
                assert page.status == 200
        # what its Analytics tab plots (issue 44 item 2): every trial, the references too,
        # on the same parameters
        api = f"http://127.0.0.1:{port}/api/studies/{study._study_id}"
        with urllib.request.urlopen(api, timeout=30) as page:
            detail = json.loads(page.read())
        names = {p["name"] for p in detail["intersection_search_space"]}
        assert names == {p["name"] for p in detail["union_search_space"]}, detail
        assert {"effective_batch_size", "lr"} <= names
    finally:
        server.terminate()
        out, err = server.communicate(timeout=30)
    assert "GET /" not in out + err and "HTTP/1.1" not in out + err, out + err
    # where the answer is (its "Best Trial" card is the search's best single value): a new user
    # read that card as the answer
    note = f"http://127.0.0.1:{port}/dashboard/studies/{study._study_id}/note"
    assert f"  seen: {note}" in out.splitlines(), out
