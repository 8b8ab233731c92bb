"""``manage.py audit_invariants``: check the fleet's invariants in one consistent, read-only
snapshot (gpucap/plans/invariants/). Exit 0 when every rule holds; otherwise print each
violation (which rule, which rows, why) and exit 1. ``--json`` prints the report for a monitor."""

import json

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.serializers.json import DjangoJSONEncoder

from gpucap.plans.invariants import Report, invariants_audit
from gpucap.plans.invariants.base import at


class Command(BaseCommand):
    help = (
        "Check the fleet's invariants (no GPU held twice, allocations and usage as VM states "
        "say, notices and deadlines, plans applied once within floors, nothing stuck) in one "
        "read-only snapshot. Exits 1 and names the offending rows when one is broken."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print the report as JSON.")
        parser.add_argument(
            "--hypervisor",
            action="store_true",
            help="Also ask each cluster's driver about every VM that holds GPUs.",
        )
        parser.add_argument(
            "--metadata",
            action="store_true",
            help="Also compare the metadata documents in Redis with the database.",
        )
        parser.add_argument(
            "--limit",
            type=int,
            default=100,
            help="Report at most this many rows per rule (default 100).",
        )

    def handle(self, *args, **options) -> None:
        if options["limit"] < 1:
            raise CommandError("--limit must be at least 1")
        report = invariants_audit(
            hypervisor=options["hypervisor"],
            metadata=options["metadata"],
            limit=options["limit"],
        )
        if options["json"]:
            self.stdout.write(json.dumps(report_json(report), cls=DjangoJSONEncoder, indent=2))
        else:
            self.stdout.write(report_words(report))
        if not report.ok:
            raise CommandError(f"{len(report.violations)} invariant violation(s)", returncode=1)


def report_json(report: Report) -> dict:
    return {
        "ok": report.ok,
        "checked_at": report.checked_at,
        "rules": [
            {"rule": rule.name, "says": rule.says, "violations": len(report.of(rule))}
            for rule in report.rules
        ],
        "violations": [
            {"rule": v.rule, "subject": v.subject, "why": v.why, "rows": v.rows}
            for v in report.violations
        ],
    }


def report_words(report: Report) -> str:
    broken = [rule for rule in report.rules if report.of(rule)]
    head = f"audit_invariants at {at(report.checked_at)}: {len(report.rules)} rules checked, "
    if not broken:
        return head + "all hold."
    lines = [head + f"{len(report.violations)} violation(s) of {len(broken)} rule(s)."]
    for rule in broken:
        lines += ["", f"{rule.name}: {rule.says}"]
        lines += [f"  {v.subject}: {v.why}" for v in report.of(rule)]
    return "\n".join(lines)
