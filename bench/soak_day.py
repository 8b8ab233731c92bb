"""The compressed day of ``bench/soak.py``: who does what, through the real stack's HTTP API, and
what is recorded. Each actor is a thread that runs until the day ends:

- tenants request spot and on-demand VMs (``POST /api/vms/``), end them
  (``DELETE /api/vms/<id>/``) and list them, each with its own API token;
- operators drain a node (``POST /api/nodes/<id>/drain/``) and return it a little later
  (``POST /api/nodes/<id>/uncordon/``), reading the node list each round;
- inference clients send chat completions through the router with an API key, at a rate that
  follows a day's shape with a morning peak;
- an auditor runs ``audit_invariants``'s check (``invariants_audit``) every few seconds.
"""

from __future__ import annotations

import math
import random
import threading
import time
import traceback
from collections import Counter, defaultdict

import requests

SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHNvYWstYmVuY2gtb25seS1rZXktZ3B1Y2Fw bench@gpucap"
IMAGE = "ubuntu-24.04-cuda-12.6"
H100_SIZES = ((1, 0.30), (2, 0.30), (4, 0.25), (8, 0.15))
VMS_PER_TENANT = 24  # a tenant at this many live VMs ends one before asking for another
AUDIT_SECONDS = 5
DRAIN_EVERY_SECONDS = (12, 20)
DRAINED_SECONDS = 20  # a drained node returns after this long
DRAINED_AT_ONCE = 2
INFERENCE_CLIENTS = 6
HTTP_TIMEOUT = 30


def router_rate(hour: float) -> float:
    """Chat completions per second at ``hour`` of the day: a quiet night, a morning peak at
    09:00 and a smaller afternoon hump."""
    morning = 14.0 * math.exp(-(((hour - 9.0) / 1.5) ** 2))
    afternoon = 3.0 * math.exp(-(((hour - 14.5) / 2.5) ** 2))
    return 0.5 + morning + afternoon


class Recorder:
    """What the day's actors saw, shared by their threads: every API call's latency and status
    by what it was, the router's answers, and the audits."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.api = defaultdict(list)  # kind -> [(status, seconds)]
        self.router = Counter()  # status -> count
        self.audits = 0
        self.violations = 0
        self.violation_lines: list[str] = []
        self.audit_seconds: list[float] = []
        self.failed_actors: list[str] = []

    def actor_failed(self, name: str) -> None:
        with self.lock:
            self.failed_actors.append(name)

    def api_call(self, kind: str, status: int, seconds: float) -> None:
        with self.lock:
            self.api[kind].append((status, seconds))

    def router_answer(self, status: int) -> None:
        with self.lock:
            self.router[status] += 1

    def audit(self, report, seconds: float) -> None:
        with self.lock:
            self.audits += 1
            self.audit_seconds.append(seconds)
            self.violations += len(report.violations)
            for v in report.violations[: max(0, 5 - len(self.violation_lines))]:
                self.violation_lines.append(f"{v.rule}: {v.subject}: {v.why}")


class Api:
    """One user's REST client (its token, a keep-alive session) that records every call."""

    def __init__(self, base: str, token: str, recorder: Recorder) -> None:
        self.base, self.recorder = base, recorder
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Token {token}"

    def call(self, kind: str, method: str, path: str, body: dict | None = None):
        started = time.perf_counter()
        try:
            answer = self.session.request(
                method, f"{self.base}/api/{path}", json=body, timeout=HTTP_TIMEOUT
            )
        except requests.RequestException:
            self.recorder.api_call(kind, 0, time.perf_counter() - started)
            return None
        self.recorder.api_call(kind, answer.status_code, time.perf_counter() - started)
        return answer


class Day:
    """``minutes`` of wall time standing for 24 hours; every actor stops when it ends."""

    def __init__(self, minutes: float, recorder: Recorder) -> None:
        self.seconds = minutes * 60
        self.recorder = recorder
        self.started = time.monotonic()
        self.over = threading.Event()
        self.threads: list[threading.Thread] = []

    def hour(self) -> float:
        return 24.0 * min(1.0, (time.monotonic() - self.started) / self.seconds)

    def start(self, name: str, target, *args) -> None:
        def actor() -> None:
            try:
                target(*args)
            except Exception:
                # A dead actor would quietly thin the day's load: the day ends, and fails.
                traceback.print_exc()
                self.recorder.actor_failed(name)
                self.over.set()

        thread = threading.Thread(target=actor, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def run(self) -> None:
        """Until the day is over (or an actor's error ends it), then join the actors."""
        self.over.wait(max(0.0, self.seconds - (time.monotonic() - self.started)))
        self.over.set()
        for thread in self.threads:
            thread.join(timeout=HTTP_TIMEOUT + 30)

    def sleep(self, seconds: float) -> bool:
        """Sleep unless the day ends first; returns whether it goes on."""
        return not self.over.wait(seconds)


def tenant(day: Day, api: Api, slug: str, pools: dict[str, int], rng: random.Random) -> None:
    """Ask for VMs, mostly spot, 60 % on the NVSwitch set; end a random one when at the cap
    (and one time in ten anyway); list them every few actions."""
    live: list[int] = []
    made = 0
    while day.sleep(rng.uniform(0.3, 1.2)):
        if len(live) >= VMS_PER_TENANT or (live and rng.random() < 0.1):
            vm = live.pop(rng.randrange(len(live)))
            api.call("end VM", "DELETE", f"vms/{vm}/")
        else:
            made += 1
            nvswitch = rng.random() < 0.6
            kind = "spot" if rng.random() < 0.6 else "ondemand"
            sizes, weights = zip(*H100_SIZES, strict=True)
            answer = api.call(
                "request VM",
                "POST",
                "vms/",
                {
                    "pool": pools[f"{'h100' if nvswitch else 'l40s'}-{kind}"],
                    "name": f"{slug}-{made}",
                    "gpu_count": rng.choices(sizes, weights)[0] if nvswitch else 1,
                    "image": IMAGE,
                    "ssh_public_key": SSH_KEY,
                },
            )
            if answer is not None and answer.status_code == 201:
                live.append(answer.json()["id"])
        if made % 4 == 0:
            api.call("list VMs", "GET", "vms/?limit=100")


def operator(day: Day, api: Api, node_ids: list[int], rng: random.Random) -> None:
    """Drain a random node every DRAIN_EVERY_SECONDS (at most DRAINED_AT_ONCE at once) and
    return each after DRAINED_SECONDS; every node is returned when the day ends."""
    drained: dict[int, float] = {}
    while day.sleep(rng.uniform(*DRAIN_EVERY_SECONDS)):
        api.call("list nodes", "GET", "nodes/?limit=100")
        for node, since in list(drained.items()):
            if time.monotonic() - since >= DRAINED_SECONDS:
                api.call("uncordon node", "POST", f"nodes/{node}/uncordon/")
                del drained[node]
        if len(drained) < DRAINED_AT_ONCE:
            node = rng.choice([n for n in node_ids if n not in drained])
            answer = api.call("drain node", "POST", f"nodes/{node}/drain/")
            if answer is not None and answer.status_code == 200:
                drained[node] = time.monotonic()
    for node in drained:
        api.call("uncordon node", "POST", f"nodes/{node}/uncordon/")


def inference_client(day: Day, url: str, key: str, model: str, rng: random.Random) -> None:
    """One of INFERENCE_CLIENTS clients sending chat completions at its share of the day's
    rate (exponential gaps), one at a time."""
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {key}"
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
    while day.sleep(rng.expovariate(router_rate(day.hour()) / INFERENCE_CLIENTS)):
        try:
            answer = session.post(url, json=body, timeout=HTTP_TIMEOUT)
            day.recorder.router_answer(answer.status_code)
        except requests.RequestException:
            day.recorder.router_answer(0)


def auditor(day: Day) -> None:
    """``audit_invariants`` (its check, in this process) every AUDIT_SECONDS."""
    while day.sleep(AUDIT_SECONDS):
        audit_once(day.recorder)


def audit_once(recorder: Recorder) -> None:
    from django.db import connection

    from gpucap.plans.invariants import invariants_audit

    started = time.perf_counter()
    try:
        report = invariants_audit()
    finally:
        connection.close()
    recorder.audit(report, time.perf_counter() - started)
