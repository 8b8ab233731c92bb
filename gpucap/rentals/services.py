"""Every change to a VM goes through here. ``vm_transition`` is the one place a VM changes
state: it locks the row, refuses an illegal move with a clear error, releases GPUs when the VM
stops holding them, writes the audit event and sends ``vm_transitioned``
(gpucap/rentals/signals.py), to which the apps that follow a VM's lifecycle (usage, notices,
plans, inference) subscribe. Driver work is enqueued after commit, never done here."""

import re
from collections.abc import Iterable

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from gpucap.allocation.models import TenantQuota
from gpucap.allocation.selectors import quota_refusal
from gpucap.arbiter.topology import gpu_count_problem, node_partitions
from gpucap.audit.services import Actor, audit_record
from gpucap.drivers.seed import user_data_problem
from gpucap.errors import Conflict
from gpucap.fleet.models import Gpu, Node, Pool
from gpucap.fleet.selectors import images_offered
from gpucap.fleet.services import capacity_set_bump
from gpucap.rentals.guest_network import guest_address_release, guest_address_take
from gpucap.rentals.models import Allocation, GuestAddress, VirtualMachine
from gpucap.rentals.signals import vm_transitioned
from gpucap.tasks import enqueue_on_commit
from gpucap.tenancy.models import Tenant

State = VirtualMachine.State
StopReason = VirtualMachine.StopReason

# Legal moves (DESIGN.md section 4). Anything else is an error, never a silent change.
TRANSITIONS: dict[str, frozenset[str]] = {
    State.PENDING: frozenset({State.PROVISIONING, State.TERMINATED, State.FAILED}),
    # -> pending from a state that holds GPUs: a spot VM whose host was lost (vm_host_lost).
    State.PROVISIONING: frozenset({State.RUNNING, State.STOPPING, State.FAILED, State.PENDING}),
    State.RUNNING: frozenset({State.NOTIFIED, State.STOPPING, State.FAILED, State.PENDING}),
    State.NOTIFIED: frozenset({State.STOPPING, State.FAILED, State.PENDING}),
    State.STOPPING: frozenset({State.STOPPED, State.PENDING, State.TERMINATED, State.FAILED}),
    State.STOPPED: frozenset({State.PENDING, State.TERMINATED}),
    State.FAILED: frozenset({State.PENDING, State.TERMINATED}),
    State.TERMINATED: frozenset(),
}
# States in which a VM holds GPUs (has live allocations and an open usage interval).
HOLDING = frozenset({State.PROVISIONING, State.RUNNING, State.NOTIFIED, State.STOPPING})


def name_pattern(longest: int) -> re.Pattern[str]:
    """A name as VMs and jobs take one (a DNS label): 1 to ``longest`` lowercase letters,
    digits or hyphens, starting and ending with a letter or digit."""
    return re.compile(rf"^[a-z0-9]([a-z0-9-]{{0,{longest - 2}}}[a-z0-9])?$")


def name_rule(longest: int) -> str:
    """What `name_pattern` asks for, in words."""
    return (
        f"must be 1-{longest} lowercase letters, digits or hyphens, starting and ending with a "
        "letter or digit"
    )


MAX_VM_NAME = 63
_NAME = name_pattern(MAX_VM_NAME)
_SSH_KEY = re.compile(
    r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com"
    r"|sk-ecdsa-sha2-nistp256@openssh\.com) [A-Za-z0-9+/]+={0,3}( \S.*)?$"
)


class IllegalTransition(Conflict):
    def __init__(self, vm: VirtualMachine, to: str) -> None:
        super().__init__(
            f"{vm.instance_id} is {vm.state}; it cannot become {to}", code="illegal_transition"
        )


# --- the one transition ------------------------------------------------------------------------


@transaction.atomic
def vm_transition(
    *,
    vm: VirtualMachine,
    to: str,
    actor: Actor = None,
    message: str = "",
    **changes,
) -> VirtualMachine:
    """Move ``vm`` to state ``to`` under a row lock, with ``changes`` to other fields."""
    locked = VirtualMachine.objects.select_for_update(no_key=True).get(pk=vm.pk)
    if to not in TRANSITIONS[locked.state]:
        raise IllegalTransition(locked, to)
    before = {"state": locked.state}
    now = timezone.now()
    if to == State.RUNNING:
        changes.setdefault("started_at", now)
    if to in (State.STOPPED, State.FAILED, State.TERMINATED) and locked.state in HOLDING:
        changes.setdefault("stopped_at", now)
    if to == State.PENDING:
        changes.setdefault("requested_at", now)
    if to not in (State.STOPPING, State.NOTIFIED):
        changes.setdefault("stop_reason", "")
        changes.setdefault("preempted_for", None)
    after = {"state": to}
    for field, value in changes.items():
        if getattr(locked, field) != value and field != "requested_at":
            before[field], after[field] = _plain(getattr(locked, field)), _plain(value)
        setattr(locked, field, value)
    locked.state = to
    locked.save()
    if before["state"] in HOLDING and to not in HOLDING:
        Allocation.objects.filter(vm=locked, released_at=None).update(released_at=now)
        guest_address_release(vm=locked, at=now)
    audit_record(
        actor=actor, verb=f"vm.{to}", target=locked, before=before, after=after, message=message
    )
    # Usage, notices, plans and inference follow from here, each in its own app.
    vm_transitioned.send(
        sender=VirtualMachine,
        vm=locked,
        old=before["state"],
        new=to,
        now=now,
        node_id=locked.node_id,
    )
    vm.__dict__.update(locked.__dict__)
    return locked


def _plain(value):
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "pk"):
        return str(value)
    return value


# --- requests from tenants ---------------------------------------------------------------------


@transaction.atomic
def vm_request(
    *,
    tenant: Tenant,
    pool: Pool,
    name: str,
    gpu_count: int,
    image: str,
    ssh_public_key: str,
    actor: Actor = None,
    role: str = VirtualMachine.Role.RENTAL,
    deployment=None,
    demand_group: str = "",
    user_data: str = "",
    job: str = "",
    announce: bool = True,
) -> VirtualMachine:
    """A tenant asks for a GPU VM. It waits in ``pending`` until capacity is found. Inference
    replicas are asked for by the inference services (``deployment``, and a
    ``demand_group`` shared by the replicas of one scale-up step); the VMs of a tenant's job
    by ``gpucap.rentals.jobs`` (``job`` and its ``demand_group``, announced once for the
    whole job: ``announce=False``, then ``demand_added``). ``user_data`` is the
    tenant's own cloud-init user-data for the guest (checked as the seed will use it)."""
    errors: dict[str, str] = {}
    if not pool.tenants.filter(pk=tenant.pk).exists():
        errors["pool"] = f"tenant {tenant.slug} may not use pool {pool.name}"
    elif pool.kind == Pool.Kind.INFERENCE and role == VirtualMachine.Role.RENTAL:
        errors["pool"] = f"pool {pool.name} serves inference deployments, not rentals"
    elif role == VirtualMachine.Role.INFERENCE_REPLICA and (
        pool.kind != Pool.Kind.INFERENCE or deployment is None
    ):
        errors["pool"] = "an inference replica needs a deployment in an inference pool"
    if not isinstance(gpu_count, int) or isinstance(gpu_count, bool):
        errors["gpu_count"] = f"must be a whole number of GPUs, got {gpu_count!r}"
    else:
        problem = gpu_count_problem(pool.fabric, gpu_count)
        if problem:
            errors["gpu_count"] = f"pool {pool.name}: {problem}"
    if not isinstance(name, str) or not _NAME.match(name):
        errors["name"] = name_rule(MAX_VM_NAME)
    elif (
        VirtualMachine.objects.filter(tenant=tenant, name=name)
        .exclude(state=State.TERMINATED)
        .exists()
    ):
        errors["name"] = f"your tenant already has a VM named {name!r}"
    if "pool" not in errors:
        problem = image_problem(pool=pool, image=image)
        if problem:
            errors["image"] = problem
    if not isinstance(ssh_public_key, str) or not _SSH_KEY.match(ssh_public_key.strip()):
        errors["ssh_public_key"] = (
            "must be one OpenSSH public key line, e.g. 'ssh-ed25519 AAAA... you@laptop'"
        )
    if not isinstance(user_data, str):
        errors["user_data"] = "must be text"
    elif user_data_problem(user_data):
        errors["user_data"] = user_data_problem(user_data)
    if not errors and role == VirtualMachine.Role.RENTAL:
        errors.update(_quota_refusal(tenant=tenant, pool=pool, gpu_count=gpu_count))
    if errors:
        raise ValidationError(errors)
    vm = VirtualMachine.objects.create(
        tenant=tenant,
        pool=pool,
        name=name,
        role=role,
        gpu_count=gpu_count,
        image=image.strip(),
        ssh_public_key=ssh_public_key.strip(),
        requested_at=timezone.now(),
        created_by=actor if actor is not None and actor.is_authenticated else None,
        deployment=deployment,
        demand_group=demand_group,
        user_data=user_data,
        job=job,
    )
    audit_record(
        actor=actor,
        verb="vm.request",
        target=vm,
        after={
            "pool": pool.name,
            "gpu_count": gpu_count,
            "image": vm.image,
            **({"job": job} if job else {}),
        },
    )
    if announce:
        demand_added(pool=pool)
    return vm


def _quota_refusal(*, tenant: Tenant, pool: Pool, gpu_count: int) -> dict[str, str]:
    """A rental past one of the tenant's quotas (gpucap/allocation) is refused at once, naming
    the quota and what holds it. The tenant's row is locked first when it has a quota, so two
    requests racing cannot both take the last room. Inference replicas are not refused here:
    the autoscaler's scale-up is a demand like any other, and the arbiter never places it past
    a quota (the snapshot carries the quotas), so a deployment waits rather than fails."""
    if not TenantQuota.objects.filter(tenant=tenant).exists():
        return {}
    Tenant.objects.select_for_update(no_key=True).filter(pk=tenant.pk).first()
    return quota_refusal(tenant=tenant, pool=pool, gpu_count=gpu_count)


def demand_added(*, pool: Pool) -> None:
    """New pending VMs of ``pool`` can alter a plan: bump its set's generation (read now, not
    from ``pool`` as passed in), or place on its cluster's standalone nodes."""
    capacity_set_id = Pool.objects.filter(pk=pool.pk).values_list("capacity_set_id", flat=True)
    capacity_set_bump(capacity_set_id=capacity_set_id.first())
    _demand_changed(pool)


def image_problem(*, pool: Pool, image: object) -> str:
    """Why ``image`` is not a choice for a VM of ``pool`` (an enabled image of the catalogue of
    the pool's cluster), naming the choices; "" when it is."""
    offered = [offered.name for offered in images_offered(cluster_id=pool.cluster_id)]
    if not offered:
        return (
            f"no image is offered for pool {pool.name} yet; an operator adds images to the "
            "catalogue of its cluster"
        )
    choices = ", ".join(offered)
    if not isinstance(image, str) or not image.strip():
        return f"is required; choose one of: {choices}"
    if image.strip() not in offered:
        return (
            f"{image.strip()!r} is not an image offered for pool {pool.name}; "
            f"choose one of: {choices}"
        )
    return ""


def _demand_changed(pool: Pool) -> None:
    """Standalone pools place at once; set pools wait for the arbiter (a later stage)."""
    if pool.capacity_set_id is None:
        enqueue_on_commit("rentals.standalone_place", pool.cluster_id)


# --- placement ---------------------------------------------------------------------------------


@transaction.atomic
def vm_place(
    *,
    vm: VirtualMachine,
    node: Node,
    gpu_indices: Iterable[int],
    actor: Actor = None,
    message: str = "",
) -> VirtualMachine:
    """Give a pending VM these GPUs of ``node`` and start provisioning it. Two placements racing
    for one GPU: the database lets exactly one win; the other gets a Conflict. On a node with a
    guest subnet the VM also gets an address and a MAC (gpucap.rentals.guest_network), its
    ``ip_address`` from now on; on one without, the driver reports the address once it runs."""
    indices = sorted(set(gpu_indices))
    node = Node.objects.get(pk=node.pk)  # decide on the node as it is now, not as passed in
    problem = _placement_problem(vm=vm, node=node, indices=indices)
    if problem:
        raise ValidationError(problem)
    gpus = list(Gpu.objects.filter(node=node, index__in=indices).order_by("index"))
    failed = [g.index for g in gpus if g.health != Gpu.Health.OK]
    if failed:
        raise Conflict(f"GPU {failed[0]} of {node.hostname} has failed", code="gpu_failed")
    try:
        with transaction.atomic():
            Allocation.objects.bulk_create(Allocation(vm=vm, gpu=gpu) for gpu in gpus)
    except IntegrityError:
        raise Conflict(
            f"GPUs {indices} of {node.hostname} are no longer free", code="gpus_taken"
        ) from None
    guest = guest_address_take(vm=vm, node=node)
    left = vm.node_id if vm.node_id not in (None, node.pk) else None
    message = "; ".join(words for words in (message, _resume_words(vm, node)) if words)
    # Its usage interval opens with the move (a receiver of vm_transitioned). An address from
    # an earlier placement is no longer the guest's: the metadata endpoint must not serve it.
    placed = vm_transition(
        vm=vm,
        to=State.PROVISIONING,
        actor=actor,
        message=message,
        node=node,
        failure_reason="",
        ip_address=None if guest is None else guest.address,
    )
    enqueue_on_commit("rentals.vm_provision", placed.pk)
    if left is not None:
        # A resumed VM boots afresh on its new node; the node it left still has its stopped
        # definition and disk, which would hold that node's storage forever.
        enqueue_on_commit("rentals.vm_destroy_left", placed.pk, left)
    return placed


def _resume_words(vm: VirtualMachine, node: Node) -> str:
    """What a placement means for the disk of a VM that ran before (a reclaimed spot VM, a VM
    its owner stopped or that lost its host): back on the node that kept its disk, or a fresh
    overlay on its image elsewhere (the old disk is deleted by ``rentals.vm_destroy_left``).
    "" for a VM placed for the first time."""
    if vm.node_id is None:
        return ""
    if vm.disk_node_id == node.pk:
        return f"resumed on its disk on {node.hostname}"
    return f"resumed on a fresh disk from {vm.image}"


def _placement_problem(*, vm: VirtualMachine, node: Node, indices: list[int]) -> dict:
    """Why ``vm`` may not take GPUs ``indices`` of ``node`` (DESIGN.md section 2), or {}."""
    pool = vm.pool
    if node.cluster_id != pool.cluster_id or node.capacity_set_id != pool.capacity_set_id:
        where = (
            f"capacity set {pool.capacity_set.name}"
            if pool.capacity_set_id
            else ("the standalone nodes of its cluster")
        )
        return {"node": f"pool {pool.name} places only on {where}; {node.hostname} is not one"}
    if (node.gpu_model, node.fabric) != (pool.gpu_model, pool.fabric):
        return {
            "node": f"pool {pool.name} rents {pool.gpu_model} ({pool.fabric}); "
            f"{node.hostname} has {node.gpu_model} ({node.fabric})"
        }
    if node.state != Node.State.READY:
        return {"node": f"node {node.hostname} is {node.state}; only ready nodes take new VMs"}
    if len(indices) != vm.gpu_count:
        return {"gpus": f"{vm.instance_id} needs {vm.gpu_count} GPUs, got {len(indices)}"}
    table = node_partitions(
        fabric=node.fabric, gpu_count=node.gpu_count, partitions=node.partitions
    )
    if tuple(indices) not in {tuple(sorted(block)) for block in table}:
        return {
            "gpus": f"GPUs {indices} are not a partition of {node.hostname}'s "
            f"{'NVLink partition table' if node.fabric == 'nvswitch' else 'cards'}"
        }
    return {}


# --- owner actions -----------------------------------------------------------------------------


def vm_stop(*, vm: VirtualMachine, actor: Actor = None) -> VirtualMachine:
    """The owner stops a running VM; it keeps its disk and may be started again."""
    _owner_may_act(vm)
    return _stop(vm=vm, reason=StopReason.OWNER, actor=actor)


def _owner_may_act(vm: VirtualMachine) -> None:
    """An inference replica belongs to its deployment, which starts and stops replicas."""
    if vm.role == VirtualMachine.Role.INFERENCE_REPLICA:
        raise Conflict(
            f"{vm.instance_id} is a replica of an inference deployment: change the "
            "deployment's replica range instead",
            code="managed_by_deployment",
        )


def vm_stop_for_notice(*, vm: VirtualMachine, message: str = "") -> VirtualMachine:
    """A notice's deadline came or its guest released early: stop the VM. A spot VM resumes
    when capacity returns; any other VM ends stopped."""
    return _stop(
        vm=vm,
        reason=StopReason.RECLAIMED,
        actor=None,
        message=message,
        preempted_for=vm.preempted_for,
    )


def vm_preempt(
    *, vm: VirtualMachine, for_vm: VirtualMachine, actor: Actor = None, message: str = ""
) -> VirtualMachine:
    """Stop a VM at once, with no notice, for a higher-priority placement: a standalone spot VM
    (as Kubernetes scheduler preemption does), or a capacity set's victim that is still booting
    (no guest to warn yet). A spot VM resumes when capacity returns."""
    return _stop(
        vm=vm,
        reason=StopReason.PREEMPTED,
        actor=actor,
        preempted_for=for_vm,
        message=message
        or f"preempted without notice for {for_vm.instance_id} (pool {for_vm.pool.name}, "
        f"rank {for_vm.pool.rank}) outside a capacity set",
    )


@transaction.atomic
def _stop(
    *,
    vm: VirtualMachine,
    reason: str,
    actor: Actor,
    message: str = "",
    preempted_for: VirtualMachine | None = None,
) -> VirtualMachine:
    stopped = vm_transition(
        vm=vm,
        to=State.STOPPING,
        actor=actor,
        message=message,
        stop_reason=reason,
        preempted_for=preempted_for,
    )
    enqueue_on_commit("rentals.vm_stop", stopped.pk)
    return stopped


@transaction.atomic
def vm_start(*, vm: VirtualMachine, actor: Actor = None) -> VirtualMachine:
    """The owner starts a stopped VM: it asks for capacity again."""
    _owner_may_act(vm)
    locked = VirtualMachine.objects.select_for_update(no_key=True).get(pk=vm.pk)
    if locked.state in HOLDING:
        # Only a spot VM that lost its host or was stopped for capacity goes back to pending
        # from here, never by its owner's hand.
        raise IllegalTransition(locked, State.PENDING)
    started = vm_transition(vm=vm, to=State.PENDING, actor=actor)
    _demand_changed(started.pool)
    return started


@transaction.atomic
def vm_terminate(
    *, vm: VirtualMachine, actor: Actor = None, for_deployment: bool = False
) -> VirtualMachine:
    """The owner deletes a VM (or a deployment withdraws a replica, ``for_deployment``): stop it
    if it holds GPUs, then destroy it."""
    if not for_deployment:
        _owner_may_act(vm)
    locked = VirtualMachine.objects.select_for_update(no_key=True).get(pk=vm.pk)
    if locked.state == State.TERMINATED:
        return locked
    if locked.state in (State.PENDING, State.STOPPED, State.FAILED):
        terminated = vm_transition(vm=locked, to=State.TERMINATED, actor=actor)
        if terminated.node_id is not None:
            enqueue_on_commit("rentals.vm_destroy", terminated.pk)
        return terminated
    if locked.state == State.STOPPING:
        VirtualMachine.objects.filter(pk=locked.pk).update(stop_reason=StopReason.TERMINATE)
        audit_record(
            actor=actor, verb="vm.terminate", target=locked, message="terminate once stopped"
        )
        locked.stop_reason = StopReason.TERMINATE
        return locked
    return _stop(vm=locked, reason=StopReason.TERMINATE, actor=actor)


# --- what the driver reports (called by tasks) -------------------------------------------------


@transaction.atomic
def vm_mark_running(
    *, vm: VirtualMachine, ip_address: str, endpoint_url: str | None = None
) -> VirtualMachine:
    """The driver says the VM booted (an inference replica: and where its model server
    listens). Harmless to call twice. An address gpucap gave the VM stays: the driver's view of
    it (a DHCP lease, a guest agent) does not overrule the subnet's owner."""
    locked = VirtualMachine.objects.select_for_update(no_key=True).get(pk=vm.pk)
    if locked.state != State.PROVISIONING:
        return locked
    if GuestAddress.objects.filter(vm=locked, released_at=None).exists():
        ip_address = locked.ip_address
    return vm_transition(
        vm=locked, to=State.RUNNING, ip_address=ip_address, endpoint_url=endpoint_url or ""
    )


@transaction.atomic
def vm_mark_stopped(*, vm: VirtualMachine) -> VirtualMachine:
    """The driver says the VM is off. Where it goes depends on why it stopped: an owner's stop
    ends in ``stopped``; a spot VM that was preempted or reclaimed goes back to ``pending`` and
    resumes when capacity returns; a terminate goes on to destroy. Harmless to call twice."""
    locked = (
        VirtualMachine.objects.select_for_update(of=("self",), no_key=True)
        .select_related("pool")
        .get(pk=vm.pk)
    )
    if locked.state != State.STOPPING:
        return locked
    reason = locked.stop_reason
    if reason == StopReason.TERMINATE or locked.role == VirtualMachine.Role.INFERENCE_REPLICA:
        # A replica is never restarted: its deployment asks for a new one where there is room.
        done = vm_transition(vm=locked, to=State.TERMINATED)
        enqueue_on_commit("rentals.vm_destroy", done.pk)
        return done
    resumes = locked.pool.kind == Pool.Kind.SPOT and reason in (
        StopReason.PREEMPTED,
        StopReason.RECLAIMED,
    )
    if resumes:
        done = vm_transition(
            vm=locked, to=State.PENDING, message="spot VM resumes when capacity returns"
        )
        _demand_changed(done.pool)
        return done
    done = vm_transition(vm=locked, to=State.STOPPED)
    _demand_changed(done.pool)
    return done


@transaction.atomic
def vm_mark_failed(*, vm: VirtualMachine, reason: str) -> VirtualMachine:
    """The driver gave up (after retries). The VM's GPUs are released. Harmless twice."""
    locked = VirtualMachine.objects.select_for_update(no_key=True).get(pk=vm.pk)
    if State.FAILED not in TRANSITIONS[locked.state]:
        return locked  # failed already, or stopped/terminated meanwhile: a late report
    failed = vm_transition(
        vm=locked, to=State.FAILED, failure_reason=reason[:2000], message=reason[:500]
    )
    _demand_changed(failed.pool)
    return failed


@transaction.atomic
def vm_host_lost(*, vm: VirtualMachine, reason: str) -> VirtualMachine:
    """The VM's host is gone (the hypervisor no longer knows a running VM, or an operator marked
    its node down): its GPUs are released at once and its disk is lost with the host. A spot
    rental goes back to ``pending`` and resumes elsewhere on a fresh disk (a persistent spot
    request); any other VM is ``failed``. ``failure_reason`` says why in both cases (on a
    pending spot VM until it is placed again), for the owner and the operator. A VM being
    terminated ends terminated. Harmless twice: a VM that holds no GPUs is left as it is."""
    locked = (
        VirtualMachine.objects.select_for_update(of=("self",), no_key=True)
        .select_related("pool", "node")
        .get(pk=vm.pk)
    )
    if locked.state not in HOLDING:
        return locked
    where = f"its host {locked.node.hostname} was lost: {reason}"[:2000]
    if locked.state == State.STOPPING and locked.stop_reason == StopReason.TERMINATE:
        done = vm_transition(vm=locked, to=State.TERMINATED, message=where[:500])
    elif locked.role == VirtualMachine.Role.RENTAL and locked.pool.kind == Pool.Kind.SPOT:
        done = vm_transition(
            vm=locked,
            to=State.PENDING,
            failure_reason=where,
            message=f"{where}; its GPUs are released and it resumes elsewhere on a fresh disk "
            f"from {locked.image}"[:1000],
        )
    else:
        done = vm_transition(vm=locked, to=State.FAILED, failure_reason=where, message=where[:500])
    _demand_changed(done.pool)
    return done


def vms_host_lost(*, node_id: int, reason: str) -> list[VirtualMachine]:
    """Every VM holding GPUs on a node that was lost, through ``vm_host_lost``."""
    holding = VirtualMachine.objects.filter(node_id=node_id, state__in=HOLDING).order_by("pk")
    return [vm_host_lost(vm=vm, reason=reason) for vm in holding]
