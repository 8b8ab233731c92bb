"""The simulated fleet behaves like a real one: VMs boot after a delay and get an address,
stop, start and go away; every call is harmless twice; failures can be injected; and every
process sees the same fleet because it lives in Redis."""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connections
from redis.backoff import NoBackoff
from redis.retry import Retry

from gpucap.drivers.base import DriverError, DriverUnavailable, VmStatus
from gpucap.drivers.simulated import SimulatedDriver, ip_address_for
from tests.drivers.conftest import vm_spec

REPO = Path(__file__).resolve().parents[2]


def test_a_created_vm_boots_then_runs_with_its_address(simulated):
    driver = simulated(boot_seconds=0.4)

    created = driver.create(vm_spec("vm-42"))
    still_booting = driver.status("vm-42", "h100-001")
    time.sleep(0.5)
    booted = driver.status("vm-42", "h100-001")

    assert created == VmStatus(state="booting")
    assert still_booting == VmStatus(state="booting")
    assert booted == VmStatus(state="running", ip_address="10.200.0.42")


def test_with_no_boot_delay_a_vm_runs_at_once(simulated):
    assert simulated(boot_seconds=0).create(vm_spec("vm-7")).state == "running"


def test_the_default_boot_takes_a_few_seconds(simulated):
    driver = SimulatedDriver(namespace=simulated().namespace)

    assert driver.create(vm_spec("vm-1")).state == "booting"
    assert driver.status("vm-1", "h100-001").state == "booting"


def test_addresses_are_private_stable_and_distinct():
    addresses = [ip_address_for(f"vm-{n}") for n in range(1, 5001)]

    assert len(set(addresses)) == 5000
    assert all(a.startswith("10.20") for a in addresses)
    assert not [a for a in addresses if a.endswith((".0", ".255"))]
    assert ip_address_for("vm-255") == "10.200.1.1"
    assert ip_address_for("replica-a") == ip_address_for("replica-a")


def test_a_vm_is_on_its_node_only(simulated):
    driver = simulated()
    driver.create(vm_spec("vm-5", node="h100-001"))

    assert driver.status("vm-5", "h100-002") == VmStatus(state="missing")
    assert driver.status("vm-5", "h100-001").state == "running"


def test_stop_start_and_destroy(simulated):
    driver = simulated(boot_seconds=0.2)
    driver.create(vm_spec("vm-9"))
    time.sleep(0.3)

    stopped = driver.stop("vm-9", "h100-001")
    status_when_stopped = driver.status("vm-9", "h100-001")
    started = driver.start("vm-9", "h100-001")
    time.sleep(0.3)
    running_again = driver.status("vm-9", "h100-001")
    destroyed = driver.destroy("vm-9", "h100-001")

    assert stopped == status_when_stopped == VmStatus(state="stopped")
    assert started == VmStatus(state="booting")
    assert running_again == VmStatus(state="running", ip_address="10.200.0.9")
    assert destroyed == driver.status("vm-9", "h100-001") == VmStatus(state="missing")


def test_create_on_a_stopped_vm_boots_it_again(simulated):
    driver = simulated()
    driver.create(vm_spec("vm-9"))
    driver.stop("vm-9", "h100-001")

    assert driver.create(vm_spec("vm-9")).state == "running"


def test_stop_waits_for_the_guest_while_others_see_it_stopping(simulated):
    driver = simulated(stop_seconds=0.4)
    other_process = simulated(stop_seconds=0.4)
    driver.create(vm_spec("vm-3"))
    seen = []

    stopper = threading.Thread(target=lambda: seen.append(driver.stop("vm-3", "h100-001")))
    began = time.monotonic()
    stopper.start()
    time.sleep(0.15)
    meanwhile = other_process.status("vm-3", "h100-001")
    stopper.join(timeout=5)

    assert meanwhile == VmStatus(state="stopping")
    assert seen == [VmStatus(state="stopped")]
    assert time.monotonic() - began >= 0.35


def test_a_guest_slower_than_the_grace_period_is_forced_off(simulated):
    driver = simulated(stop_seconds=60)

    began = time.monotonic()
    driver.create(vm_spec("vm-3"))
    stopped = driver.stop("vm-3", "h100-001", grace_seconds=0.2)

    assert stopped.state == "stopped"
    assert stopped.message == "forced off: the guest did not shut down within 0.2 s"
    assert time.monotonic() - began < 5


def test_every_call_twice_is_harmless(simulated):
    driver = simulated(boot_seconds=0.4)

    first_create = driver.create(vm_spec("vm-8"))
    time.sleep(0.25)
    second_create = driver.create(vm_spec("vm-8"))  # must not restart the boot
    time.sleep(0.25)
    booted = driver.status("vm-8", "h100-001")
    stops = [driver.stop("vm-8", "h100-001"), driver.stop("vm-8", "h100-001")]
    starts = [driver.start("vm-8", "h100-001"), driver.start("vm-8", "h100-001")]
    time.sleep(0.5)
    restarted = driver.status("vm-8", "h100-001")
    destroys = [driver.destroy("vm-8", "h100-001"), driver.destroy("vm-8", "h100-001")]

    assert (first_create.state, second_create.state, booted.state) == (
        "booting",
        "booting",
        "running",
    )
    assert [s.state for s in stops] == ["stopped", "stopped"]
    assert [s.state for s in starts] == ["booting", "booting"]
    assert restarted.state == "running"
    assert [s.state for s in destroys] == ["missing", "missing"]


def test_stopping_a_missing_vm_changes_nothing(simulated):
    driver = simulated()

    assert driver.stop("vm-404", "h100-001") == VmStatus(state="missing")
    assert driver.status("vm-404", "h100-001") == VmStatus(state="missing")


def test_starting_a_vm_that_was_never_created_is_an_error(simulated):
    driver = simulated()

    with pytest.raises(DriverError, match="vm-404 is not defined on h100-001; create it first"):
        driver.start("vm-404", "h100-001")
    assert driver.status("vm-404", "h100-001") == VmStatus(state="missing")


def test_an_inference_replica_reports_its_model_servers_endpoint(simulated, settings):
    settings.SIMULATOR_BASE_URL = "http://127.0.0.1:8321"
    replica = simulated().create(vm_spec("vm-11", role="inference_replica"))
    rental = simulated().create(vm_spec("vm-12"))

    assert (replica.state, replica.ip_address, replica.endpoint_url) == (
        "running",
        "10.200.0.11",
        "http://127.0.0.1:8321/simulated/replicas/vm-11",
    )
    assert rental.endpoint_url is None, "a rental serves no model"


# --- failure injection -------------------------------------------------------------------------


def test_a_create_that_fails_twice_transiently_then_succeeds(simulated):
    driver = simulated()
    driver.failure_inject("create", "hypervisor unreachable", times=2, transient=True)

    outcomes = []
    for _ in range(3):
        try:
            outcomes.append(driver.create(vm_spec("vm-21")).state)
        except DriverUnavailable as error:
            outcomes.append(f"unavailable: {error}")

    assert outcomes == [
        "unavailable: hypervisor unreachable",
        "unavailable: hypervisor unreachable",
        "running",
    ]


def test_a_failed_call_changes_nothing(simulated):
    driver = simulated()
    driver.failure_inject("create", "no IOMMU group for 0000:18:00.0")

    with pytest.raises(DriverError, match="no IOMMU group") as raised:
        driver.create(vm_spec("vm-21"))

    assert type(raised.value) is DriverError  # permanent: the task must not retry
    assert driver.status("vm-21", "h100-001") == VmStatus(state="missing")


def test_a_permanent_failure_lasts_until_cleared(simulated):
    driver = simulated()
    driver.create(vm_spec("vm-22"))
    driver.failure_inject("stop", "guest wedged", times=None)

    for _ in range(5):
        with pytest.raises(DriverError, match="guest wedged"):
            driver.stop("vm-22", "h100-001")
    still_running = driver.status("vm-22", "h100-001")
    driver.failures_clear()

    assert still_running.state == "running"
    assert driver.stop("vm-22", "h100-001").state == "stopped"


def test_a_failure_for_one_vm_spares_the_others(simulated):
    driver = simulated()
    driver.failure_inject("create", "bad disk", times=None, instance_id="vm-31")

    with pytest.raises(DriverError, match="bad disk"):
        driver.create(vm_spec("vm-31"))
    assert driver.create(vm_spec("vm-32")).state == "running"


def test_a_lost_reply_takes_effect_and_a_retry_is_harmless(simulated):
    driver = simulated()
    driver.failure_inject("create", "reply lost", transient=True, after=True)

    with pytest.raises(DriverUnavailable, match="reply lost"):
        driver.create(vm_spec("vm-41"))
    created_anyway = driver.status("vm-41", "h100-001")
    retried = driver.create(vm_spec("vm-41"))

    assert created_anyway.state == retried.state == "running"


def test_status_can_fail_too(simulated):
    driver = simulated()
    driver.failure_inject("status", "connection reset", transient=True)

    with pytest.raises(DriverUnavailable, match="connection reset"):
        driver.status("vm-1", "h100-001")
    assert driver.status("vm-1", "h100-001").state == "missing"


def test_workers_racing_consume_each_injected_failure_exactly_once(simulated):
    driver = simulated()
    driver.failure_inject("create", "flaky", times=3, transient=True)
    results: list[str] = []
    barrier = threading.Barrier(12)

    def worker(n: int) -> None:
        mine = simulated()  # its own Redis connection, as a separate worker has
        barrier.wait()
        try:
            results.append(mine.create(vm_spec(f"vm-{100 + n}")).state)
        except DriverUnavailable:
            results.append("failed")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)

    assert sorted(results) == ["failed"] * 3 + ["running"] * 9


def test_settings_can_make_an_operation_fail_for_a_chaos_drill(simulated):
    permanent = simulated(fail={"create": "maintenance window"})
    transient = simulated(fail={"stop": {"message": "ssh timeout", "transient": True}})

    with pytest.raises(DriverError, match="maintenance window"):
        permanent.create(vm_spec("vm-51"))
    transient.create(vm_spec("vm-51"))
    with pytest.raises(DriverUnavailable, match="ssh timeout"):
        transient.stop("vm-51", "h100-001")


def test_failures_can_be_injected_with_plain_redis_commands(simulated, settings):
    driver = simulated()
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.hset(
        f"gpucap:sim:{driver.namespace}:fail:destroy",
        mapping={"message": "node on fire", "transient": 1, "remaining": 1},
    )

    with pytest.raises(DriverUnavailable, match="node on fire"):
        driver.destroy("vm-1", "h100-001")
    assert driver.destroy("vm-1", "h100-001").state == "missing"


def test_bad_failure_settings_name_the_problem(simulated):
    with pytest.raises(DriverError, match="fail: unknown operation 'reboot'"):
        simulated(fail={"reboot": "x"})
    with pytest.raises(DriverError, match="boot_seconds: must be at least 0, got -1"):
        simulated(boot_seconds=-1)
    with pytest.raises(DriverError, match="unknown setting 'boot_secs'"):
        simulated(boot_secs=1)


# --- one fleet for every process ---------------------------------------------------------------


def test_two_driver_objects_see_the_same_fleet(simulated, sim_namespace):
    one = simulated()
    other = SimulatedDriver(
        {"boot_seconds": 0},
        namespace=sim_namespace,
        # A client of its own on the same Redis, as another process has.
        redis_client=redis.Redis.from_url(settings.REDIS_URL, decode_responses=True),
    )

    one.create(vm_spec("vm-61"))
    seen_by_other = other.status("vm-61", "h100-001")
    other.stop("vm-61", "h100-001")

    assert seen_by_other.state == "running"
    assert one.status("vm-61", "h100-001").state == "stopped"


def test_another_process_sees_the_same_fleet(simulated, sim_namespace):
    driver = simulated()
    driver.create(vm_spec("vm-71"))
    child = (
        "import sys\n"
        "from gpucap.drivers.base import GpuDevice, VmSpec\n"
        "from gpucap.drivers.simulated import SimulatedDriver\n"
        "driver = SimulatedDriver({'boot_seconds': 0}, namespace=sys.argv[1])\n"
        "print(driver.status('vm-71', 'h100-001').state)\n"
        "driver.stop('vm-71', 'h100-001')\n"
    )

    result = subprocess.run(
        [sys.executable, "-c", child, sim_namespace],
        cwd=REPO,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "gpucap.settings"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "running"
    assert driver.status("vm-71", "h100-001").state == "stopped"


def test_each_database_has_a_fleet_of_its_own():
    assert SimulatedDriver().namespace == connections["default"].settings_dict["NAME"]


def test_an_unreachable_redis_is_a_transient_error(sim_namespace):
    driver = SimulatedDriver(
        namespace=sim_namespace,
        redis_client=redis.Redis(host="127.0.0.1", port=1, retry=Retry(NoBackoff(), 0)),
    )

    with pytest.raises(DriverUnavailable, match="simulated fleet unreachable"):
        driver.create(vm_spec("vm-1"))
    with pytest.raises(DriverUnavailable, match="simulated fleet unreachable"):
        driver.status("vm-1", "h100-001")


# --- the hypervisor probe ------------------------------------------------------------------------


def test_a_silenced_hypervisor_does_not_answer_until_restored(simulated, sim_namespace):
    driver = simulated()
    driver.create(vm_spec("vm-81"))
    other = SimulatedDriver(namespace=sim_namespace)  # another worker's view

    assert driver.hypervisor_answers("h100-001") is True
    driver.hypervisor_silence("h100-001")

    assert other.hypervisor_answers("h100-001") is False
    assert other.hypervisor_answers("h100-002") is True  # only that node
    assert driver.status("vm-81", "h100-001").state == "running"  # its VMs are left as they are

    other.hypervisor_restore("h100-001")
    assert driver.hypervisor_answers("h100-001") is True


def test_a_hypervisor_can_be_silenced_with_plain_redis_commands(simulated, sim_namespace):
    driver = simulated()
    driver.redis.set(f"gpucap:sim:{sim_namespace}:silent:h100-004", 1)

    assert driver.hypervisor_answers("h100-004") is False
    driver.reset()
    assert driver.hypervisor_answers("h100-004") is True


def test_with_redis_out_of_reach_no_hypervisor_answers(sim_namespace):
    driver = SimulatedDriver(
        namespace=sim_namespace,
        redis_client=redis.Redis(host="127.0.0.1", port=1, retry=Retry(NoBackoff(), 0)),
    )

    assert driver.hypervisor_answers("h100-001") is False
