"""Discovery: what the BMCs say, compared with the fleet, shown as a diff, then applied
(docs/bmc.md, "Discovery: preview, then apply").

The BMCs are read first, outside any transaction (network calls); the comparison and the writes
then run in one transaction, all or nothing, in the words and shape of ``fleet_apply --dry-run``
(the fleet file's ``Change`` and ``ApplyResult``). Any problem — a BMC that refuses, cannot be
reached or is not Redfish, a count that cannot change in place — is named and nothing is
written.
"""

import dataclasses
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from gpucap.audit.services import Actor
from gpucap.bmc import services as bmc
from gpucap.bmc.inventory import FAILED, SystemInventory
from gpucap.bmc.models import BmcCredential, NodeInventory
from gpucap.bmc.passwords import SealError, password_open
from gpucap.bmc.redfish import BmcError, BmcTarget, inventory_read
from gpucap.errors import Conflict
from gpucap.fleet import rules
from gpucap.fleet import services as fleet
from gpucap.fleet.fleetfile.spec import ApplyResult, Change
from gpucap.fleet.models import MAX_GPUS_PER_NODE, Cluster, Fabric, Gpu, Node


class DiscoveryError(Exception):
    """Discovery refused: one line per problem, each naming the node or the entry."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class DiscoveryStale(Exception):
    """The BMCs now say something else than the preview that was approved: nothing applied.
    ``fresh`` is the preview of what they say now."""

    def __init__(self, fresh: ApplyResult) -> None:
        super().__init__("the changes differ from the previewed ones")
        self.fresh = fresh


@dataclass(frozen=True)
class DiscoveryEntry:
    """One BMC to discover, and what the BMC cannot say: the cluster, and for a new node its
    fabric. ``where`` names the entry in messages (a file's "entries[2]")."""

    where: str
    cluster: str
    address: str
    username: str
    password: str = field(repr=False)
    verify_tls: bool = True
    hostname: str = ""  # "": the system's HostName
    gpu_model: str = ""  # "": the BMC's GPU model (a new node); an existing node keeps its own
    fabric: str = ""  # required for a new node
    system_id: str = ""  # "": the BMC's only ComputerSystem

    def target(self) -> BmcTarget:
        return BmcTarget(
            name=f"node {self.hostname}" if self.hostname else self.where,
            address=self.address,
            username=self.username,
            password=self.password,
            verify_tls=self.verify_tls,
            system_id=self.system_id,
            **bmc.bmc_target_settings(),
        )


def discovery_entry(node: Node) -> DiscoveryEntry:
    """Discover a registered node again with the credentials stored for it."""
    target = bmc.bmc_target(node)
    return DiscoveryEntry(
        where=f"node {node.hostname}",
        cluster=node.cluster.name,
        address=node.bmc_address,
        username=target.username,
        password=target.password,
        verify_tls=target.verify_tls,
        hostname=node.hostname,
        system_id=target.system_id,
    )


def discovery_run(
    *,
    entries: list[DiscoveryEntry],
    dry_run: bool,
    actor: Actor = None,
    read: Callable[[BmcTarget], SystemInventory] = inventory_read,
) -> ApplyResult:
    """Read every entry's BMC, compare with the fleet and, unless ``dry_run``, make the fleet
    say what the BMCs say. Raises ``DiscoveryError`` naming every problem; nothing written."""
    return discovery_compare(discovery_read(entries, read=read), dry_run=dry_run, actor=actor)


def discovery_read(
    entries: list[DiscoveryEntry], *, read: Callable[[BmcTarget], SystemInventory] = inventory_read
) -> list[tuple[DiscoveryEntry, SystemInventory]]:
    """What every entry's BMC says (network calls: outside any transaction). Raises
    ``DiscoveryError`` with one line per BMC that could not be read."""
    readings = []
    problems = []
    for entry in entries:
        try:
            readings.append((entry, read(entry.target())))
        except BmcError as error:
            problems.append(error.message)
    if problems:
        raise DiscoveryError(problems)
    return readings


def discovery_compare(
    readings: list[tuple[DiscoveryEntry, SystemInventory]],
    *,
    dry_run: bool,
    actor: Actor = None,
    digest: str | None = None,
) -> ApplyResult:
    """Compare the readings with the fleet and, unless ``dry_run``, apply the changes, all or
    nothing. With ``digest`` (a stored preview's), the changes are applied only when they are
    still the previewed ones; otherwise ``DiscoveryStale`` carries the fresh preview and
    nothing is written."""
    with transaction.atomic():
        diff = _Diff(actor=actor)
        for entry, machine in readings:
            diff.plan(entry, machine)
        if diff.problems:
            raise DiscoveryError(diff.problems)
        changes = tuple(diff.changes)
        if digest is not None and changes_digest(changes) != digest:
            raise DiscoveryStale(
                ApplyResult(changes=changes, unchanged=diff.unchanged, left_as_is=(), dry_run=True)
            )
        if not dry_run:
            diff.apply()
    return ApplyResult(changes=changes, unchanged=diff.unchanged, left_as_is=(), dry_run=dry_run)


def changes_digest(changes: tuple[Change, ...]) -> str:
    """What a preview promises, in 64 hex digits: the same changes, the same digest."""
    rows = [[c.verb, c.noun, c.label, c.detail] for c in changes]
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest()


def inventory_facts(machine: SystemInventory) -> dict:
    """What ``NodeInventory.facts`` keeps of a reading: all of it but the power state, as JSON."""
    facts = dataclasses.asdict(machine)
    facts.pop("power_state")
    return json.loads(json.dumps(facts))


class _Diff:
    """The changes, the problems, and the service calls that make the changes."""

    def __init__(self, *, actor: Actor) -> None:
        self.actor = actor
        self.changes: list[Change] = []
        self.problems: list[str] = []
        self.unchanged = 0
        self._steps: list[tuple[str, Callable[[], object]]] = []
        self._clusters = {c.name: c for c in Cluster.objects.all()}
        self._planned: set[tuple[str, str]] = set()

    def plan(self, entry: DiscoveryEntry, machine: SystemInventory) -> None:
        hostname = entry.hostname or machine.host_name.split(".")[0]
        where = f"node {hostname}" if hostname else entry.where
        cluster = self._clusters.get(entry.cluster)
        found = [
            *self._check(
                where, "cluster", None if cluster else f"no cluster named {entry.cluster}"
            ),
            *self._check(where, "hostname", _hostname_problem(hostname)),
            *self._check(where, "gpus", _gpus_problem(machine)),
        ]
        if not found and (entry.cluster, hostname) in self._planned:
            found = self._check(where, "hostname", "listed twice")
        if found:
            return
        self._planned.add((entry.cluster, hostname))
        node = (
            Node.objects.select_related("cluster", "bmc_credential", "bmc_inventory")
            .prefetch_related("gpus")
            .filter(cluster=cluster, hostname=hostname)
            .first()
        )
        if node is None:
            self._plan_new(where, entry, machine, cluster, hostname)
        else:
            self._plan_existing(where, entry, machine, node)

    def apply(self) -> None:
        """Run the service calls in order; one that still refuses rolls everything back."""
        for where, step in self._steps:
            try:
                step()
            except ValidationError as error:
                raise DiscoveryError(
                    [f"{where}: {key}: {text}" for key, texts in _messages(error) for text in texts]
                ) from None
            except Conflict as error:
                raise DiscoveryError([f"{where}: {error.message}"]) from None

    def _step(self, where: str, action: Callable, **kwargs) -> None:
        """Schedule ``action(**kwargs)`` for ``apply``; ``where`` names the node in its errors."""
        self._steps.append((where, partial(action, **kwargs)))

    def _check(self, where: str, key: str, problem: str | None) -> list[str]:
        if not problem:
            return []
        self.problems.append(f"{where}: {key}: {problem}")
        return [problem]

    # a node gpucap does not know yet

    def _plan_new(self, where, entry, machine, cluster, hostname) -> None:
        if entry.fabric not in Fabric.values:
            self._check(
                where, "fabric", "say pcie or nvswitch for a new node (the BMC does not tell)"
            )
            return
        gpu_model = entry.gpu_model or machine.gpus[0].model[:64]
        rows = []
        for gpu in machine.gpus:
            row = {"index": gpu.index, "health": gpu.health}
            if gpu.uuid:
                row["uuid"] = gpu.uuid
            if gpu.pci_address:
                row["pci_address"] = gpu.pci_address
            rows.append(row)
        taken = Gpu.objects.filter(uuid__in=[r["uuid"] for r in rows if "uuid" in r])
        for gpu in taken.select_related("node"):
            self._check(
                where, "gpus", f"{gpu.uuid} is registered already, as GPU {gpu.index} of {gpu.node}"
            )
        failed = [str(gpu.index) for gpu in machine.gpus if gpu.health == FAILED]
        detail = [
            f"{len(rows)} x {gpu_model} {entry.fabric}, standalone",
            f"BMC {entry.address}",
            f"{machine.manufacturer} {machine.model} serial {machine.serial_number}".strip(),
        ]
        if failed:
            detail.insert(1, f"failed GPU {', '.join(failed)} (BMC: {_bmc_words(machine)})")
        self.changes.append(
            Change("create", "node", f"{cluster.name}/{hostname}", ", ".join(detail))
        )

        def create() -> None:
            node = fleet.node_create(
                cluster=cluster,
                hostname=hostname,
                gpu_model=gpu_model,
                fabric=entry.fabric,
                gpu_count=len(rows),
                bmc_address=entry.address,
                gpus=rows,
                actor=self.actor,
            )
            _credential_store(node=node, entry=entry, actor=self.actor)
            NodeInventory.objects.create(
                node=node, facts=inventory_facts(machine), read_at=timezone.now()
            )

        self._step(where, create)

    # a registered node

    def _plan_existing(self, where, entry, machine, node: Node) -> None:
        for key, value, wanted in (
            ("gpus", node.gpu_count, len(machine.gpus)),
            ("gpu_model", node.gpu_model, entry.gpu_model or node.gpu_model),
            ("fabric", node.fabric, entry.fabric or node.fabric),
        ):
            if value != wanted:
                self._check(
                    where,
                    key,
                    f"cannot change in place (registered {value}, the BMC says {wanted})",
                )
        if any(p.startswith(f"{where}:") for p in self.problems):
            return
        details = self._plan_gpus(where, machine, node)
        if node.bmc_address != entry.address:
            details.append(f"bmc_address {node.bmc_address or '(none)'} -> {entry.address}")
            self._step(
                where, fleet.node_update, node=node, bmc_address=entry.address, actor=self.actor
            )
        details.extend(self._plan_credential(node, entry))
        facts = inventory_facts(machine)
        stored = getattr(node, "bmc_inventory", None)
        if stored is None or stored.facts != facts:
            details.append("inventory read" if stored is None else "inventory changed")
            self._step(where, _inventory_store, node=node, facts=facts)
        if details:
            self.changes.append(
                Change("update", "node", f"{node.cluster.name}/{node.hostname}", "; ".join(details))
            )
        else:
            self.unchanged += 1

    def _plan_gpus(self, where, machine: SystemInventory, node: Node) -> list[str]:
        details = []
        cards = {gpu.index: gpu for gpu in node.gpus.all()}
        for read in machine.gpus:
            card = cards[read.index]
            if read.pci_address and read.pci_address != card.pci_address:
                self._check(
                    where,
                    "gpus",
                    f"GPU {read.index} PCI address changed (registered {card.pci_address}, "
                    f"the BMC says {read.pci_address})",
                )
                continue
            if read.uuid and read.uuid != card.uuid:
                details.append(f"GPU {read.index} replaced: uuid {card.uuid} -> {read.uuid}")
                self._step(where, fleet.gpu_replace, gpu=card, uuid=read.uuid, actor=self.actor)
            if read.health != card.health:
                said = read.bmc_health or "nothing"
                details.append(
                    f"GPU {read.index} health {card.health} -> {read.health} (BMC: {said})"
                )
                self._step(
                    where, fleet.gpu_set_health, gpu=card, health=read.health, actor=self.actor
                )
        return details

    def _plan_credential(self, node: Node, entry: DiscoveryEntry) -> list[str]:
        stored = getattr(node, "bmc_credential", None)
        said = (entry.username, entry.verify_tls, entry.system_id)
        if stored is not None and (stored.username, stored.verify_tls, stored.system_id) == said:
            try:
                if password_open(stored.password_sealed, node=node.hostname) == entry.password:
                    return []
            except SealError:
                pass
        self._step(
            f"node {node.hostname}", _credential_store, node=node, entry=entry, actor=self.actor
        )
        return ["BMC credentials stored" if stored is None else "BMC credentials changed"]


def _credential_store(*, node: Node, entry: DiscoveryEntry, actor: Actor) -> BmcCredential:
    return bmc.bmc_credential_set(
        node=node,
        username=entry.username,
        password=entry.password,
        verify_tls=entry.verify_tls,
        system_id=entry.system_id,
        actor=actor,
    )


def _inventory_store(*, node: Node, facts: dict) -> None:
    NodeInventory.objects.update_or_create(
        node=node, defaults={"facts": facts, "read_at": timezone.now()}
    )


def _hostname_problem(hostname: str) -> str | None:
    if not hostname:
        return "the BMC reports no host name; give one"
    return rules.hostname_problem(hostname) or None


def _gpus_problem(machine: SystemInventory) -> str | None:
    if not machine.gpus:
        return "the BMC reports no GPU"
    if len(machine.gpus) > MAX_GPUS_PER_NODE:
        return f"the BMC reports {len(machine.gpus)} GPUs; a node has at most {MAX_GPUS_PER_NODE}"
    models = sorted({gpu.model for gpu in machine.gpus})
    if len(models) > 1:
        return f"the BMC reports GPUs of several models ({', '.join(models)})"
    return None


def _bmc_words(machine: SystemInventory) -> str:
    return ", ".join(sorted({gpu.bmc_health for gpu in machine.failed_gpus}))


def _messages(error: ValidationError) -> list[tuple[str, list[str]]]:
    if hasattr(error, "error_dict"):
        return list(error.message_dict.items())
    return [("error", list(error.messages))]
