"""Whose capacity a VM's GPU time is on, so billing can price it (issue #19, item 4).

``attribute`` is the rule, a pure function of plain values, in this order:

1. **dedicated**: the VM runs on a node dedicated to its own tenant (``Node.dedicated_tenant``)
   — the tenant pays for the whole machine, whatever else is true;
2. **reserved**: the VM was placed inside its tenant's reservation (``vm.reservation``);
3. **borrowed**: the VM borrows capacity kept for another tenant's reservation
   (``vm.borrowed_from``), reclaimed first when that tenant claims it;
4. **shared**: anything else, the fleet's shared capacity.

A usage interval has one attribution: the interval opens with the VM's attribution
(``receivers``) and ends where it changes (``services.usage_reattribute``). The commitment is
kept as text (``reservation-<id>`` and ``<set>/<name>``, the node's hostname) so a record
keeps naming it after the reservation is deleted or the node released.
"""

from dataclasses import asdict, dataclass, fields

from gpucap.usage.models import Allocation


@dataclass(frozen=True)
class Attribution:
    allocation: str = Allocation.SHARED
    commitment_id: str = ""
    commitment_name: str = ""
    borrowed_from: str = ""
    dedicated_node: str = ""

    def fields(self) -> dict[str, str]:
        """The interval's (and its records') columns of the same names."""
        return asdict(self) | {"allocation": str(self.allocation)}


SHARED = Attribution()
FIELDS = fields(Attribution)


def reservation_ref(reservation_id: int) -> str:
    """A reservation's stable id in usage: ``reservation-<id>`` (as ``vm-<id>`` for a VM)."""
    return f"reservation-{reservation_id}"


def attribute(
    *,
    tenant_id: int,
    node_hostname: str | None,
    node_dedicated_tenant_id: int | None,
    reservation: tuple[int, str] | None,
    borrowed_from_id: int | None,
) -> Attribution:
    """The attribution of GPU time of a VM of ``tenant_id`` on a node (its hostname and the
    tenant it is dedicated to, or None), placed inside ``reservation`` (its id and
    ``<set>/<name>``, or None) or borrowing from the reservation ``borrowed_from_id``."""
    if node_hostname and node_dedicated_tenant_id == tenant_id:
        return Attribution(allocation=Allocation.DEDICATED, dedicated_node=node_hostname)
    if reservation is not None:
        reservation_id, name = reservation
        return Attribution(
            allocation=Allocation.RESERVED,
            commitment_id=reservation_ref(reservation_id),
            commitment_name=name,
        )
    if borrowed_from_id is not None:
        return Attribution(
            allocation=Allocation.BORROWED, borrowed_from=reservation_ref(borrowed_from_id)
        )
    return SHARED


def vm_attribution(vm) -> Attribution:
    """``attribute`` for a ``VirtualMachine`` loaded with its node and reservation (and the
    reservation's capacity set): no query when they are."""
    node = vm.node if vm.node_id else None
    reservation = vm.reservation if vm.reservation_id else None
    return attribute(
        tenant_id=vm.tenant_id,
        node_hostname=node.hostname if node else None,
        node_dedicated_tenant_id=node.dedicated_tenant_id if node else None,
        reservation=(reservation.pk, str(reservation)) if reservation else None,
        borrowed_from_id=vm.borrowed_from_id,
    )


def interval_attribution(interval) -> Attribution:
    """The attribution a usage interval (or record) carries."""
    return Attribution(**{field.name: getattr(interval, field.name) for field in FIELDS})
