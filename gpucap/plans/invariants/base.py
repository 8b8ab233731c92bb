"""What every rule of the audit shares: the audit's settings, a violation, and one query."""

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection

from gpucap.audit.models import AuditEvent
from gpucap.fleet.models import CapacitySet, Gpu, Node, Pool
from gpucap.notices.models import InterruptionNotice
from gpucap.plans.models import Plan, PlanAction
from gpucap.rentals.models import Allocation, VirtualMachine
from gpucap.rentals.services import HOLDING
from gpucap.usage.models import UsageInterval

# The tables the rules read, by the names their SQL uses.
TABLES = {
    "allocation": Allocation._meta.db_table,
    "capacity_set": CapacitySet._meta.db_table,
    "event": AuditEvent._meta.db_table,
    "gpu": Gpu._meta.db_table,
    "node": Node._meta.db_table,
    "notice": InterruptionNotice._meta.db_table,
    "plan": Plan._meta.db_table,
    "plan_action": PlanAction._meta.db_table,
    "pool": Pool._meta.db_table,
    "usage": UsageInterval._meta.db_table,
    "vm": VirtualMachine._meta.db_table,
}
# The audit events a VM's transitions write (``vm.<state>``) on the VM (``virtualmachine``).
VM_EVENT = VirtualMachine._meta.model_name
HOLDING_STATES = sorted(HOLDING)


@dataclass(frozen=True)
class Audit:
    now: datetime  # the database's clock when the snapshot was taken
    deadline_tolerance: timedelta
    stuck_after: timedelta
    limit: int  # rows reported per rule


@dataclass(frozen=True)
class Violation:
    rule: str
    subject: str  # what is wrong, as an operator names it: "vm-42", "plan 7", "h100-001 GPU 3"
    why: str  # in words
    rows: dict = field(default_factory=dict)  # the offending rows' ids and values


def rows(sql: str, **params) -> list[dict]:
    """Run one query (``{table}`` names from TABLES, ``%(param)s`` values) and return its rows
    as dicts."""
    with connection.cursor() as cursor:
        cursor.execute(sql.format(**TABLES), params)
        names = [column.name for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def at(moment: datetime | None) -> str:
    """A time as the report prints it (UTC, to the millisecond)."""
    if moment is None:
        return "now"
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def seconds(delta: timedelta) -> str:
    return f"{delta.total_seconds():.1f} s"
