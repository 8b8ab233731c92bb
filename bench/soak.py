"""Does a compressed day on the whole stack keep every rule and every deadline? (``make bench``)

Builds a fleet in a PostgreSQL database of its own (DB_NAME, created and migrated here, dropped
at the end) from a fleet file (FLEET, through ``fleet_file_apply``): an NVSwitch H100 capacity
set of 14 x 8 GPUs and a PCIe L40S set of 6 x 4 on the simulated driver, ranked pools with
floors (inference over on-demand over spot), three tenants and an operator, and a short notice
(NOTICE_SECONDS) so that many deadlines fall due within the day. Then it starts the stack on
loopback as ``make run`` does, with fast periodic intervals (FAST): uvicorn serving
gpucap.asgi:application (2 workers; also the simulated replicas' model server), two Celery
workers and celery beat, on a Redis database of the bench's own (REDIS_DB or BENCH_REDIS_URL;
only gpucap's keys and its queue are deleted at the end, nothing is flushed).

Through the REST API the operator switches both sets to ``enforce``, a tenant deploys a model in
the inference pool with an API key, and the day (``--minutes``, 3 by default, standing for 24
hours) is driven by ``soak_day``: tenants requesting and ending VMs, operators draining and
returning nodes, inference traffic with a morning peak through the router, and the invariant
audit every few seconds. At the end of the day the sets go back to dry-run (no new notices),
the open notices are waited for, and the audit runs once more.

Measured: every API call's latency (client side, over loopback), the router's answers, plans
applied, notices sent, and each deadline's lateness: from the notice's deadline to when its VM
let go of its GPUs (the notice's ``completed_at``: the worker saw the VM off on the hypervisor
and stopped it), and to when the stop was sent (its ``vm.stopping`` audit event). Goals
(issue 16): no invariant violation, no 5xx answer, and at least 99 % of deadlines kept within
2 s.

``--keep`` keeps the database for a look afterwards.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

import benchdb
import requests
import soak_day
import soak_report
import stack

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "gpucap_bench_soak"
REDIS_DB = 9
QUEUE = "bench-soak"
SEED = 20261202
MINUTES = 3.0
NOTICE_SECONDS = 10
MODEL = "soak/sim-8b"
PASSWORD = "soak-bench-password"
TENANTS = ("acme", "globex", "initech")
FAST = {
    "NOTICES_SWEEP_SECONDS": "1",
    "PLANS_INTERVAL_SECONDS": "5",
    "RENTALS_POLL_SECONDS": "1",
    "RENTALS_RECONCILE_SECONDS": "5",
    "INFERENCE_AUTOSCALE_SECONDS": "2",
    "INFERENCE_PROBE_SECONDS": "2",
}
FLEET = f"""
version: 1
tenants:
{
    "".join(
        f'''
  - name: {slug.title()}
    slug: {slug}
    members: [{{username: {slug}-dev, role: admin, password: {PASSWORD}}}]'''
        for slug in TENANTS
    )
}
operators:
  - {{username: soak-ops, password: {PASSWORD}}}
clusters:
  - name: soak
    driver: simulated
    nodes:
      - {{hostname: "h100-{{:03d}}", count: 14, gpu_model: H100-SXM5-80GB, fabric: nvswitch,
          gpus: 8, capacity_set: h100-soak}}
      - {{hostname: "l40s-{{:03d}}", count: 6, gpu_model: L40S, fabric: pcie, gpus: 4,
          capacity_set: l40s-soak}}
capacity_sets:
  - {{name: h100-soak, cluster: soak, gpu_model: H100-SXM5-80GB, fabric: nvswitch,
      notice_seconds: {NOTICE_SECONDS}}}
  - {{name: l40s-soak, cluster: soak, gpu_model: L40S, fabric: pcie,
      notice_seconds: {NOTICE_SECONDS}}}
pools:
  - {{name: h100-inference, kind: inference, cluster: soak, capacity_set: h100-soak, rank: 1,
      floor_gpus: 2, tenants: [acme]}}
  - {{name: h100-ondemand, kind: on_demand, cluster: soak, capacity_set: h100-soak, rank: 2,
      tenants: [{", ".join(TENANTS)}]}}
  - {{name: h100-spot, kind: spot, cluster: soak, capacity_set: h100-soak, rank: 3,
      floor_gpus: 8, tenants: [{", ".join(TENANTS)}]}}
  - {{name: l40s-ondemand, kind: on_demand, cluster: soak, capacity_set: l40s-soak, rank: 1,
      floor_gpus: 4, tenants: [{", ".join(TENANTS)}]}}
  - {{name: l40s-spot, kind: spot, cluster: soak, capacity_set: l40s-soak, rank: 2,
      tenants: [{", ".join(TENANTS)}]}}
images:
  - {{name: {soak_day.IMAGE}, cluster: soak, base_image: /var/lib/gpucap/images/ubuntu.qcow2}}
  - {{name: gpucap-model-server, cluster: soak, ports: [8000],
      base_image: /var/lib/gpucap/images/gpucap-model-server.qcow2}}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=MINUTES, help="wall time of the day")
    parser.add_argument("--keep", action="store_true", help=f"keep database {DB_NAME}")
    args = parser.parse_args()
    # A SIGTERM (make interrupted, a CI timeout) runs the cleanup below as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    port = stack.free_port()
    base = f"http://127.0.0.1:{port}"
    scratch = tempfile.TemporaryDirectory(prefix="bench-soak-")
    env = {
        **os.environ,
        **benchdb.bench_env(db_name=DB_NAME, redis_db=REDIS_DB, queue=QUEUE),
        **FAST,
        "ALLOWED_HOSTS": "127.0.0.1",
        "STATIC_ROOT": scratch.name,  # WhiteNoise wants it to exist when DEBUG is off
        "PROMETHEUS_MULTIPROC_DIR": scratch.name,
        "SIMULATOR_ENABLED": "1",
        "SIMULATOR_BASE_URL": base,
        "SIMULATOR_TOKENS_PER_SECOND": "50",  # 16 tokens take a third of a second
    }
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    benchdb.database_create(env["DATABASE_URL"])
    processes = []
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
        fleet_load()
        processes.append(stack.server_start(port, env, workers=2))
        for name in ("worker1", "worker2", "beat"):
            log = Path(scratch.name) / f"{name}.log"
            processes.append(stack.celery_start(env, log, beat=name == "beat"))
        return run(base, args.minutes, logs=Path(scratch.name))
    finally:
        for process in processes:
            stack.process_stop(process)
        from django.db import connections

        connections.close_all()
        if args.keep:
            print(f"\nkept database {DB_NAME} (drop it when done)")
        else:
            benchdb.database_drop(env["DATABASE_URL"])
        benchdb.redis_forget(env["REDIS_URL"], QUEUE)
        scratch.cleanup()


def fleet_load() -> None:
    from gpucap.fleet.fleetfile import fleet_file_apply, fleet_file_parse

    fleet_file_apply(fleet_file_parse(FLEET, source="bench/soak.py"))


def run(base: str, minutes: float, *, logs: Path) -> int:
    recorder = soak_day.Recorder()
    rng = random.Random(SEED)
    ops = soak_day.Api(base, token(base, "soak-ops"), recorder)
    sets = {
        s["name"]: s["id"] for s in ops.call("setup", "GET", "capacity-sets/").json()["results"]
    }
    pools = {p["name"]: p["id"] for p in ops.call("setup", "GET", "pools/").json()["results"]}
    nodes = [n["id"] for n in ops.call("setup", "GET", "nodes/?limit=100").json()["results"]]
    for set_id in sets.values():
        ops.call("set mode", "POST", f"capacity-sets/{set_id}/mode/", {"mode": "enforce"})
    tenants = {slug: soak_day.Api(base, token(base, f"{slug}-dev"), recorder) for slug in TENANTS}
    url, key = deployment_create(base, tenants["acme"], pools["h100-inference"])
    print("soak: a compressed day on gpucap.asgi:application (uvicorn), 2 Celery workers, beat")
    print(
        f"{os.cpu_count()} CPUs, {len(nodes)} nodes in 2 enforced sets, notices of "
        f"{NOTICE_SECONDS} s, {len(TENANTS)} tenants, {soak_day.INFERENCE_CLIENTS} inference "
        f"clients, a day of {minutes:g} minutes, load average {os.getloadavg()[0]:.1f}\n"
    )

    day = soak_day.Day(minutes, recorder)
    for slug, api in tenants.items():
        day.start(f"tenant {slug}", soak_day.tenant, day, api, slug, pools, rng_for(rng))
    day.start("operator", soak_day.operator, day, ops, nodes, rng_for(rng))
    for n in range(soak_day.INFERENCE_CLIENTS):
        day.start(f"client {n}", soak_day.inference_client, day, url, key, MODEL, rng_for(rng))
    day.start("auditor", soak_day.auditor, day)
    started = time.monotonic()
    day.run()
    day_seconds = time.monotonic() - started

    for set_id in sets.values():  # evening: nothing new is reclaimed, sent notices run out
        ops.call("set mode", "POST", f"capacity-sets/{set_id}/mode/", {"mode": "dry_run"})
    settled = soak_report.notices_settle(timeout=NOTICE_SECONDS + 120)
    soak_day.audit_once(recorder)
    return soak_report.report(
        recorder, day_seconds=day_seconds, settled=settled, logs=sorted(logs.glob("*.log"))
    )


def listed(api: soak_day.Api, path: str) -> list[dict]:
    answer = api.call("setup", "GET", path)
    answer.raise_for_status()
    return answer.json()["results"]


def rng_for(rng: random.Random) -> random.Random:
    return random.Random(rng.random())


def token(base: str, username: str) -> str:
    answer = requests.post(
        f"{base}/api/token/", data={"username": username, "password": PASSWORD}, timeout=30
    )
    answer.raise_for_status()
    return answer.json()["token"]


def deployment_create(base: str, api: soak_day.Api, pool: int) -> tuple[str, str]:
    """acme's chat deployment (1-4 replicas of 1 GPU, scaling at 1 request in flight each) and
    a key for it; returns once the router answers through it. Returns its URL and the key."""
    deployment = api.call(
        "setup",
        "POST",
        "deployments/",
        {
            "pool": pool,
            "name": "chat",
            "model_name": MODEL,
            "gpus_per_replica": 1,
            "min_replicas": 1,
            "max_replicas": 4,
            "target_in_flight": 1,
            "scale_down_cooldown_seconds": 20,
        },
    ).json()
    key = api.call("setup", "POST", "api-keys/", {"name": "soak", "deployment": deployment["id"]})
    url = f"{base}/inference/{deployment['slug']}/v1/chat/completions"
    secret = key.json()["key"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        answer = requests.post(
            url,
            headers={"Authorization": f"Bearer {secret}"},
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        if answer.status_code == 200:
            return url, secret
        time.sleep(0.5)
    raise SystemExit(f"the deployment's router never answered 200 (last: {answer.status_code})")


if __name__ == "__main__":
    sys.exit(main())
