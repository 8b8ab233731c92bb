"""A tenant's multi-VM job: ``count`` VMs asked for together, named ``<job>-0`` to
``<job>-<count-1>``, sharing the demand group ``<tenant slug>/<job>``. The arbiter places a
pending group all or none (in a capacity set and on standalone nodes alike, DESIGN.md rule 4),
and reclaims a running group whole; a standalone preemption of one running member stops every
running member with it (``job_member_preempt``, from ``gpucap.plans.standalone``), so a job
never runs in part.

Which VMs belong to a job is the VM's own record (``job``, ``demand_group``); a job is no row of
its own. A job name is free again once none of the tenant's VMs that carry it is live (all
stopped, failed or terminated).
"""

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q, QuerySet

from gpucap.audit.services import Actor
from gpucap.errors import Conflict
from gpucap.fleet.models import Pool
from gpucap.rentals import services
from gpucap.rentals.models import VirtualMachine
from gpucap.tasks import enqueue_on_commit
from gpucap.tenancy.models import Tenant

State = VirtualMachine.State

MAX_JOB_VMS = 64
# A VM name is at most 63 characters: a job name leaves room for "-63".
MAX_JOB_NAME = 60
_JOB = services.name_pattern(MAX_JOB_NAME)
# A job's VMs in these states no longer hold its name.
ENDED = frozenset({State.STOPPED, State.FAILED, State.TERMINATED})
# Members a standalone preemption stops with the one the plan chose.
RUNNING = frozenset({State.PROVISIONING, State.RUNNING})


def job_group(*, tenant: Tenant, job: str) -> str:
    """The demand group of a tenant's job, the one format the arbiter reads."""
    return f"{tenant.slug}/{job}"


def job_vm_name(job: str, index: int) -> str:
    return f"{job}-{index}"


@transaction.atomic
def job_request(
    *,
    tenant: Tenant,
    pool: Pool,
    job: str,
    count: int,
    gpu_count: int,
    image: str,
    ssh_public_key: str,
    user_data: str = "",
    actor: Actor = None,
) -> list[VirtualMachine]:
    """A tenant asks for ``count`` VMs of the same shape as one job. All are created or none:
    any refusal (of the job, the count, or of one VM as ``vm_request`` checks it) changes
    nothing, and names the field."""
    # One job request per tenant at a time: two racing for one name cannot both pass the check.
    Tenant.objects.select_for_update(no_key=True).filter(pk=tenant.pk).first()
    errors: dict[str, str] = {}
    if not isinstance(job, str) or not _JOB.match(job):
        errors["job"] = (
            f"{services.name_rule(MAX_JOB_NAME)} (its VMs are named <job>-0, <job>-1, ...)"
        )
    elif job_is_live(tenant=tenant, job=job):
        errors["job"] = (
            f"your tenant already has a job named {job!r} with VMs that are not stopped, failed "
            "or terminated"
        )
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_JOB_VMS:
        errors["count"] = f"must be a whole number of VMs from 1 to {MAX_JOB_VMS}, got {count!r}"
    if errors:
        raise ValidationError(errors)
    vms = []
    for index in range(count):
        try:
            vms.append(
                services.vm_request(
                    tenant=tenant,
                    pool=pool,
                    name=job_vm_name(job, index),
                    gpu_count=gpu_count,
                    image=image,
                    ssh_public_key=ssh_public_key,
                    user_data=user_data,
                    actor=actor,
                    job=job,
                    demand_group=job_group(tenant=tenant, job=job),
                    announce=False,
                )
            )
        except ValidationError as exc:
            # The name is the job's: a clash with another VM's name is the job's to fix.
            raise ValidationError(
                {
                    ("job" if field == "name" else field): messages
                    for field, messages in exc.message_dict.items()
                }
            ) from None
    services.demand_added(pool=pool)
    return vms


def rental_request(
    *,
    tenant: Tenant,
    pool: Pool,
    gpu_count: int,
    image: str,
    ssh_public_key: str,
    name: str = "",
    job: str = "",
    count: int | None = None,
    user_data: str = "",
    actor: Actor = None,
) -> list[VirtualMachine]:
    """What a tenant's request (the API, the request form) asks for: one VM named ``name``,
    or, with ``job``, ``count`` VMs named after the job (a job of one without ``count``)."""
    shape = {
        "tenant": tenant,
        "pool": pool,
        "gpu_count": gpu_count,
        "image": image,
        "ssh_public_key": ssh_public_key,
        "user_data": user_data,
        "actor": actor,
    }
    if job:
        if name:
            raise ValidationError(
                {
                    "name": "leave the name out when you ask for a job: its VMs are named after it "
                    f"({job_vm_name(job, 0)}, {job_vm_name(job, 1)}, ...)"
                }
            )
        return job_request(job=job, count=1 if count is None else count, **shape)
    if count is not None and count != 1:
        raise ValidationError({"count": "several VMs are asked for as a job: give the job a name"})
    if not name:
        raise ValidationError({"name": "is required (or give a job name to ask for a job)"})
    return [services.vm_request(name=name, **shape)]


def job_is_live(*, tenant: Tenant, job: str) -> bool:
    return (
        VirtualMachine.objects.filter(tenant=tenant, job=job, role=VirtualMachine.Role.RENTAL)
        .exclude(state__in=ENDED)
        .exists()
    )


@transaction.atomic
def job_terminate(*, vm: VirtualMachine, actor: Actor = None) -> list[VirtualMachine]:
    """The owner terminates every VM of ``vm``'s job that is not terminated yet (each as
    ``vm_terminate`` does: a VM holding GPUs stops first). All or none: a refusal for one
    member changes nothing."""
    if not vm.job or vm.role != VirtualMachine.Role.RENTAL:
        raise Conflict(f"{vm.instance_id} is in no job", code="not_in_a_job")
    members = (
        VirtualMachine.objects.filter(tenant_id=vm.tenant_id, job=vm.job, role=vm.role)
        .exclude(state=State.TERMINATED)
        .order_by("pk")
    )
    return [services.vm_terminate(vm=member, actor=actor) for member in members]


# --- standalone preemption ---------------------------------------------------------------------


def job_members_running(vm: VirtualMachine) -> list[VirtualMachine]:
    """The other members of ``vm``'s job (a non-empty demand group of rentals; an inference
    scale-up step's replicas are not one) that hold GPUs and are not on their way out."""
    mates = _job_mates(vm)
    if mates is None:
        return []
    return list(
        mates.filter(state__in=RUNNING).exclude(pk=vm.pk).select_related("pool").order_by("pk")
    )


def job_members_resuming(vm: VirtualMachine) -> list[VirtualMachine]:
    """The members of ``vm``'s job that are being stopped for capacity and will ask for it
    again (a preempted or reclaimed spot VM goes back to pending once it is off): a pending
    member waits for them, so the job resumes whole. [] for a VM in no job."""
    mates = _job_mates(vm)
    if mates is None:
        return []
    return list(
        mates.filter(pool__kind=Pool.Kind.SPOT)
        .filter(
            Q(state=State.NOTIFIED)
            | Q(
                state=State.STOPPING,
                stop_reason__in=[
                    VirtualMachine.StopReason.PREEMPTED,
                    VirtualMachine.StopReason.RECLAIMED,
                ],
            )
        )
        .order_by("pk")
    )


def _job_mates(vm: VirtualMachine) -> QuerySet[VirtualMachine] | None:
    """Every VM of ``vm``'s job, itself included; None for a VM in no job (an inference
    scale-up step's replicas are no job)."""
    if not vm.demand_group or vm.role != VirtualMachine.Role.RENTAL:
        return None
    return VirtualMachine.objects.filter(
        demand_group=vm.demand_group, tenant_id=vm.tenant_id, role=VirtualMachine.Role.RENTAL
    )


@transaction.atomic
def job_member_preempt(
    *, vm: VirtualMachine, victim: VirtualMachine, for_vm: VirtualMachine
) -> VirtualMachine:
    """Stop ``vm`` at once, with no notice, because ``victim`` of its job was preempted for
    ``for_vm`` outside a capacity set: a job does not run in part. Its GPUs are nobody's
    reservation (``for_vm`` waits only for its own victims); a spot member resumes with its
    job when capacity returns, placed all or none again."""
    stopped = services.vm_transition(
        vm=vm,
        to=State.STOPPING,
        stop_reason=VirtualMachine.StopReason.PREEMPTED,
        preempted_for=None,
        message=f"preempted without notice for {for_vm.instance_id} (pool {for_vm.pool.name}, "
        f"rank {for_vm.pool.rank}) outside a capacity set, with {victim.instance_id} of its "
        f"job {vm.job or vm.demand_group}: a job runs whole or not at all",
    )
    enqueue_on_commit("rentals.vm_stop", stopped.pk)
    return stopped
