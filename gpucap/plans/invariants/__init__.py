"""The invariant audit (``manage.py audit_invariants``): what must always hold across the apps,
checked in one consistent read of the database, so an operator or a monitor can ask "is the
fleet sound?" at any moment and be told which rule broke, on which rows, and why.

It lives with plans because plans is the app above everything it reads (fleet, rentals,
notices, usage, audit): the promises it checks are the arbiter's, kept by all of them.

Each rule is one set-based query (a fixed number of queries however large the fleet), run in
one REPEATABLE READ, READ ONLY transaction: every rule sees the same moment, and the audit can
change nothing. Two optional rules look outside the database (the hypervisor, the metadata
documents in Redis); they are read while the snapshot is held, so a change committed since may
show as a difference: run them again before acting on one.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction

from gpucap.plans.invariants import applies, holding, notices, outside
from gpucap.plans.invariants.base import Audit, Violation

__all__ = ["RULES", "Audit", "Report", "Rule", "Violation", "invariants_audit", "one_snapshot"]


@dataclass(frozen=True)
class Rule:
    name: str
    says: str  # the invariant, in words
    check: Callable[[Audit], list[Violation]]
    optional: str = ""  # "" for a database rule; else the flag that turns it on


RULES: tuple[Rule, ...] = (
    Rule(
        "gpu_held_twice",
        "no GPU is held by two VMs at once, now or in history",
        holding.gpu_held_twice,
    ),
    Rule(
        "holding_matches_state",
        "a VM that holds GPUs (provisioning, running, notified, "
        "stopping) holds exactly its GPUs on its node and has one open usage interval; any "
        "other VM holds none and has none",
        holding.holding_matches_state,
    ),
    Rule(
        "notice_matches_vm",
        "an open notice's VM is notified or stopping, a notified VM has "
        "an open notice, and a completed notice has an outcome",
        notices.notice_matches_vm,
    ),
    Rule(
        "notice_length",
        "an arbiter notice's deadline is its issue time plus its capacity set's notice_seconds",
        notices.notice_length,
    ),
    Rule(
        "one_notice_per_victim",
        "a plan sends a VM at most one notice",
        notices.one_notice_per_victim,
    ),
    Rule(
        "deadline_kept",
        "a notified VM is stopped no earlier than its deadline (unless its "
        "guest acknowledged or shut down, or its owner stopped it) and lets go of its GPUs no "
        "later than the deadline plus AUDIT_DEADLINE_TOLERANCE_SECONDS",
        notices.deadline_kept,
    ),
    Rule(
        "reclaimed_spot_resumes",
        "a spot VM the arbiter reclaimed goes back to pending (or "
        "is ended by its owner), never to stopped",
        notices.reclaimed_spot_resumes,
    ),
    Rule(
        "on_demand_untouched",
        "the arbiter never preempts or notifies an on-demand VM",
        notices.on_demand_untouched,
    ),
    Rule(
        "one_apply_per_plan",
        "an applied plan was applied once (one plan.approve or "
        "plan.enforce event); any other plan never",
        applies.one_apply_per_plan,
    ),
    Rule(
        "floors_held",
        "no applied plan takes a pool below its floor (nor lower, when it was below already)",
        applies.floors_held,
    ),
    Rule(
        "nothing_stuck",
        "no VM stays provisioning or stopping longer than AUDIT_STUCK_SECONDS",
        holding.nothing_stuck,
    ),
    Rule(
        "placement_waits_for_someone",
        "an approved placement that waits has a VM leaving "
        "for it, or was freed less than AUDIT_STUCK_SECONDS ago",
        applies.placement_waits_for_someone,
    ),
    Rule(
        "at_risk_matches_plans",
        "a VM is at risk exactly while its capacity set's proposed plan names it as a victim, "
        "since no later than that plan",
        applies.at_risk_matches_plans,
    ),
    Rule(
        "hypervisor_agrees",
        "the hypervisor (the cluster's driver) runs every VM the database says holds GPUs",
        outside.hypervisor_agrees,
        optional="hypervisor",
    ),
    Rule(
        "metadata_agrees",
        "the metadata document of every served VM (Redis) is the one the "
        "database gives, and no other VM's is served",
        outside.metadata_agrees,
        optional="metadata",
    ),
)


@dataclass
class Report:
    checked_at: datetime
    rules: list[Rule]
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def of(self, rule: Rule) -> list[Violation]:
        return [v for v in self.violations if v.rule == rule.name]


def invariants_audit(
    *, hypervisor: bool = False, metadata: bool = False, limit: int = 100, now=None
) -> Report:
    """Check every rule (and the optional ones asked for) in one consistent, read-only view of
    the database. ``limit`` bounds the rows reported per rule."""
    flags = {"hypervisor": hypervisor, "metadata": metadata}
    rules = [rule for rule in RULES if not rule.optional or flags[rule.optional]]
    with one_snapshot():
        audit = Audit(
            now=now or _database_now(),
            deadline_tolerance=timedelta(seconds=settings.AUDIT_DEADLINE_TOLERANCE_SECONDS),
            stuck_after=timedelta(seconds=settings.AUDIT_STUCK_SECONDS),
            limit=limit,
        )
        report = Report(checked_at=audit.now, rules=rules)
        for rule in rules:
            report.violations.extend(rule.check(audit))
    return report


@contextmanager
def one_snapshot() -> Iterator[None]:
    """A REPEATABLE READ, READ ONLY transaction: every query sees one moment, none can write.
    Inside a caller's transaction (tests) the isolation cannot change any more; its own view
    is used."""
    if connection.in_atomic_block:
        with transaction.atomic():
            yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield


def _database_now() -> datetime:
    """The database's clock as the snapshot is taken (its first query), so "how long ago" is
    measured from the moment the rows describe, whatever this host's clock says."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        (now,) = cursor.fetchone()
    return now
