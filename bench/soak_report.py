"""The end of ``bench/soak.py``'s day: wait for the notices sent to run out, then print what the
day did (from the recorder and the database) against the goals, and say whether they were met."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

GOAL_WITHIN_SECONDS = 2.0
GOAL_SHARE = 0.99


def notices_settle(*, timeout: float) -> bool:
    """Wait until no notice is open (every VM warned has stopped or let go); returns whether
    that happened within ``timeout`` seconds."""
    from django.db import connection

    from gpucap.notices.models import InterruptionNotice

    deadline = time.monotonic() + timeout
    try:
        while InterruptionNotice.objects.filter(completed_at=None).exists():
            if time.monotonic() > deadline:
                return False
            time.sleep(1)
        return True
    finally:
        connection.close()


def report(recorder, *, day_seconds: float, settled: bool, logs: list[Path]) -> int:
    """Print the summary block; returns the exit status (0: every goal met)."""
    api = [call for calls in recorder.api.values() for call in calls]
    statuses = Counter(_status_class(status) for status, _ in api)
    print(
        f"day: {day_seconds:.0f} s of wall time, load average at its end "
        f"{os.getloadavg()[0]:.1f} (of every process on the machine)"
    )
    print(
        f"API requests: {len(api):,} ({_counts(statuses)}), latency "
        f"p50 {_ms(_quantile([s for _, s in api], 0.50))}, "
        f"p99 {_ms(_quantile([s for _, s in api], 0.99))}"
    )
    for kind, calls in sorted(recorder.api.items()):
        seconds = [s for _, s in calls]
        kinds = Counter(str(status) for status, _ in calls)
        print(
            f"  {kind:<14} {len(calls):>6,}  p50 {_ms(_quantile(seconds, 0.5)):>8}  "
            f"p99 {_ms(_quantile(seconds, 0.99)):>8}  {_counts(kinds)}"
        )
    served = recorder.router[200]
    refused = sum(n for status, n in recorder.router.items() if status in (429, 503))
    other = sum(recorder.router.values()) - served - refused
    refusals = Counter({str(code): n for code, n in recorder.router.items() if code in (429, 503)})
    print(f"router: {served:,} chat completions served, {refused:,} refused ", end="")
    print(f"({_counts(refusals) if refused else '429/503'}), {other:,} other")

    figures = database_figures()
    print(
        f"plans applied: {figures['plans']:,} ({figures['placements']:,} placements, "
        f"{figures['preemptions']:,} preemptions)"
    )
    print(f"notices sent: {figures['notices']:,} ({_counts(figures['reasons'])})")
    print(f"  ended as: {_counts(figures['outcomes'])}")
    deadlines = figures["deadlines"]
    released = [late for *_, late in deadlines]
    stopping = [sent for _, _, sent, _ in deadlines if sent is not None]
    print(
        "deadline lateness, from each notice's deadline (stopped at the deadline, "
        f"{len(released):,} notices):"
    )
    print(f"  to its VM's GPUs released (VM off on the hypervisor): {_spread(released)}")
    print(f"  to its stop sent (vm.stopping event):                  {_spread(stopping)}")
    within = sum(1 for late in released if late <= GOAL_WITHIN_SECONDS)
    share = within / len(released) if released else 0.0
    print(f"  within {GOAL_WITHIN_SECONDS:g} s: {within:,} of {len(released):,} ({share:.1%})")
    for notice, reason, sent, late in sorted(deadlines, key=lambda d: -d[3])[:5]:
        if late > GOAL_WITHIN_SECONDS:
            sent_words = "never" if sent is None else f"+{sent:.2f} s"
            print(f"  late: notice {notice} ({reason}): sent {sent_words}, released +{late:.2f} s")
    if not settled:
        print(f"  {figures['open']} notices still open when the bench gave up waiting")
    print(
        f"audit runs: {recorder.audits} (p50 {_ms(_quantile(recorder.audit_seconds, 0.5))}, "
        f"max {_ms(max(recorder.audit_seconds, default=None))} each), "
        f"violations: {recorder.violations}"
    )
    for line in recorder.violation_lines:
        print(f"  {line}")

    logged = log_errors(logs)
    print(f"Celery errors logged (workers, beat): {len(logged)}")
    for line in logged[:5]:
        print(f"  {line}")
    if recorder.failed_actors:
        print(f"actors that failed (traceback above): {', '.join(recorder.failed_actors)}")
    errors = statuses.get("5xx", 0) + statuses.get("no answer", 0) + other
    errors += len(recorder.failed_actors) + len(logged)
    met = recorder.violations == 0 and errors == 0 and settled and released and share >= GOAL_SHARE
    print(
        "\ngoals (0 violations, no 5xx, unanswered request or logged error, "
        f">= {GOAL_SHARE:.0%} of deadlines kept within {GOAL_WITHIN_SECONDS:g} s): ",
        end="",
    )
    print("met" if met else "NOT met")
    return 0 if met else 1


def log_errors(logs: list[Path]) -> list[str]:
    """The ERROR and CRITICAL lines of the Celery processes' logs (they log WARNING and up)."""
    return [
        f"{log.stem}: {line.strip()[:200]}"
        for log in logs
        for line in log.read_text(errors="replace").splitlines()
        if " ERROR" in line or " CRITICAL" in line
    ]


def database_figures() -> dict:
    """Plans, notices and lateness as the database recorded them. Lateness is of the notices
    the deadline stopped (outcome ``deadline``): those the guest, its owner or a drain's
    cancel ended earlier have no deadline to keep."""
    from django.db import connection
    from django.db.models import Sum

    from gpucap.audit.models import AuditEvent
    from gpucap.notices.models import InterruptionNotice
    from gpucap.plans.models import Plan

    try:
        applied = Plan.objects.filter(status=Plan.Status.APPLIED)
        sums = applied.aggregate(placements=Sum("placements"), preemptions=Sum("preemptions"))
        notices = list(InterruptionNotice.objects.all())
        stopped = [n for n in notices if n.outcome == "deadline" and n.completed_at]
        stops = {}  # VM id -> its vm.stopping times, in order
        for vm, at in (
            AuditEvent.objects.filter(
                verb="vm.stopping",
                object_type="virtualmachine",
                object_id__in=[str(n.vm_id) for n in stopped],
            )
            .order_by("created_at")
            .values_list("object_id", "created_at")
        ):
            stops.setdefault(int(vm), []).append(at)
        return {
            "plans": applied.count(),
            "placements": sums["placements"] or 0,
            "preemptions": sums["preemptions"] or 0,
            "notices": len(notices),
            "reasons": Counter(n.reason for n in notices),
            "outcomes": Counter(n.outcome or "open" for n in notices),
            "open": sum(1 for n in notices if n.completed_at is None),
            # (notice, reason, seconds to its stop sent, seconds to its GPUs released)
            "deadlines": [
                (
                    n.pk,
                    n.reason,
                    _after(next((t for t in stops.get(n.vm_id, []) if t >= n.issued_at), None), n),
                    _after(n.completed_at, n),
                )
                for n in stopped
            ],
        }
    finally:
        connection.close()


def _after(at, notice) -> float | None:
    return None if at is None else (at - notice.deadline).total_seconds()


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _spread(seconds: list[float]) -> str:
    if not seconds:
        return "none"
    return (
        f"p50 {_quantile(seconds, 0.5):.2f} s, p99 {_quantile(seconds, 0.99):.2f} s, "
        f"max {max(seconds):.2f} s"
    )


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def _status_class(status: int) -> str:
    return "no answer" if status == 0 else f"{status // 100}xx"


def _counts(counter: Counter) -> str:
    return ", ".join(f"{key} {n:,}" for key, n in sorted(counter.items())) or "none"
