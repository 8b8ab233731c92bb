"""The arbiter's vocabulary: the snapshot it plans from and the plan it returns.

Everything here is a frozen dataclass, so a snapshot can be shared between threads and a plan
compared or hashed. The JSON form of both is DESIGN.md section 7; `codec` reads and writes it.

Beyond section 7 the snapshot accepts these optional fields (all with defaults, so a section 7
file is read unchanged):

- top level ``"now"``: ISO 8601 time the plan is made for. The planner never reads the clock;
  the CLI fills in the current UTC time when the file has none. ``now`` decides which VMs a
  pool's ``protect_seconds`` protects (below) and feeds the running times that ``explain``
  prints; without protection windows the plan JSON does not depend on it.
- VM ``"state"``: ``"running"`` (default) or ``"notified"``. A notified VM already has an
  interruption notice: it is never chosen as a victim again, and its GPUs are not free (they
  are reserved for the placement that preempted it). It no longer counts towards its pool's
  held GPUs or its deployment's replicas, since it is leaving.
- VM ``"tenant"``: any string, passed through to the VM's preemption as ``"tenant"`` so the
  operator preview can say whose VM gets a notice.
- VM ``"group"``: a non-empty string naming the running job the VM belongs to (a multi-VM
  job started together from one demand group). VMs of a set sharing a group are one running
  job and are reclaimed whole or not at all: a reclaim that takes any running member's GPUs
  preempts every running (not notified) member, wherever it runs, each victim checked as
  usual (rules 1-3), and the disruption (rule 7) counts them all. A group with a member that
  may never be preempted (on-demand) keeps every member. Absent means a job of one VM.
- demand ``"disk_node"``: the node that still holds the disk of a VM waiting to resume (a
  reclaimed spot VM keeps its disk there). Once the plan is made, a placement of that demand on
  free capacity moves to that node when it has an equally good free partition: a preference
  below every rule of DESIGN.md section 3, so it never changes who is served, who is preempted
  or how well the free capacity is packed (see ``planner._Planner._prefer_disks``).
- pool ``"protect_seconds"``: whole seconds, 0 (default, off) to 604800 (7 days). A running
  VM of the pool that started or resumed less than that long before ``now`` (``now <
  started_at + protect_seconds``) is protected: it is not a legal victim (rule 3a, see
  docs/arbiter.md). Without ``now`` no VM is protected. A demand that only protected VMs could
  serve waits; its unsatisfied entry then carries ``"waits_until"``, the moment the cheapest
  plan that ignores protection could go ahead (see ``protection``).

- demand ``"tenant"``: the tenant asking (a string, or null/absent for none). It decides which
  dedicated nodes the demand may use and which quotas it counts against. The demands of one
  group must name the same tenant.
- node ``"tenant"``: the node is dedicated to that tenant (null/absent: shared). Only demands of
  that tenant are placed on it, whatever their pool, and it is never free capacity for anyone
  else: other demands neither take its free GPUs nor reclaim its VMs. Its VMs of that tenant
  may be reclaimed by that tenant's higher-ranked demands under the usual rules; a VM of any
  other tenant (or of none) on it is left alone by the arbiter (not a victim for anyone: the
  Django layer moves it off with notices, as for a drain). A running job with members both on
  a tenant's dedicated nodes and elsewhere is never reclaimed. A tenant's demands take free
  capacity on its dedicated nodes before shared free capacity.
- top level ``"quotas"``: a list of ``{"tenant": str, "pool": str or null, "max_gpus": int
  >= 0}``, at most one per tenant and pool. ``pool`` null means the whole set (a quota per GPU
  model: for a quota spanning several sets the Django layer passes the headroom left for this
  set, i.e. ``max_gpus`` minus what the tenant holds in the model's other sets). A tenant holds,
  in a quota's scope, the GPUs of its running and notified VMs (notified VMs hold theirs until
  their deadline) plus the plan's placements of its demands. No plan places past a quota: a
  group whose placement would take its tenant past any quota is unsatisfied whole, with a
  reason naming the quota, what the tenant holds and by which VMs, and what the group asks.
  Quotas never preempt anything, and a quota below current use only blocks new placements.
- top level ``"reservations"``: a list of ``{"id": str, "tenant": str, "gpus": int,
  "block_gpus": int}`` (``block_gpus`` 1, 2, 4 or 8, default 1, a partition size of the set's
  fabric), the reservations in force at ``now`` (the Django layer resolves calendar windows).
  ``gpus`` is a positive multiple of ``block_gpus``; ids are unique; a tenant has at most one.
  Together they may ask more than the working GPUs of the set's ready nodes not dedicated to a
  tenant (a node went down or was cordoned): that is no problem of the snapshot. They are then
  honoured as far as those GPUs go, in the order given (a caller lists the oldest first, so
  the newest is the one cut), each in whole blocks; a reservation is planned as one of the GPUs
  honoured, and its report's ``short_gpus`` says how many it is short.
- VM ``"borrowed"``: the id of a reservation whose kept capacity the VM (a spot VM of another
  tenant) borrows. An id no reservation has (the reservation ended) means not borrowing.
- VM ``"reservation"``: the id of the reservation a claim placed the VM inside (the live VM's
  reservation, set by the placement). It counts only on a running VM of that reservation's
  tenant; any other id (the reservation ended) means none. It decides which VMs are held first
  (rule 4 below).

The rules of reservations (reservations.py, docs/arbiter.md "Reservations"):

1. The tenant of a reservation of N GPUs (N: the GPUs honoured, above) holds H: the GPUs of
   its running VMs in the set. Its unused part is U = max(0, N - H); while U > 0,
   ceil((U - L) / block_gpus) free partitions of block_gpus GPUs on shared ready nodes are
   kept for it, L being the GPUs its borrowers still hold (that part is lent); a block only
   partly needed is kept whole.
2. Claims: the tenant's demand groups, in the order of service, that fit in U (first fit) are
   served first, as a claim: they may take the kept capacity and reclaim the VMs borrowing from
   their reservation before anything else, whatever the borrowers' rank, floor or protection;
   beyond that the usual rules hold. A group that does not fit in U is an ordinary demand.
3. Kept capacity is a floor only the tenant may use: no other demand takes it, except groups
   of spot pools of other tenants that nothing else can serve, which borrow it (their
   placement says ``borrowed``) and are the first victims of the tenant's claims.
4. What the tenant uses is held: its running VMs, in a fixed order (those a claim placed inside
   the reservation first, then the rest; each part oldest ``started_at`` first, then id; never
   a VM validly flagged ``borrowed``), are held inside the reservation while what is held so
   far is below N (whole VMs: the last one may take it past N). A held VM is no victim of any
   demand while the reservation is in force, not even of its own tenant's (as an on-demand
   VM; a running job with a held member is kept whole). The tenant's VMs beyond are ordinary.
   So no plan takes the tenant below min(N, what it runs outside borrowed capacity). A group
   only held VMs keep waiting says so.
5. A snapshot without reservations is planned exactly as before.

Pool balances count GPUs held by running VMs of the set (``before_gpus``) and add the plan's
placements and subtract its preemptions (``after_gpus``).
"""

from __future__ import annotations

from dataclasses import MISSING, FrozenInstanceError, dataclass
from datetime import datetime
from operator import attrgetter

FABRICS = ("pcie", "nvswitch")
NODE_STATES = ("ready", "cordoned", "draining", "down")
POOL_KINDS = ("on_demand", "spot", "inference")
VM_STATES = ("running", "notified")

MAX_NODE_GPUS = 8
# A pool's protect_seconds: at most 7 days.
MAX_PROTECT_SECONDS = 7 * 24 * 3600


class _Frozen:
    """The ``__eq__``, ``__hash__``, ``__repr__``, frozen ``__setattr__`` and ``__delattr__``
    and pickling that ``@dataclass(frozen=True, slots=True)`` would generate for each class,
    written once for every class here: generating them costs an ``exec()`` each, about 5 ms of
    every CLI run."""

    __slots__ = ()
    _values: attrgetter  # every field of the class, in order (set by `_frozen`)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self._values(self) == self._values(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._values(self))

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{self.__class__.__qualname__}({fields})"

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __getstate__(self) -> tuple:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __setstate__(self, state: tuple) -> None:
        for name, value in zip(self.__slots__, state, strict=True):
            object.__setattr__(self, name, value)


def _frozen(cls: type) -> type:
    """``@dataclass(frozen=True, slots=True)``, with the methods of `_Frozen` (``cls`` must
    derive from it) and the ``__init__`` of `_init_for`: the same fields, ``__init__``,
    ``dataclasses.replace`` and behaviour. (Each class has a docstring, which also spares
    ``dataclass`` an ``inspect.signature``.)"""
    cls = dataclass(cls, init=False, repr=False, eq=False, slots=True)
    cls._values = attrgetter(*cls.__slots__)
    cls.__init__ = _init_for(cls)
    return cls


def _init_for(cls: type) -> object:
    """The ``__init__`` a frozen dataclass gets (every field, in order, by position or name,
    defaults at the end), in one ``exec()`` instead of dataclasses' three per class: it sets
    each field through its slot, as frozen dataclasses do past their own ``__setattr__``.
    (Fields here have plain defaults, no default factories.)"""
    namespace: dict = {}
    parameters, body = [], []
    for name, field in cls.__dataclass_fields__.items():
        namespace[f"_set_{name}"] = cls.__dict__[name].__set__
        if field.default is MISSING:
            parameters.append(name)
        else:
            namespace[f"_default_{name}"] = field.default
            parameters.append(f"{name}=_default_{name}")
        body.append(f"_set_{name}(self, {name})")
    # Generated from the class's own fields, as dataclasses generates its __init__.
    exec(f"def __init__(self, {', '.join(parameters)}):\n    {'; '.join(body)}", namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init


@_frozen
class CapacitySet(_Frozen):
    """The set a snapshot plans: its name, NVLink fabric and GPU model."""

    name: str
    fabric: str
    gpu_model: str


@_frozen
class Node(_Frozen):
    """A node of the set, its GPUs, state and partition table."""

    name: str
    gpus: int
    state: str = "ready"
    failed_gpus: tuple[int, ...] = ()
    # The node's partition table in GPU-index terms; None means the default table.
    partitions: tuple[tuple[int, ...], ...] | None = None
    # The tenant the node is dedicated to; None: shared by every tenant of the set.
    tenant: str | None = None


@_frozen
class Pool(_Frozen):
    """A pool of the set: kind, rank, floor and protection window."""

    name: str
    kind: str
    rank: int
    floor_gpus: int = 0
    protect_seconds: int = 0


@_frozen
class Deployment(_Frozen):
    """An inference deployment and the replicas it keeps."""

    name: str
    pool: str
    min_replicas: int = 0


@_frozen
class Vm(_Frozen):
    """A VM holding GPUs of a node."""

    id: str
    pool: str
    node: str
    gpus: tuple[int, ...]
    started_at: datetime
    deployment: str | None = None
    state: str = "running"
    tenant: str | None = None
    group: str | None = None
    # The reservation whose kept capacity the VM borrows (an unknown id: not borrowing).
    borrowed: str | None = None
    # The reservation a claim placed it inside (held first while that one is in force).
    reservation: str | None = None


@_frozen
class Demand(_Frozen):
    """A request for GPUs waiting to be placed."""

    id: str
    group: str
    pool: str
    gpus: int
    requested_at: datetime
    disk_node: str | None = None
    tenant: str | None = None


@_frozen
class Quota(_Frozen):
    """The most GPUs a tenant may hold in one pool, or in the whole set (``pool`` None)."""

    tenant: str
    pool: str | None
    max_gpus: int


@_frozen
class Reservation(_Frozen):
    """GPUs promised to a tenant in the set, in force at the snapshot's ``now``."""

    id: str
    tenant: str
    gpus: int
    block_gpus: int = 1


@_frozen
class Snapshot(_Frozen):
    """Everything one plan is made from."""

    capacity_set: CapacitySet
    nodes: tuple[Node, ...]
    pools: tuple[Pool, ...]
    vms: tuple[Vm, ...] = ()
    demands: tuple[Demand, ...] = ()
    deployments: tuple[Deployment, ...] = ()
    now: datetime | None = None
    quotas: tuple[Quota, ...] = ()
    reservations: tuple[Reservation, ...] = ()


@_frozen
class Placement(_Frozen):
    """A demand placed on a node's GPUs, and the VMs it preempts."""

    demand: str
    node: str
    gpus: tuple[int, ...]
    preempts: tuple[str, ...] = ()
    # The reservation it claims for its tenant, or whose kept capacity it borrows.
    reservation: str | None = None
    borrowed: str | None = None


@_frozen
class Preemption(_Frozen):
    """A VM that gives up its GPUs, and why."""

    vm: str
    pool: str
    node: str
    gpus: tuple[int, ...]
    for_demand: str
    reason: str
    tenant: str | None = None


@_frozen
class Unsatisfied(_Frozen):
    """A demand the plan cannot serve, and why."""

    demand: str
    group: str
    reason: str
    # Set when only protected VMs keep the demand waiting: when their protection ends.
    waits_until: datetime | None = None


@_frozen
class PoolBalance(_Frozen):
    """A pool's GPUs before and after the plan."""

    name: str
    rank: int
    before_gpus: int
    after_gpus: int
    floor_gpus: int


@_frozen
class ReservationReport(_Frozen):
    """A reservation after the plan: what its tenant holds, what is kept for it, who borrows
    it, and what claiming its unused part right after the plan would reclaim."""

    id: str
    tenant: str
    gpus: int
    block_gpus: int
    held_before: int
    held_after: int
    kept_gpus: int
    borrowed: tuple[str, ...]
    claim_reclaims: tuple[str, ...]
    claim_complete: bool
    # GPUs of ``gpus`` the set's ready shared nodes cannot honour (claims.honoured): the rules
    # above apply to the rest.
    short_gpus: int = 0
    # Not in the plan JSON (like PoolBalance.rank): the blocks (node, GPUs) held back for it
    # once its claims were served, before borrowing; and those held back for it while other
    # reservations' claims were served. The referee (tests/arbiter/rules.py) checks them.
    kept_blocks: tuple[tuple[str, tuple[int, ...]], ...] = ()
    claim_blocks: tuple[tuple[str, tuple[int, ...]], ...] = ()


@_frozen
class Plan(_Frozen):
    """What the planner decided for one snapshot."""

    complete: bool
    placements: tuple[Placement, ...]
    preemptions: tuple[Preemption, ...]
    unsatisfied: tuple[Unsatisfied, ...]
    pools: tuple[PoolBalance, ...]
    reservations: tuple[ReservationReport, ...] = ()
