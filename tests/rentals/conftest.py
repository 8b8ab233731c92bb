"""Rentals fixtures: VMs brought to any lifecycle state through the services, a record of the
tasks services send, the simulated fleet of this test database, and real Celery workers.

Workers run as subprocesses (``celery -A gpucap.celery worker``) against this pytest process's
test database and a Redis queue of its own, so a worker never takes a task another test run
sent, and the tests can kill one with SIGKILL as an operator's OOM killer would.
"""

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest
from django.db import connection

from gpucap.drivers.simulated import SimulatedDriver
from gpucap.rentals import services
from gpucap.rentals.models import VirtualMachine
from tests.rentals.vm_helpers import grant_pools

State = VirtualMachine.State
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGpucmVudGFscw acme@laptop"
ROOT = Path(__file__).resolve().parents[2]


# --- VMs in any state ----------------------------------------------------------------------------


@pytest.fixture
def pools(fleet_east, tenant, other_tenant) -> dict:
    """The fleet_east pools, opened to the tenants as the VM tests expect."""
    return grant_pools(fleet_east, tenant, other_tenant)


@pytest.fixture
def nodes(fleet_east) -> dict:
    return fleet_east["nodes"]


@pytest.fixture
def vm_in(fleet_east, tenant) -> Callable[..., VirtualMachine]:
    """``vm_in("running")``: a VM of tenant acme brought to that state the way production
    does, through the services (placed on ``node``'s GPUs ``gpus`` when it needs GPUs)."""
    names = itertools.count(1)

    def make(
        state: str,
        *,
        pool: str = "h100-spot",
        node: str = "h100-001",
        gpus: tuple[int, ...] = (0,),
    ) -> VirtualMachine:
        the_pool = fleet_east["pools"][pool]
        if not the_pool.tenants.filter(pk=tenant.pk).exists():
            the_pool.tenants.add(tenant)
        vm = services.vm_request(
            tenant=tenant,
            pool=the_pool,
            name=f"vm-{state}-{next(names)}",
            gpu_count=len(gpus),
            image="ubuntu-24.04-cuda-12.6",
            ssh_public_key=SSH_KEY,
        )
        if state == State.PENDING:
            return vm
        if state == State.TERMINATED:
            return services.vm_terminate(vm=vm)
        vm = services.vm_place(vm=vm, node=fleet_east["nodes"][node], gpu_indices=gpus)
        if state == State.PROVISIONING:
            return vm
        if state == State.FAILED:
            return services.vm_mark_failed(vm=vm, reason="the hypervisor caught fire")
        vm = services.vm_mark_running(vm=vm, ip_address="10.200.0.9")
        if state == State.RUNNING:
            return vm
        if state == State.NOTIFIED:
            return services.vm_transition(vm=vm, to=State.NOTIFIED)
        vm = services.vm_stop(vm=vm)
        if state == State.STOPPING:
            return vm
        assert state == State.STOPPED, state
        return services.vm_mark_stopped(vm=vm)

    return make


# --- tasks the services send --------------------------------------------------------------------


@pytest.fixture
def sent_tasks(monkeypatch) -> list[tuple[str, list]]:
    """Every task a service sends, as ``(name, args)``, instead of going to the broker. With
    ``django_capture_on_commit_callbacks(execute=True)`` it shows what is sent on commit. The
    planning loop's ticks (``plans.*``, sent by any change to a capacity set) are left out;
    tests/plans records those with ``sent_plan_tasks``."""
    return _record_sent(monkeypatch, lambda name: not name.startswith("plans."))


def _record_sent(monkeypatch, keep: Callable[[str], bool]) -> list[tuple[str, list]]:
    from gpucap.celery import app

    sent: list[tuple[str, list]] = []

    def send_task(name, args=None, **options):
        if keep(name):
            sent.append((name, list(args or [])))

    monkeypatch.setattr(app, "send_task", send_task)
    return sent


# --- the simulated fleet ------------------------------------------------------------------------


@pytest.fixture
def sim(db) -> SimulatedDriver:
    """The simulated fleet of this test database (the one ``driver_for`` gives tasks), emptied
    before and after the test. VMs it creates itself boot at once."""
    driver = SimulatedDriver({"boot_seconds": 0})
    driver.reset()
    yield driver
    driver.reset()


# --- real workers ---------------------------------------------------------------------------------


class Worker:
    """One ``celery worker`` subprocess in a process group of its own (or, with ``beat``, the
    ``celery beat`` that sends the periodic tasks, as ``make run`` runs it)."""

    def __init__(self, env: dict[str, str], log_path: Path, name: str, *, beat=False) -> None:
        self.log_path = log_path
        self.name = name
        self.ready_line = "beat: Starting..." if beat else f"{name} ready."
        self._log = log_path.open("ab")
        role = (
            ["beat", "--schedule", str(log_path.with_suffix(".schedule"))]
            if beat
            else [
                "worker",
                "--concurrency",
                "2",
                "--hostname",
                name,
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ]
        )
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "gpucap.celery", *role, "--loglevel", "INFO"],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready_line.encode() in self.log_path.read_bytes():
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"worker {self.name} did not start:\n{self.log()}")

    def kill(self) -> None:
        """SIGKILL the whole group (main process and pool children): no cleanup at all."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def celery_queue(celery_test_broker) -> str:
    """A queue only this pytest process uses, on the test broker; emptied before and after,
    including messages a killed worker left unacknowledged."""
    from gpucap.celery import app

    queue = f"gpucap-test-{os.getpid()}"
    previous = app.conf.task_default_queue
    app.conf.task_default_queue = queue
    queue_purge(queue)
    yield queue
    queue_purge(queue)
    app.conf.task_default_queue = previous


def queue_in_flight(queue: str) -> dict[str, dict]:
    """Messages of ``queue`` that are waiting or delivered but not yet acknowledged (running, or
    held for a countdown), by delivery tag (waiting ones under ``waiting-<n>``)."""
    from gpucap.celery import app

    with app.connection_for_write() as conn:
        client = conn.default_channel.client
        found = {
            f"waiting-{n}": json.loads(raw) for n, raw in enumerate(client.lrange(queue, 0, -1))
        }
        for tag, raw in client.hgetall("unacked").items():
            message, _exchange, routing_key = json.loads(raw)
            if routing_key == queue:
                found[tag.decode() if isinstance(tag, bytes) else tag] = message
    return found


def queue_purge(queue: str) -> None:
    """Drop every message of ``queue``, waiting or delivered and unacknowledged."""
    from gpucap.celery import app

    with app.connection_for_write() as conn:
        channel = conn.default_channel
        client = channel.client
        client.delete(*(channel._q_for_pri(queue, p) for p in channel.priority_steps))
        # kombu's Redis transport keeps unacknowledged messages in one hash per database and
        # would put ours back on our queue after the visibility timeout.
        for tag, raw in client.hgetall("unacked").items():
            if json.loads(raw)[2] == queue:
                client.hdel("unacked", tag)
                client.zrem("unacked_index", tag)


@pytest.fixture
def workers(transactional_db, celery_queue, tmp_path) -> Callable[..., Worker]:
    """``workers()`` starts a real worker on this test database and queue and waits until it
    is ready (``workers(beat=True)``: celery beat, sending to that queue). Every one started is
    killed at teardown, before the database is flushed."""
    from gpucap.celery import app

    started: list[Worker] = []
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "gpucap.settings",
        "DATABASE_URL": _database_url(connection.settings_dict),
        "DATABASE_CONN_MAX_AGE": "0",
        "CELERY_BROKER_URL": app.conf.broker_url,
        "CELERY_TASK_DEFAULT_QUEUE": celery_queue,
        "CELERY_TASK_ALWAYS_EAGER": "0",
        "RENTALS_POLL_SECONDS": "1",
        "RENTALS_DRIVER_RETRY_BACKOFF_SECONDS": "1",
        "RENTALS_DRIVER_MAX_RETRIES": "3",
        "PYTHONUNBUFFERED": "1",
    }

    def start(*, beat: bool = False, **extra_env: str) -> Worker:
        name = f"test{len(started) + 1}-{os.getpid()}@localhost"
        log = tmp_path / f"{'beat' if beat else 'worker'}{len(started) + 1}.log"
        worker = Worker({**env, **extra_env}, log, name, beat=beat)
        started.append(worker)
        worker.wait_ready()
        return worker

    yield start
    for worker in started:
        worker.kill()


def _database_url(db: dict) -> str:
    user = quote(db["USER"] or "", safe="")
    password = f":{quote(db['PASSWORD'], safe='')}" if db.get("PASSWORD") else ""
    credentials = f"{user}{password}@" if user else ""
    host = db["HOST"] or "127.0.0.1"
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgres://{credentials}{host}{port}/{db['NAME']}"


def wait_for(condition: Callable[[], object], *, timeout: float, what: str, log=None) -> object:
    """Poll ``condition`` until it returns something true; fail naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.1)
    detail = f"\n--- worker log ---\n{log()}" if log else ""
    raise AssertionError(f"timed out after {timeout} s waiting for {what}{detail}")
