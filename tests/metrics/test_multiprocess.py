"""The web server runs several uvicorn workers; a scrape is answered by one of them but must
count the requests every worker answered (prometheus_client's multiprocess mode)."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis
import urllib3
from django.db import connection

from gpucap.notices.cache import KEY_PREFIX
from tests.conftest import TEST_METADATA_REDIS_URL
from tests.metrics.conftest import Scrape
from tests.rentals.conftest import _database_url

ROOT = Path(__file__).resolve().parents[2]
METADATA_TEST_REDIS = TEST_METADATA_REDIS_URL
NATIVE_404 = {"flavour": "native", "code": "404"}

# One process answering ``n`` metadata requests from an address that has no VM (404), as a
# uvicorn worker would, then exiting.
GUEST_REQUESTS = """
import asyncio, sys
import django
django.setup()
from gpucap.notices.metadata import metadata_app

async def one():
    scope = {"type": "http", "method": "GET", "path": "/metadata/v1/interruption",
             "query_string": b"", "headers": [], "client": ("10.88.0.1", 40000)}
    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}
    async def send(message):
        pass
    await metadata_app(scope, receive, send)

async def main(n):
    for _ in range(n):
        await one()

asyncio.run(main(int(sys.argv[1])))
"""


def _env(multiproc_dir: Path, **extra: str) -> dict:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "gpucap.settings",
        "PROMETHEUS_MULTIPROC_DIR": str(multiproc_dir),
        "METADATA_REDIS_URL": METADATA_TEST_REDIS,
        "LOG_LEVEL": "WARNING",
        **extra,
    }


def answer_in_processes(multiproc_dir: Path, *counts: int) -> None:
    """Run one process per count at once, each answering that many requests."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", GUEST_REQUESTS, str(n)], cwd=ROOT, env=_env(multiproc_dir)
        )
        for n in counts
    ]
    for process in processes:
        assert process.wait(timeout=60) == 0


def test_a_scrape_adds_up_the_counts_of_every_process(
    tmp_path, client, metrics_token, monkeypatch, fleet_east
):
    answer_in_processes(tmp_path, 3, 4)
    assert len(list(tmp_path.glob("counter_*.db"))) == 2

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    response = client.get("/metrics", headers={"Authorization": f"Bearer {metrics_token}"})
    seen = Scrape(response.content.decode())
    assert seen.value("gpucap_metadata_requests_total", **NATIVE_404) == 7
    assert seen.value("gpucap_metadata_request_duration_seconds_count", flavour="native") == 7
    # The fleet's gauges come with them.
    assert seen.value("gpucap_gpus", cluster="east", set="h100-east", state="free") == 16


def test_the_procfile_web_server_starts_afresh_and_every_worker_scrapes_the_same_counts(
    tmp_path, metrics_token, db
):
    """The Procfile's web line, as honcho runs it (sh -c), with two uvicorn workers: counts a
    previous run left are emptied at start, and each scrape, whichever worker answers it, adds
    up the requests both workers answered."""
    multiproc_dir = tmp_path / "prometheus"
    multiproc_dir.mkdir()
    answer_in_processes(multiproc_dir, 5)  # left by a previous run of the server
    left_over = {path.name for path in multiproc_dir.iterdir()}
    web = next(line for line in (ROOT / "Procfile").read_text().splitlines() if line[:4] == "web:")
    port = _free_port()
    env = _env(
        multiproc_dir,
        PORT=str(port),
        WEB_WORKERS="2",
        METRICS_TOKEN=metrics_token,
        DATABASE_URL=_database_url(connection.settings_dict),
        DATABASE_CONN_MAX_AGE="0",
    )
    log = (tmp_path / "web.log").open("w")
    server = subprocess.Popen(
        ["sh", "-c", web.removeprefix("web:").strip()],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        # The guests below ask from 127.0.0.1, which must have no VM: a document an earlier
        # test left there (a simulated replica listens on loopback) would answer 200.
        redis.Redis.from_url(METADATA_TEST_REDIS).delete(f"{KEY_PREFIX}127.0.0.1")
        http = urllib3.PoolManager(retries=False, timeout=10)
        base = f"http://127.0.0.1:{port}"
        _wait_until_up(http, base, server, tmp_path / "web.log")
        guests = 40
        for _ in range(guests):
            # A new connection each time, so both workers take some.
            response = http.request(
                "GET", f"{base}/metadata/v1/interruption", headers={"Connection": "close"}
            )
            assert response.status == 404
        scrapes = []
        for _ in range(6):
            response = http.request(
                "GET",
                f"{base}/metrics",
                headers={"Authorization": f"Bearer {metrics_token}", "Connection": "close"},
            )
            assert response.status == 200, response.data[:500]
            scrapes.append(Scrape(response.data.decode()))
        counted = {seen.value("gpucap_metadata_requests_total", **NATIVE_404) for seen in scrapes}
        assert counted == {guests}, (tmp_path / "web.log").read_text()[-2000:]
        assert not left_over & {path.name for path in multiproc_dir.iterdir()}
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_until_up(http: urllib3.PoolManager, base: str, server, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert server.poll() is None, log.read_text()
        try:
            if http.request("GET", f"{base}/healthz").status == 200:
                # Both workers: uvicorn starts them one after the other.
                time.sleep(1.0)
                return
        except urllib3.exceptions.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"the web server did not start: {log.read_text()[-2000:]}")
