"""Can the instance metadata endpoint carry 16,000 guests polling every 5 s? (``make bench``)

Runs gpucap.asgi:application as the Procfile deploys it (uvicorn, WORKERS processes,
--no-proxy-headers) on loopback, with 16,000 VM documents in a Redis database of its own
(REDIS_DB or BENCH_REDIS_URL, gpucap's keys emptied first), 5 % of them with an open notice. A
separate load process (wrk, from Debian) holds CONCURRENCY keep-alive connections for SECONDS
per phase:

1. metadata: ``GET /latest/meta-data/spot/instance-action`` with a valid IMDSv2 token, each
   request as a different guest: 127.0.0.1 is the trusted proxy and names the guest in
   X-Forwarded-For (200 with the notice for 5 %, 404 for the rest, as EC2 answers);
2. django: ``GET /healthz``, a trivial Django view through the whole middleware stack.

Goals (issue 5): metadata >= 3,200 requests/s with p99 < 50 ms, and >= 0.8 x the Django view.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import benchdb
import stack

ROOT = Path(__file__).resolve().parent.parent
GUESTS = 16_000
NOTIFIED_EVERY = 20  # 5 %
WORKERS = 2
CONCURRENCY = 32
SECONDS = 10
REDIS_DB = 13
GOAL_RPS = 3200
GOAL_P99_MS = 50
GOAL_RATIO = 0.8

ENV = {
    **os.environ,
    "DJANGO_SETTINGS_MODULE": "gpucap.settings",
    "DEBUG": "0",
    "SECRET_KEY": "bench-only-secret-key",
    "ALLOWED_HOSTS": "127.0.0.1",
    "METADATA_REDIS_URL": benchdb.redis_url(REDIS_DB),
    "METADATA_TRUSTED_PROXIES": "127.0.0.1",
    "LOG_LEVEL": "WARNING",
    # As the Procfile deploys it: the workers count requests in prometheus_client's
    # multiprocess files, and that counting is part of what is measured.
    "PROMETHEUS_MULTIPROC_DIR": tempfile.mkdtemp(prefix="bench-metadata-metrics-"),
}
atexit.register(shutil.rmtree, ENV["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)


def main() -> int:
    os.environ.update(ENV)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    if shutil.which("wrk") is None:
        print("wrk is not installed (make bench installs Debian's wrk)")
        return 2

    guests = guest_addresses()
    notified = write_documents(guests)
    port = stack.free_port()
    print("metadata load: gpucap.asgi:application under uvicorn on 127.0.0.1")
    print(
        f"{os.cpu_count()} CPUs, {WORKERS} uvicorn workers, {GUESTS:,} guests "
        f"({len(notified):,} notified), wrk: 1 thread, {CONCURRENCY} connections, "
        f"{SECONDS} s per phase\n"
    )
    server = stack.server_start(port, ENV, workers=WORKERS)
    try:
        check_answers(port, guests, notified)
        with tempfile.TemporaryDirectory() as scratch:
            script = Path(scratch) / "guests.lua"
            script.write_text(wrk_script(guests))
            metadata = run_wrk(port, "/latest/meta-data/spot/instance-action", script)
            django_view = run_wrk(port, "/healthz", None)
    finally:
        stack.process_stop(server)
    report(metadata, django_view)
    ratio = metadata["rps"] / django_view["rps"]
    met = metadata["rps"] >= GOAL_RPS and metadata["p99_ms"] < GOAL_P99_MS and ratio >= GOAL_RATIO
    print(
        f"\ngoals (>= {GOAL_RPS:,} req/s, p99 < {GOAL_P99_MS} ms, >= {GOAL_RATIO} x django): ",
        end="",
    )
    print("met" if met else "NOT met")
    return 0 if met else 1


def guest_addresses() -> list[str]:
    return [f"10.{1 + n // 65536}.{n // 256 % 256}.{n % 256}" for n in range(GUESTS)]


def write_documents(guests: list[str]) -> set[str]:
    """The documents gpucap.notices.cache keeps, straight into the bench's Redis database."""
    import redis

    from gpucap.notices.cache import KEY_PREFIX, SYNCED_KEY, metadata_key, utc_z
    from gpucap.redis_clients import keys_delete

    client = redis.Redis.from_url(ENV["METADATA_REDIS_URL"])
    keys_delete(client, f"{KEY_PREFIX}*")  # gpucap's documents only: the database is shared
    now = datetime.now(UTC)
    notified = set()
    pipe = client.pipeline(transaction=False)
    for n, address in enumerate(guests):
        notice = None
        if n % NOTIFIED_EVERY == 0:
            notified.add(address)
            notice = {
                "reason": "arbiter",
                "issued_at": utc_z(now),
                "deadline": utc_z(now + timedelta(seconds=120)),
            }
        pipe.set(metadata_key(address), json.dumps({"vm": f"vm-{n + 1}", "notice": notice}))
    pipe.set(SYNCED_KEY, "0")  # as a full resync leaves it: an absent document is no VM
    pipe.execute()
    return notified


def check_answers(port: int, guests: list[str], notified: set[str]) -> None:
    """Before measuring: the load's requests get the answers a guest should get."""
    from gpucap.notices.metadata import token_mint

    for address in (guests[0], guests[1], guests[-1]):
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/latest/meta-data/spot/instance-action",
            headers={
                "X-Forwarded-For": address,
                "X-aws-ec2-metadata-token": token_mint(address=address, ttl=3600),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                status, body = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, body = error.code, b""
        expected = 200 if address in notified else 404
        assert status == expected, (address, status, body)
        assert status == 404 or json.loads(body)["action"] == "stop"


def wrk_script(guests: list[str]) -> str:
    """Each request as the next guest: its address in X-Forwarded-For and its own token."""
    from gpucap.notices.metadata import token_mint

    rows = ",\n".join(
        f'{{"{address}","{token_mint(address=address, ttl=3600)}"}}' for address in guests
    )
    return f"""
local guests = {{
{rows}
}}
local n = 0
request = function()
  n = n + 1
  local guest = guests[(n % #guests) + 1]
  wrk.headers["X-Forwarded-For"] = guest[1]
  wrk.headers["X-aws-ec2-metadata-token"] = guest[2]
  return wrk.format("GET")
end
"""


def run_wrk(port: int, path: str, script: Path | None) -> dict:
    command = ["wrk", "-t1", f"-c{CONCURRENCY}", f"-d{SECONDS}s", "--latency", "--timeout", "5s"]
    if script is not None:
        command += ["-s", str(script)]
    output = subprocess.run(
        [*command, f"http://127.0.0.1:{port}{path}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=SECONDS + 60,
    ).stdout
    return {
        "path": path,
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1)),
        "p50_ms": _ms(re.search(r"^\s+50%\s+(\S+)", output, re.M).group(1)),
        "p99_ms": _ms(re.search(r"^\s+99%\s+(\S+)", output, re.M).group(1)),
        "requests": int(re.search(r"(\d+) requests in", output).group(1)),
        "non_2xx": int(m.group(1))
        if (m := re.search(r"Non-2xx or 3xx responses: (\d+)", output))
        else 0,
        "errors": _socket_errors(output),
    }


def _ms(value: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", value).groups()
    return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}[unit]


def _socket_errors(output: str) -> int:
    found = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output
    )
    return sum(int(n) for n in found.groups()) if found else 0


def report(metadata: dict, django_view: dict) -> None:
    header = (
        f"{'phase':<10} {'path':<40} {'requests':>9} {'req/s':>9} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'404s':>7} {'sock err':>8}"
    )
    print(header)
    print("-" * len(header))
    for name, row in (("metadata", metadata), ("django", django_view)):
        print(
            f"{name:<10} {row['path']:<40} {row['requests']:>9,} {row['rps']:>9,.0f} "
            f"{row['p50_ms']:>7.2f} {row['p99_ms']:>7.2f} {row['non_2xx']:>7,} {row['errors']:>8}"
        )
    ratio = metadata["rps"] / django_view["rps"]
    print(f"\nmetadata / django throughput: {ratio:.2f} x")


if __name__ == "__main__":
    sys.exit(main())
