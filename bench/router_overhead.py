"""What does the inference router add to a request? (``make bench``)

Runs gpucap.asgi:application as the Procfile deploys it (uvicorn, WORKERS processes,
--no-proxy-headers) on loopback. That one server is both the router and, as with `make run`, the
model simulator of a deployment's two simulated replicas, answering at once (time to first token
0, every token at once). The deployment's route document and an API key's document are written
straight into a Redis database of the bench's own (REDIS_DB or BENCH_REDIS_URL, gpucap's keys
emptied first), as the services publish them once both replicas' readiness probes have answered;
nothing else is needed, the router reads Redis only.

The same load, non-streamed chat completions with ``max_tokens`` 8 sent by wrk over keep-alive
connections, goes

- direct: to one replica's model server, ``/simulated/replicas/vm-1/v1/chat/completions``;
- router: through the router, ``/inference/<slug>/v1/chat/completions`` with the API key,

first with 1 connection (the latency one request sees: the router's overhead is the p50
difference) and then with CONCURRENCY connections (the most the machine answers: the
throughput ratio). Every router request also passes through the replica's model server, on the
same cores, so the ratio counts the router's whole cost. Each phase runs SECONDS in ROUNDS
rounds, direct and router taking turns, so a change in the machine's other load falls on both;
req/s is over all rounds, p50 and p99 are the median of the rounds'.

Goals (issue 7): overhead at p50 < 3 ms, router throughput >= 0.5 x direct.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import benchdb
import stack

ROOT = Path(__file__).resolve().parent.parent
WORKERS = 2
CONCURRENCY = 32
SECONDS = 10
ROUNDS = 5
REDIS_DB = 10
SLUG = "bench-chat"
MODEL = "bench/sim-8b"
REPLICAS = ("vm-1", "vm-2")
GOAL_OVERHEAD_MS = 3.0
GOAL_RATIO = 0.5
BODY = json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8}
)

ENV = {
    **os.environ,
    "DJANGO_SETTINGS_MODULE": "gpucap.settings",
    "DEBUG": "0",
    "SECRET_KEY": "bench-only-secret-key",
    "ALLOWED_HOSTS": "127.0.0.1",
    "REDIS_URL": benchdb.redis_url(REDIS_DB),
    "INFERENCE_REDIS_URL": benchdb.redis_url(REDIS_DB),
    "SIMULATOR_ENABLED": "1",  # the replicas' model servers are this same app
    "SIMULATOR_TTFT_MS": "0",
    "SIMULATOR_TOKENS_PER_SECOND": "0",
    "LOG_LEVEL": "WARNING",
    # As the Procfile deploys it: the workers count requests in prometheus_client's
    # multiprocess files, and that counting is part of what is measured.
    "PROMETHEUS_MULTIPROC_DIR": tempfile.mkdtemp(prefix="bench-router-metrics-"),
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

    port = stack.free_port()
    base = f"http://127.0.0.1:{port}"
    secret = write_documents(base)
    direct_path = f"/simulated/replicas/{REPLICAS[0]}/v1/chat/completions"
    router_path = f"/inference/{SLUG}/v1/chat/completions"
    print("router overhead: gpucap.asgi:application under uvicorn on 127.0.0.1")
    print(
        f"{os.cpu_count()} CPUs, {WORKERS} uvicorn workers (router and replicas' simulator), "
        f"{len(REPLICAS)} replicas, wrk: 1 thread, 1 then {CONCURRENCY} connections, "
        f"{SECONDS} s per phase in {ROUNDS} alternating rounds, chat completions of 8 tokens, "
        "not streamed\n"
    )
    server = stack.server_start(port, ENV, workers=WORKERS)
    try:
        check_answers(base, direct_path, router_path, secret)
        router_counted(clear=True)
        with tempfile.TemporaryDirectory() as scratch:
            script = Path(scratch) / "chat.lua"
            script.write_text(wrk_script(secret))
            rows = {}
            for connections in (1, CONCURRENCY):
                rounds = {"direct": [], "router": []}
                for _ in range(ROUNDS):
                    rounds["direct"].append(run_wrk(port, direct_path, script, connections))
                    rounds["router"].append(run_wrk(port, router_path, script, connections))
                for name, runs in rounds.items():
                    rows[(name, connections)] = combined(runs)
        counted = router_counted()
    finally:
        stack.process_stop(server)
    report(rows, counted)
    overhead = rows[("router", 1)]["p50_ms"] - rows[("direct", 1)]["p50_ms"]
    ratio = rows[("router", CONCURRENCY)]["rps"] / rows[("direct", CONCURRENCY)]["rps"]
    failures = sum(row["non_2xx"] + row["errors"] for row in rows.values())
    met = overhead < GOAL_OVERHEAD_MS and ratio >= GOAL_RATIO and failures == 0
    print(f"\nrouter overhead at p50 (1 connection): {overhead:.2f} ms")
    print(f"router / direct throughput ({CONCURRENCY} connections): {ratio:.2f} x")
    print(
        f"goals (overhead at p50 < {GOAL_OVERHEAD_MS:g} ms, throughput >= {GOAL_RATIO} x direct, "
        "no errors): ",
        end="",
    )
    print("met" if met else "NOT met")
    return 0 if met else 1


def write_documents(base: str) -> str:
    """The route document of a deployment with two running replicas and the document of an API
    key that opens it (gpucap.inference.cache's formats). Returns the key's secret."""
    import redis

    from gpucap.inference import cache, keys
    from gpucap.redis_clients import keys_delete

    client = redis.Redis.from_url(ENV["INFERENCE_REDIS_URL"])
    keys_delete(client, f"{cache.PREFIX}*")  # gpucap's documents only: the database is shared
    route = {
        "deployment": 1,
        "slug": SLUG,
        "model": MODEL,
        "tenant": "bench",
        "created": int(time.time()),
        # Room for the whole load on the replicas: the bench measures the router, not the queue.
        "replica_concurrency": CONCURRENCY,
        "queue_limit": CONCURRENCY,
        "replicas": [
            {"id": replica, "url": f"{base}/simulated/replicas/{replica}"} for replica in REPLICAS
        ],
    }
    secret, prefix, salt, digest = keys.key_new()
    key = {
        "tenant": "bench",
        "deployment": SLUG,
        "salt": salt,
        "digest": digest,
        "expires_at": None,
        "revoked": False,
    }
    client.set(cache.route_key(SLUG), json.dumps(route))
    client.set(cache.api_key_key(prefix), json.dumps(key))
    client.set(cache.synced_key(), "0")  # as a full resync leaves it: an absent key is no key
    return secret


def router_counted(*, clear: bool = False) -> int:
    """Requests the router counted (its requests-per-second counters); ``clear``: from zero."""
    import redis

    from gpucap.inference import cache

    client = redis.Redis.from_url(ENV["INFERENCE_REDIS_URL"])
    keys = list(client.scan_iter(match=cache.requests_key(SLUG, 0).removesuffix("0") + "*"))
    counted = sum(int(n) for n in client.mget(keys)) if keys else 0
    if clear and keys:
        client.delete(*keys)
    return counted


def check_answers(base: str, direct_path: str, router_path: str, secret: str) -> None:
    """Before measuring: both paths answer the load's request with the same completion, and
    the router spreads it over both replicas."""
    texts, replicas = set(), set()
    for path in (direct_path, router_path, router_path, router_path):
        request = urllib.request.Request(
            f"{base}{path}",
            data=BODY.encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {secret}"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 200, (path, response.status)
            texts.add(json.loads(response.read())["choices"][0]["message"]["content"])
            replicas.add(response.headers.get("x-gpucap-replica"))
    assert len(texts) == 1, texts
    assert replicas == {None, *REPLICAS}, replicas


def wrk_script(secret: str) -> str:
    return f"""
wrk.method = "POST"
wrk.body = {json.dumps(BODY)}
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {secret}"
"""


def combined(runs: list[dict]) -> dict:
    """Rounds of one phase as one: totals, and the median round's percentiles."""
    seconds = sum(run["seconds"] for run in runs)
    return {
        "requests": sum(run["requests"] for run in runs),
        "rps": sum(run["requests"] for run in runs) / seconds,
        "p50_ms": statistics.median(run["p50_ms"] for run in runs),
        "p99_ms": statistics.median(run["p99_ms"] for run in runs),
        "non_2xx": sum(run["non_2xx"] for run in runs),
        "errors": sum(run["errors"] for run in runs),
    }


def run_wrk(port: int, path: str, script: Path, connections: int) -> dict:
    command = [
        "wrk",
        "-t1",
        f"-c{connections}",
        f"-d{SECONDS / ROUNDS:g}s",
        "--latency",
        "--timeout",
        "5s",
        "-s",
        str(script),
        f"http://127.0.0.1:{port}{path}",
    ]
    output = subprocess.run(
        command, capture_output=True, text=True, check=True, timeout=SECONDS + 60
    ).stdout
    found = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m),", output)
    return {
        "seconds": _ms(found.group(2) + found.group(3)) / 1000,
        "p50_ms": _ms(re.search(r"^\s+50%\s+(\S+)", output, re.M).group(1)),
        "p99_ms": _ms(re.search(r"^\s+99%\s+(\S+)", output, re.M).group(1)),
        "requests": int(found.group(1)),
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


def report(rows: dict, counted: int) -> None:
    header = (
        f"{'phase':<8} {'conns':>5} {'requests':>9} {'req/s':>9} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'non-2xx':>7} {'sock err':>8}"
    )
    print(header)
    print("-" * len(header))
    for (name, connections), row in rows.items():
        print(
            f"{name:<8} {connections:>5} {row['requests']:>9,} {row['rps']:>9,.0f} "
            f"{row['p50_ms']:>7.2f} {row['p99_ms']:>7.2f} {row['non_2xx']:>7,} "
            f"{row['errors']:>8}"
        )
    routed = sum(row["requests"] for (name, _), row in rows.items() if name == "router")
    print(f"\nrequests the router counted: {counted:,} (wrk completed {routed:,} through it)")


if __name__ == "__main__":
    sys.exit(main())
