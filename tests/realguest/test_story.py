"""Real guests on the libvirt driver, end to end (issue 14): through the REST API only, with a
real Celery worker and beat, Debian's libvirtd booting QEMU guests on a node's guest bridge, and
the shipped nginx proxy on 169.254.169.254 in front of the real metadata endpoint.

The spot story: acme's two spot VMs fill the node of an enforcing set; each guest's serial
console shows the tenant's key and the address gpucap gave it. globex asks for an on-demand VM,
the arbiter reclaims one spot VM, its guest reads the notice within a poll or two and powers
off; the GPUs are free before the deadline, the VM is pending with its disk kept, and when the
on-demand VM goes it resumes on the same node over the same disk. The other guest, asking with
the first guest's address in X-Forwarded-For, never reads that notice.

The replica story: a replica of a deployment boots the same image, whose init answers OpenAI
requests on port 8000; it joins the router only once its readiness probe answers, and the
official ``openai`` client's request through the router reaches it.
"""

import re
from datetime import UTC, datetime

import libvirt
import openai
import pytest

from gpucap.audit.models import AuditEvent
from gpucap.rentals.models import VirtualMachine
from tests.conftest import TEST_INFERENCE_REDIS_URL, TEST_METADATA_REDIS_URL
from tests.realguest import rig
from tests.rentals import conftest as rentals_fixtures

pytestmark = pytest.mark.django_db(transaction=True)

celery_queue = rentals_fixtures.celery_queue
workers = rentals_fixtures.workers

ACME_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHJlYWxndWVzdGFjbWU acme@laptop"
GLOBEX_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHJlYWxndWVzdGdsb2J globex@laptop"
NOTICE_SECONDS = 60
METADATA_REDIS_URL = TEST_METADATA_REDIS_URL  # the test runs' metadata Redis (conftest)
INFERENCE_REDIS_URL = TEST_INFERENCE_REDIS_URL
BOOT_TIMEOUT = 240  # QEMU emulation on a loaded 2-core machine: generous


# --- the rig, as an operator sets it up through the API -------------------------------------------


def ok(response, status=(200, 201)):
    statuses = status if isinstance(status, tuple) else (status,)
    assert response.status_code in statuses, (response.status_code, response.content[:2000])
    return response.json()


@pytest.fixture
def background(workers, settings):
    """A worker and beat, with the periodic tasks quick enough for a test."""
    settings.METADATA_REDIS_URL = METADATA_REDIS_URL
    settings.INFERENCE_REDIS_URL = INFERENCE_REDIS_URL
    env = {
        "METADATA_REDIS_URL": METADATA_REDIS_URL,
        "INFERENCE_REDIS_URL": INFERENCE_REDIS_URL,
        "PLANS_DEBOUNCE_SECONDS": "1",
        "PLANS_INTERVAL_SECONDS": "5",
        "RENTALS_RECONCILE_SECONDS": "2",
        "RENTALS_RECONCILE_GRACE_SECONDS": "30",
        "NOTICES_SWEEP_SECONDS": "1",
        "INFERENCE_PROBE_SECONDS": "1",
        "INFERENCE_AUTOSCALE_SECONDS": "2",
    }
    worker = workers(**env)
    beat = workers(beat=True, **env)
    return worker, beat


@pytest.fixture
def fleet(node, guest_image, accel, operator_api, tenant, other_tenant):
    """The rig's cluster, image, node and enforcing set with on-demand, spot and inference
    pools, created through the REST API as an operator would. Afterwards (once the worker is
    gone) the node is emptied: every domain, disk, seed and console of the test."""
    yield _fleet(node, guest_image, accel, operator_api, tenant, other_tenant)
    node_empty(node)


def node_empty(node) -> None:
    connection = libvirt.open(node.uri)
    try:
        for domain in connection.listAllDomains():
            if domain.isActive():
                domain.destroy()
            domain.undefine()
        pool = connection.storagePoolLookupByName("gpucap")
        pool.refresh(0)
        for volume in pool.listAllVolumes():
            volume.delete(0)
    finally:
        connection.close()
    for log in node.console("x").parent.iterdir():
        log.rename(log.with_suffix(".log.done"))


def _fleet(node, guest_image, accel, operator_api, tenant, other_tenant) -> dict:
    cluster = ok(
        operator_api.post(
            "/api/clusters/",
            {
                "name": "rig",
                "driver": "libvirt",
                "driver_settings": {
                    "uri": node.uri,
                    "storage_pool": "gpucap",
                    "domain_type": accel,
                    "firmware": "bios",
                    "gpu_passthrough": False,
                    "kernel_path": str(guest_image.kernel),
                    "initrd_path": str(guest_image.initrd),
                    "kernel_cmdline": "console=ttyS0 quiet",
                    "serial_log_path": str(node.console("{instance}")),
                    "vcpus_per_gpu": 1,
                    "memory_gib_per_gpu": 1,
                    "disk_gib": 1,
                    "grace_seconds": 20,
                    "poll_seconds": 0.2,
                },
            },
            format="json",
        )
    )
    ok(
        operator_api.post(
            "/api/images/",
            {
                "cluster": cluster["id"],
                "name": "tiny",
                "base_image": str(guest_image.disk),
                "default_user": "root",
                "ports": [8000],
                "description": "busybox guest of the real-guest tests",
            },
            format="json",
        )
    )
    the_node = ok(
        operator_api.post(
            "/api/nodes/",
            {
                "cluster": cluster["id"],
                "hostname": "rig-001",
                "gpu_model": "RIG-GPU",
                "fabric": "pcie",
                "gpu_count": 2,
                "guest_bridge": rig.BRIDGE,
                "guest_subnet": rig.GUEST_SUBNET,
            },
            format="json",
        )
    )
    the_set = ok(
        operator_api.post(
            "/api/capacity-sets/",
            {
                "cluster": cluster["id"],
                "name": "rig-set",
                "gpu_model": "RIG-GPU",
                "fabric": "pcie",
                "notice_seconds": NOTICE_SECONDS,
            },
            format="json",
        )
    )
    ok(operator_api.post(f"/api/nodes/{the_node['id']}/join-set/", {"capacity_set": the_set["id"]}))
    pools = {}
    for rank, (name, kind, tenants) in enumerate(
        [
            ("rig-ondemand", "on_demand", [other_tenant.slug]),
            ("rig-inference", "inference", [tenant.slug]),
            ("rig-spot", "spot", [tenant.slug]),
        ],
        start=1,
    ):
        pool = ok(
            operator_api.post(
                "/api/pools/",
                {
                    "name": name,
                    "kind": kind,
                    "cluster": cluster["id"],
                    "capacity_set": the_set["id"],
                    "rank": rank,
                },
                format="json",
            )
        )
        ok(operator_api.patch(f"/api/pools/{pool['id']}/", {"tenants": tenants}, format="json"))
        pools[name] = pool
    ok(operator_api.post(f"/api/capacity-sets/{the_set['id']}/mode/", {"mode": "enforce"}))
    return {"cluster": cluster, "node": the_node, "set": the_set, "pools": pools}


def request_vm(api, pool: dict, name: str, key: str) -> dict:
    return ok(
        api.post(
            "/api/vms/",
            {
                "pool": pool["id"],
                "name": name,
                "gpu_count": 1,
                "image": "tiny",
                "ssh_public_key": key,
            },
            format="json",
        )
    )


def vm_read(api, vm: dict) -> dict:
    return ok(api.get(f"/api/vms/{vm['id']}/"))


def wait_state(api, vm: dict, state: str, *, timeout=BOOT_TIMEOUT, logs=()) -> dict:
    def reached():
        current = vm_read(api, vm)
        return current if current["state"] == state else None

    try:
        return rig.wait_until(reached, timeout=timeout, what=f"{vm['name']} to be {state}")
    except AssertionError as error:
        raise AssertionError(f"{error}\n{_diagnosis(logs)}") from None


def console(node, instance_id: str) -> str:
    path = node.console(instance_id)
    return path.read_text(errors="replace") if path.exists() else ""


def wait_console(node, instance_id: str, pattern: str, *, after: int = 0, timeout=BOOT_TIMEOUT):
    """The first match of ``pattern`` in the guest's serial console past offset ``after``."""

    def seen():
        return re.search(pattern, console(node, instance_id)[after:])

    try:
        return rig.wait_until(seen, timeout=timeout, what=f"{instance_id} to print {pattern!r}")
    except AssertionError as error:
        raise AssertionError(f"{error}\n--- console ---\n{console(node, instance_id)}") from None


def _diagnosis(logs) -> str:
    return "\n".join(f"--- {name} ---\n{log()[-6000:]}" for name, log in logs)


def disks(node) -> list[str]:
    return sorted(path.name for path in node.pool_directory.iterdir())


# --- the spot story -------------------------------------------------------------------------------


def test_a_reclaimed_spot_guest_reads_its_notice_powers_off_and_resumes_on_its_disk(
    node, fleet, background, member_api, other_member_api, say
):
    worker, beat = background
    logs = (("worker", worker.log), ("beat", beat.log))
    spot = fleet["pools"]["rig-spot"]
    first = request_vm(member_api, spot, "spot-a", ACME_KEY)
    second = request_vm(member_api, spot, "spot-b", ACME_KEY)

    # Both boot; each guest prints the key it found in its seed and the address it configured.
    running = {
        vm["name"]: wait_state(member_api, vm, "running", logs=logs) for vm in (first, second)
    }
    for vm in running.values():
        address = vm["ip_address"]
        assert address.startswith("10.213.0.")
        assert vm["ssh_command"] == f"ssh root@{address}"
        wait_console(node, vm["instance_id"], re.escape(f"ssh key: {ACME_KEY}"))
        wait_console(node, vm["instance_id"], re.escape(f"address: {address}/24"))
        wait_console(node, vm["instance_id"], "instance-action: 404")
    assert len({vm["ip_address"] for vm in running.values()}) == 2

    # globex's on-demand VM makes the enforcing arbiter reclaim one spot VM.
    marks = {vm["instance_id"]: len(console(node, vm["instance_id"])) for vm in running.values()}
    demand = request_vm(other_member_api, fleet["pools"]["rig-ondemand"], "train", GLOBEX_KEY)

    # One guest reads its notice through 169.254.169.254 on one of its next polls, prints the
    # action and the deadline, and powers off.
    def a_guest_read_a_notice():
        for vm in running.values():
            found = re.search(
                r"notice: (\{.*\})", console(node, vm["instance_id"])[marks[vm["instance_id"]] :]
            )
            if found:
                return vm, found, datetime.now(UTC)
        return None

    try:
        read, line, seen_at = rig.wait_until(
            a_guest_read_a_notice, timeout=180, what="a guest to print a notice"
        )
    except AssertionError as error:
        raise AssertionError(f"{error}\n{_diagnosis(logs)}") from None
    victim = VirtualMachine.objects.get(pk=read["id"])
    notice = victim.notices.get()
    other = running["spot-b" if victim.name == "spot-a" else "spot-a"]
    deadline = notice.deadline.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert notice.reason == "arbiter"
    assert line.group(1) == f'{{"action":"stop","time":"{deadline}"}}'
    # How soon (an upper bound: the test looks every 0.2 s); bench/guest_notice.py measures it.
    say(
        f"the guest printed its notice {(seen_at - notice.issued_at).total_seconds():.1f} s "
        "after it was issued"
    )
    wait_console(node, victim.instance_id, "powering off", after=marks[victim.instance_id])

    # Off before the deadline: the GPUs are free, the spot VM waits for capacity with its disk.
    resumed = wait_state(member_api, {"id": victim.pk, "name": victim.name}, "pending", logs=logs)
    notice.refresh_from_db()
    assert notice.outcome == "guest_shutdown"
    assert notice.completed_at < notice.deadline
    assert resumed["gpus"] == []
    assert f"{victim.instance_id}.qcow2" in disks(node)
    wait_state(other_member_api, demand, "running", logs=logs)

    # The other guest polled all along, claiming the victim's address in X-Forwarded-For (while
    # the victim checkpointed for 3 s under notice, too), and read only its own 404.
    rig.wait_until(
        lambda: (
            console(node, other["instance_id"])[marks[other["instance_id"]] :].count(
                "instance-action: 404"
            )
            >= 2
        ),
        timeout=120,
        what="the other guest to keep polling",
    )
    other_console = console(node, other["instance_id"])
    assert "notice:" not in other_console
    assert "instance-action: 200" not in other_console

    # globex is done: capacity returns and the spot VM resumes on the same node, same disk.
    ok(other_member_api.delete(f"/api/vms/{demand['id']}/"), status=(200, 202, 204))
    mark = len(console(node, victim.instance_id))
    back = wait_state(member_api, {"id": victim.pk, "name": victim.name}, "running", logs=logs)
    assert back["node_hostname"] == "rig-001"
    wait_console(node, victim.instance_id, "disk: boot 2", after=mark)
    wait_console(
        node, victim.instance_id, re.escape(f"address: {back['ip_address']}/24"), after=mark
    )
    assert AuditEvent.objects.filter(
        object_type="virtualmachine",
        object_id=str(victim.pk),
        message__contains="resumed on its disk on rig-001",
    ).exists()


# --- the replica story ----------------------------------------------------------------------------


def test_a_replica_joins_the_router_once_its_probe_answers_and_serves_the_openai_client(
    node, fleet, background, member_api
):
    worker, beat = background
    logs = (("worker", worker.log), ("beat", beat.log))
    deployment = ok(
        member_api.post(
            "/api/deployments/",
            {
                "pool": fleet["pools"]["rig-inference"]["id"],
                "name": "tiny-chat",
                "model_name": "tiny",
                "gpus_per_replica": 1,
                "image": "tiny",
                "min_replicas": 1,
                "max_replicas": 1,
            },
            format="json",
        )
    )
    secret = ok(
        member_api.post(
            "/api/api-keys/", {"name": "ci", "deployment": deployment["id"]}, format="json"
        )
    )["key"]

    def replica():
        vm = VirtualMachine.objects.filter(deployment_id=deployment["id"]).first()
        return vm if vm is not None and vm.state == "running" else None

    vm = rig.wait_until(replica, timeout=BOOT_TIMEOUT, what="the replica to run")
    assert vm.endpoint_url == f"http://{vm.ip_address}:8000"
    wait_console(node, vm.instance_id, "served GET /v1/models")  # the readiness probe

    client = openai.OpenAI(
        base_url=f"{node.endpoint}/inference/{deployment['slug']}/v1",
        api_key=secret,
        max_retries=0,
        timeout=30,
    )

    def answered():
        try:
            return client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=4
            )
        except openai.APIStatusError as error:
            if error.status_code == 503:  # not in the route yet
                return None
            raise

    try:
        completion = rig.wait_until(answered, timeout=60, what="the router to route to it", every=1)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{_diagnosis(logs)}") from None
    assert completion.choices[0].message.content == f"hello from {vm.instance_id}"
    wait_console(node, vm.instance_id, "served POST /v1/chat/completions")
