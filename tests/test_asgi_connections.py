"""Database connections under ASGI (issue 16): the web process is gpucap.asgi:application
under uvicorn, where Django's persistent connections leak (each request runs in a thread of its
own). Many concurrent requests must leave PostgreSQL's connection count bounded, and back where
it was once they are answered; the app refuses to start with persistent connections."""

import os
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from tests.asgi_server import asgi_served
from tests.conftest import PASSWORD

ROOT = Path(__file__).resolve().parents[1]
REQUESTS = 100
CONCURRENCY = 16


@pytest.fixture
def served(transactional_db):
    """``gpucap.asgi:application`` under uvicorn on a free port, in a thread, with the
    settings as the environment gives them (nothing overridden)."""
    with asgi_served() as url:
        yield url


def others_connected() -> int:
    """Connections to the test database other than this test's own."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [settings.DATABASES["default"]["NAME"]],
        )
        return cursor.fetchone()[0]


def leftovers() -> list:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT state, query, backend_start FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            [settings.DATABASES["default"]["NAME"]],
        )
        return cursor.fetchall()


def test_many_concurrent_requests_leave_postgresql_connections_bounded(served):
    User.objects.create_user("olivia", "olivia@ops.example", PASSWORD, is_staff=True)
    client = Client()
    assert client.login(username="olivia", password=PASSWORD)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    before = others_connected()
    peak = [before]
    done = threading.Event()

    def sample() -> None:  # on a connection of its own, closed before anything is counted
        try:
            while not done.is_set():
                peak.append(others_connected() - 1)
                time.sleep(0.05)
        finally:
            connection.close()

    def get(n: int) -> int:
        request = urllib.request.Request(f"{served}/api/vms/?n={n}", headers={"Cookie": cookie})
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            statuses = list(pool.map(get, range(REQUESTS)))
    finally:
        done.set()
        sampler.join()

    assert statuses == [200] * REQUESTS
    # Each request (it reads its session, its user and the VMs) holds one connection while it
    # runs, never more than there are requests at once...
    assert max(peak) <= before + CONCURRENCY
    # ...and none outlives its request.
    deadline = time.monotonic() + 30
    while others_connected() > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert others_connected() == before, f"left open: {leftovers()}"


def test_the_web_app_refuses_persistent_connections_with_a_clear_message():
    env = {**os.environ, "DATABASE_CONN_MAX_AGE": "60", "DJANGO_SETTINGS_MODULE": "gpucap.settings"}
    started = subprocess.run(
        [sys.executable, "-c", "import gpucap.asgi"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode != 0
    assert "DATABASE_CONN_MAX_AGE=60" in started.stderr
    assert "set DATABASE_CONN_MAX_AGE=0" in started.stderr
