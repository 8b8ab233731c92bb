"""Real-browser fixtures: Playwright driving Debian's chromium against Django's live server.

Playwright never downloads a browser here; `make test` installs Debian's chromium. A missing
browser fails the tests (it is never a skip). Screenshots go to ``artifacts/screens/``.
"""

import os
import shutil
import time
from pathlib import Path

import pytest
from django.db import connection
from playwright.sync_api import Browser, Page, sync_playwright

from tests.conftest import PASSWORD

SCREENS = Path(__file__).resolve().parents[2] / "artifacts" / "screens"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# Playwright's sync API runs an event loop in this thread; the tests' own ORM calls are plain
# synchronous code, so Django's async-safety guard would misfire.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture(scope="session")
def browser() -> Browser:
    executable = shutil.which("chromium")
    assert executable, "Debian's chromium is not installed: run `make browser`"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


@pytest.fixture(autouse=True)
def served_as_make_run_serves_it(settings):
    """DEBUG on, as under ``make run``: pages must behave the same (a form answered 400 keeps its
    page and menu, whatever django-htmx would add in DEBUG)."""
    settings.DEBUG = True


@pytest.fixture
def page(browser, live_server) -> Page:
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(10_000)
    yield page
    context.close()
    wait_for_the_live_server_to_finish_its_requests()


# A request the page started last (an hx-trigger="load" fragment, a poll) may still be running in
# the live server's thread when the test ends. Flushing the tables under it deadlocks the flush
# and leaves the next test the rows of this one, so teardown waits for every other session on the
# test database to be outside a transaction. Idle connections hold no locks and do not count.
BUSY_SESSIONS = """
    SELECT count(*) FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid()
      AND state IN ('active', 'idle in transaction', 'idle in transaction (aborted)')
"""


def wait_for_the_live_server_to_finish_its_requests(timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(BUSY_SESSIONS)
            if cursor.fetchone()[0] == 0:
                return
            time.sleep(0.05)


def log_in(page: Page, username: str, password: str = PASSWORD) -> None:
    page.goto("/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit], input[type=submit]")
    page.wait_for_load_state("networkidle")


def screenshot(page: Page, name: str) -> Path:
    SCREENS.mkdir(parents=True, exist_ok=True)
    path = SCREENS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
