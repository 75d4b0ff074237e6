"""The report page in a real headless browser (Debian's chromium + chromedriver, `make browser`): the gallery of a
real job's output shows N overlay thumbnails that all loaded, the class filter works, the plots loaded, the failed
image is named; a screenshot is kept as a test artifact (reports/test-artifacts/report_page.png)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from pipelines.report import render
from tests.conftest import REPO

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
GALLERY = 12
ALL_LOADED = "return [...document.images].every(i => i.complete) && [...document.images].map(i => i.naturalWidth);"


@pytest.fixture
def browser():
    assert CHROMIUM.is_file() and CHROMEDRIVER.is_file(), "run `make browser` (scripts/install_chromium.sh)"
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,2000",
        "--allow-file-access-from-files",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def test_report_page_shows_the_overlays_in_a_real_browser(bundled_val_run, browser, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(bundled_val_run.output, out, ignore=shutil.ignore_patterns("masks", "_sparkseg_attempts"))
    failed = bundled_val_run.summary["failed_images"][0]  # the job's own error row
    report = render.render(out, limit=GALLERY)

    browser.get(report.as_uri())
    widths = WebDriverWait(browser, 60).until(lambda d: d.execute_script(ALL_LOADED))
    figures = browser.find_elements(By.CSS_SELECTOR, "#gallery figure")
    thumbs = browser.find_elements(By.CSS_SELECTOR, "#gallery img")
    assert len(figures) == len(thumbs) == GALLERY
    assert all(width > 0 for width in widths), widths  # no broken image anywhere
    assert len(widths) == GALLERY + 2  # + counts and score histograms
    artifacts = REPO / "reports" / "test-artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(tmp_path / "report_page.png"))
    shutil.copy(tmp_path / "report_page.png", artifacts / "report_page.png")

    scores = [float(f.get_attribute("data-score")) for f in figures]
    assert scores == sorted(scores, reverse=True)  # top-scoring first
    errors = browser.find_element(By.XPATH, "//h2[@id='errors']/following-sibling::table[1]").text
    assert failed in errors and "ImageDecodeError" in errors
    assert "SYNTHETIC" in browser.find_element(By.CLASS_NAME, "note").text

    button = browser.find_element(By.CSS_SELECTOR, "#filters button[data-name='pothole']")
    expected = sum("pothole" in f.get_attribute("data-classes") for f in figures)
    button.click()
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "shown").text == str(expected))
    assert expected > 0 and sum(f.is_displayed() for f in figures) == expected
