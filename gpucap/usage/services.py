"""Changes to usage: ending intervals where their attribution changes, making the records
billing receives from the lifecycle's intervals, and pushing them to the billing webhook."""

import json
import logging
import random
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

import urllib3
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import connection, transaction
from django.db.models import QuerySet, Subquery
from django.utils import timezone

from gpucap import locks
from gpucap.audit.services import Actor, audit_record
from gpucap.rentals.models import VirtualMachine
from gpucap.usage import export, pieces, webhook
from gpucap.usage.attribution import interval_attribution, vm_attribution
from gpucap.usage.models import BillingDelivery, BillingWebhook, UsageInterval, UsageRecord

logger = logging.getLogger(__name__)

# Intervals that may still give records; the same predicate as the partial index
# usage_interval_unrecorded, so PostgreSQL reads only those.
UNRECORDED = "(i.ended_at IS NULL OR i.recorded_until IS NULL OR i.recorded_until < i.ended_at)"

INSERT_RECORDS_SQL = """
INSERT INTO usage_usagerecord
       (record_id, interval_id, tenant_id, vm_id, bare_metal_rental_id, deployment_id, pool_id,
        pool_kind, gpu_model, gpu_count, period_start, started_at, ended_at, gpu_seconds,
        allocation, commitment_id, commitment_name, borrowed_from, dedicated_node, created_at)
SELECT record_id, interval_id, tenant_id, vm_id, bare_metal_rental_id, deployment_id, pool_id,
       pool_kind, gpu_model, gpu_count, period_start, started_at, ended_at, gpu_seconds,
       allocation, commitment_id, commitment_name, borrowed_from, dedicated_node, %(now)s
  FROM ({rows}) AS rows
 ORDER BY period_start, interval_id
    ON CONFLICT (interval_id, period_start) DO NOTHING
"""

MARK_RECORDED_SQL = f"""
UPDATE usage_usageinterval i
   SET recorded_until = coalesce(i.ended_at, %(recorded_until)s)
 WHERE {UNRECORDED}
   AND (i.recorded_until IS NULL OR i.recorded_until < coalesce(i.ended_at, %(recorded_until)s))
   AND (i.ended_at IS NOT NULL OR i.started_at < %(recorded_until)s)
"""


@transaction.atomic
def usage_record(*, now: datetime | None = None) -> int:
    """Make a record for every piece of an interval whose end is final: the period is over, or
    the interval has ended. Returns how many were made.

    Runs under one advisory lock, so record ids become visible in increasing order (the
    webhook's cursor relies on it); a second run, or a run after a crash, makes nothing twice:
    a piece has one record (a unique constraint), and intervals remember how far they are
    recorded."""
    now = now or timezone.now()
    recorded_until = pieces.period_floor(now)
    locks.xact_lock(locks.USAGE, 0)
    rows = pieces.rows_sql(
        where=UNRECORDED,
        since="coalesce(i.recorded_until, i.started_at)",
        until="coalesce(i.ended_at, %(recorded_until)s)",
    )
    params = pieces.params(now=now, recorded_until=recorded_until)
    with connection.cursor() as cursor:
        cursor.execute(INSERT_RECORDS_SQL.format(rows=rows), params)
        made = cursor.rowcount
        cursor.execute(MARK_RECORDED_SQL, params)
    return made


# What ``usage_reattribute`` reads to compare: the interval's attribution and what
# ``attribution.vm_attribution`` reads of its VM (one query for every VM holding GPUs).
ATTRIBUTION_READS = (
    "vm_id",
    "allocation",
    "commitment_id",
    "commitment_name",
    "borrowed_from",
    "dedicated_node",
    "vm__tenant_id",
    "vm__borrowed_from_id",
    "vm__node__hostname",
    "vm__node__dedicated_tenant_id",
    "vm__reservation__name",
    "vm__reservation__capacity_set__name",
)


def usage_reattribute(*, vm_ids: Iterable[int] | QuerySet | None = None, now: datetime) -> int:
    """End, at ``now``, the open interval of every VM (of ``vm_ids``; None: every VM holding
    GPUs) whose attribution changed since it opened, and open the next with the new one, so
    GPU time is never counted twice nor lost. Returns how many VMs changed.

    Called by the usage beat (a change nobody reported is picked up within a minute), when a
    node is dedicated or released and when a reservation is deleted (receivers), and by
    whoever sets a VM's ``reservation`` or ``borrowed_from``. Idempotent, and safe run twice at
    once: one VM at a time under its row lock, the lock ``vm_transition`` takes, so neither a
    second run nor a VM letting its GPUs go meanwhile can leave two intervals open.

    An interval that began at or after ``now`` has counted no GPU time under the old
    attribution: it is corrected in place rather than split. So flags written just after a
    placement, reattributed with a moment taken just before ``vm_place``, give the VM one
    interval with the right attribution. The split is never before what was already recorded."""
    # A bare-metal rental's interval has one attribution for its whole life: only VMs move.
    open_intervals = (
        UsageInterval.objects.filter(ended_at=None, vm__isnull=False)
        .select_related("vm__node", "vm__reservation__capacity_set")
        .only(*ATTRIBUTION_READS)
    )
    if vm_ids is not None:
        # A queryset of ids stays a subquery: the set's VMs are never read into Python.
        ids = vm_ids if isinstance(vm_ids, QuerySet) else list(vm_ids)
        open_intervals = open_intervals.filter(vm_id__in=ids)
    changed = [
        interval.vm_id
        for interval in open_intervals
        if vm_attribution(interval.vm) != interval_attribution(interval)
    ]
    return sum(_reattribute_vm(vm_id=vm_id, now=now) for vm_id in sorted(changed))


@transaction.atomic
def _reattribute_vm(*, vm_id: int, now: datetime) -> bool:
    vm = (
        VirtualMachine.objects.select_for_update(of=("self",), no_key=True)
        .select_related("node", "reservation__capacity_set")
        .filter(pk=vm_id)
        .first()
    )
    interval = UsageInterval.objects.filter(vm_id=vm_id, ended_at=None).first()
    if vm is None or interval is None:  # the VM let its GPUs go meanwhile
        return False
    attribution = vm_attribution(vm)
    if attribution == interval_attribution(interval):  # another run got here first
        return False
    # Never before what was already recorded or before the interval began: no second count.
    moment = max(now, interval.recorded_until or interval.started_at, interval.started_at)
    if moment == interval.started_at:  # no GPU time counted before now: correct it in place
        UsageInterval.objects.filter(pk=interval.pk).update(**attribution.fields())
        return True
    UsageInterval.objects.filter(pk=interval.pk, ended_at=None).update(ended_at=moment)
    UsageInterval.objects.create(
        tenant_id=interval.tenant_id,
        vm_id=vm_id,
        pool_kind=interval.pool_kind,
        gpu_model=interval.gpu_model,
        gpu_count=interval.gpu_count,
        started_at=moment,
        **attribution.fields(),
    )
    return True


# --- billing webhook ----------------------------------------------------------------------------
#
# The receiver sees each record at most once per batch id: a batch is records
# (cursor, batch_last], fixed on the webhook row until the receiver answers 2xx, so a retry —
# after a failure, or after a crash between the POST and the commit — re-sends the very same
# batch id and records. Every record carries its own stable x_RecordId as well.

BILLING_URL_MAX_LENGTH = 500
BILLING_SECRET_MIN_LENGTH = 16
BILLING_SECRET_MAX_LENGTH = 200
BILLING_BATCH_SIZE_MAX = 5000
# After a failed delivery the next waits 30 s, doubling per failure up to an hour, less up to a
# fifth at random so many gpucap installations do not hit one receiver in step.
BILLING_BACKOFF_FIRST_SECONDS = 30
BILLING_BACKOFF_MAX_SECONDS = 3600
BILLING_KEEP_DELIVERIES = 1000
BILLING_ERROR_MAX_LENGTH = 500

# One pool for every push: connections to the receiver are reused. Never retried or redirected
# here: a failure is recorded and retried with backoff by the next push.
_http = urllib3.PoolManager(retries=False, num_pools=2, maxsize=2)


class PushOutcome(StrEnum):
    NOT_CONFIGURED = "not_configured"
    DISABLED = "disabled"
    BUSY = "busy"  # another pusher holds the lease
    WAITING = "waiting"  # backing off after a failure
    IDLE = "idle"  # every record has been accepted
    ACCEPTED = "accepted"
    FAILED = "failed"


@dataclass(frozen=True)
class BillingPushResult:
    outcome: PushOutcome
    delivery: BillingDelivery | None = None


@transaction.atomic
def billing_webhook_configure(
    *, url: str, secret: str | None, enabled: bool, batch_size: int, actor: Actor
) -> BillingWebhook:
    """Create or change the billing webhook. ``secret`` None (or empty) keeps the current one.
    A changed URL or secret, or switching the webhook on, ends any backoff: the next push tries
    at once. The cursor is kept: records the receiver accepted are never sent again."""
    current = BillingWebhook.objects.select_for_update().filter(pk=BillingWebhook.SINGLETON).first()
    url = (url or "").strip()
    secret = (secret or "").strip() or None
    errors = {}
    if problem := _billing_url_problem(url):
        errors["url"] = problem
    if secret is not None:
        if len(secret) < BILLING_SECRET_MIN_LENGTH:
            errors["secret"] = (
                f"must be at least {BILLING_SECRET_MIN_LENGTH} characters, got {len(secret)}"
            )
        elif len(secret) > BILLING_SECRET_MAX_LENGTH:
            errors["secret"] = f"must be at most {BILLING_SECRET_MAX_LENGTH} characters"
    elif current is None:
        errors["secret"] = "is required: the receiver checks every delivery's signature with it"
    if not isinstance(batch_size, int) or not 1 <= batch_size <= BILLING_BATCH_SIZE_MAX:
        errors["batch_size"] = f"must be 1 to {BILLING_BATCH_SIZE_MAX} records, got {batch_size!r}"
    if errors:
        raise ValidationError(errors)

    hook = current or BillingWebhook(pk=BillingWebhook.SINGLETON)
    before = _billing_settings(hook) if current else {}
    secret_changed = secret is not None and secret != hook.secret
    if url != hook.url or secret_changed or (enabled and not hook.enabled):
        hook.next_attempt_at = None
    hook.url, hook.enabled, hook.batch_size = url, enabled, batch_size
    if secret_changed:
        hook.secret = secret
    hook.save()
    after = _billing_settings(hook)
    if secret_changed:  # the audit log says that it changed, never what it is
        before["secret"], after["secret"] = ("set" if current else "—"), "changed"
    changed = {k: v for k, v in after.items() if before.get(k) != v}
    if changed:
        audit_record(
            actor=actor,
            verb="billing_webhook.configure",
            target=hook,
            before={k: before[k] for k in changed if k in before},
            after=changed,
        )
    return hook


def billing_push(
    *, now: datetime | None = None, force: bool = False, actor: Actor = None
) -> BillingPushResult:
    """Send the next batch of usage records to the billing webhook, once.

    Deliberately not one transaction: the POST happens between two short ones. The first takes
    the lease and fixes the batch; the second records the delivery and, on 2xx, advances the
    cursor past the batch (a conditional update). A pusher that finds the lease taken sends
    nothing, so two pushers never send a batch at once; a pusher that dies mid-POST frees the
    lease when it expires, and the batch is sent again with the same id. ``force`` (the
    operator's Send now) ignores the backoff, never the lease."""
    now = now or timezone.now()
    claimed = _billing_claim(now=now, force=force)
    if isinstance(claimed, PushOutcome):
        result = BillingPushResult(claimed)
    else:
        hook, token = claimed
        result = _billing_deliver(hook=hook, token=token, now=now)
    if actor is not None:
        _billing_audit_push(actor=actor, result=result)
    return result


def billing_push_backlog(
    *, now: datetime | None = None, max_batches: int = 20
) -> list[BillingPushResult]:
    """Push batch after batch while the receiver accepts them (the beat task): a backlog drains
    in one run, up to ``max_batches``."""
    results = []
    for _ in range(max_batches):
        results.append(billing_push(now=now))
        if results[-1].outcome != PushOutcome.ACCEPTED:
            break
    return results


def billing_backoff(failures: int) -> timedelta:
    """How long to wait after the ``failures``-th failure in a row (jittered down by <= 20%)."""
    delay = min(BILLING_BACKOFF_MAX_SECONDS, BILLING_BACKOFF_FIRST_SECONDS * 2 ** (failures - 1))
    return timedelta(seconds=delay * random.uniform(0.8, 1.0))


def billing_lease() -> timedelta:
    """Longer than any POST may take (its total timeout), so a live pusher keeps its lease."""
    return timedelta(seconds=2 * settings.BILLING_WEBHOOK_TIMEOUT_SECONDS + 30)


@transaction.atomic
def _billing_claim(*, now: datetime, force: bool) -> tuple[BillingWebhook, uuid.UUID] | PushOutcome:
    hook = BillingWebhook.objects.select_for_update().filter(pk=BillingWebhook.SINGLETON).first()
    if hook is None:
        return PushOutcome.NOT_CONFIGURED
    if not hook.enabled:
        return PushOutcome.DISABLED
    if hook.lease_until is not None and hook.lease_until > now:
        return PushOutcome.BUSY
    if not force and hook.next_attempt_at is not None and hook.next_attempt_at > now:
        return PushOutcome.WAITING
    if hook.batch_last is None:
        ids = list(
            UsageRecord.objects.filter(id__gt=hook.cursor)
            .order_by("id")
            .values_list("id", flat=True)[: hook.batch_size]
        )
        if not ids:
            return PushOutcome.IDLE
        hook.batch_first, hook.batch_last = ids[0], ids[-1]
    token = uuid.uuid4()
    hook.lease_token, hook.lease_until = token, now + billing_lease()
    hook.save(update_fields=["batch_first", "batch_last", "lease_token", "lease_until"])
    return hook, token


def _billing_deliver(*, hook: BillingWebhook, token: uuid.UUID, now: datetime) -> BillingPushResult:
    records = list(
        UsageRecord.objects.filter(id__gte=hook.batch_first, id__lte=hook.batch_last)
        .select_related(
            "tenant",
            "vm",
            "pool__cluster",
            "pool__capacity_set",
            "deployment",
            "bare_metal_rental__node__cluster",
        )
        .order_by("id")
    )
    batch_id = hook.batch_id
    body = billing_body(batch_id=batch_id, hook=hook, records=records)
    attempt = hook.consecutive_failures + 1
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "gpucap-billing-webhook/1",
        webhook.SIGNATURE_HEADER: webhook.signature_header(hook.secret, body),
        webhook.BATCH_HEADER: batch_id,
        webhook.IDEMPOTENCY_HEADER: f"gpucap-batch-{batch_id}",
        webhook.ATTEMPT_HEADER: str(attempt),
    }
    status, error, duration_ms = _billing_post(url=hook.url, body=body, headers=headers)
    return _billing_settle(
        token=token,
        batch=(hook.batch_first, hook.batch_last, len(records)),
        attempt=attempt,
        status=status,
        error=error,
        duration_ms=duration_ms,
        now=now,
    )


def billing_body(*, batch_id: str, hook: BillingWebhook, records: list[UsageRecord]) -> bytes:
    """The JSON a delivery carries: the batch, then one FOCUS row per record (the very columns
    of the CSV and JSON exports)."""
    payload = {
        "batch": {
            "id": batch_id,
            "first_record": hook.batch_first,
            "last_record": hook.batch_last,
            "count": len(records),
        },
        "records": [export.focus_row(_usage_row(record)) for record in records],
    }
    return json.dumps(payload, separators=(",", ":")).encode()


def _usage_row(record: UsageRecord) -> dict:
    """A record with the keys ``selectors.usage_rows`` yields, for ``export.focus_row``: a VM's
    or, with the VM's keys None, a bare-metal rental's."""
    pool, rental = record.pool, record.bare_metal_rental
    return {
        "record_id": record.record_id,
        "period_start": record.period_start,
        "started_at": record.started_at,
        "ended_at": record.ended_at,
        "final": True,
        "gpu_seconds": record.gpu_seconds,
        "pool_kind": record.pool_kind,
        "gpu_model": record.gpu_model,
        "gpu_count": record.gpu_count,
        "interval_id": record.interval_id,
        "tenant_id": record.tenant_id,
        "tenant_slug": record.tenant.slug,
        "tenant_name": record.tenant.name,
        "vm_id": record.vm_id,
        "vm_name": record.vm.name if record.vm_id else None,
        "vm_role": record.vm.role if record.vm_id else None,
        "bare_metal_rental_id": record.bare_metal_rental_id,
        "node_hostname": rental.node.hostname if rental else None,
        "pool_name": pool.name if pool else None,
        "cluster_name": pool.cluster.name if pool else rental.node.cluster.name,
        "capacity_set_name": pool.capacity_set.name if pool and pool.capacity_set_id else None,
        "deployment_slug": record.deployment.slug if record.deployment_id else None,
        **interval_attribution(record).fields(),
    }


def _billing_post(*, url: str, body: bytes, headers: dict) -> tuple[int | None, str, int]:
    """POST once: (status code or None, error or "", duration in ms). Never raises."""
    timeout = settings.BILLING_WEBHOOK_TIMEOUT_SECONDS
    started = time.monotonic()
    status, error = None, ""
    try:
        response = _http.request(
            "POST",
            url,
            body=body,
            headers=headers,
            timeout=urllib3.Timeout(total=timeout),
            retries=False,
            redirect=False,
        )
    except urllib3.exceptions.NewConnectionError as exc:  # before TimeoutError: a subclass
        error = f"could not connect: {_reason(exc)}"
    except urllib3.exceptions.TimeoutError:
        error = f"timed out: no answer within {timeout} s"
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        error = f"failed: {_reason(exc)}"
    else:
        status = response.status
        if not 200 <= status < 300:
            excerpt = response.data[:200].decode("utf-8", "replace").strip()
            error = f"HTTP {status}" + (f": {excerpt}" if excerpt else "")
            if 300 <= status < 400:
                error += " (redirects are not followed: configure the final URL)"
    duration_ms = round((time.monotonic() - started) * 1000)
    return status, error[:BILLING_ERROR_MAX_LENGTH], duration_ms


def _reason(exc: Exception) -> str:
    """urllib3's text without the connection's repr it starts with."""
    return str(exc).rsplit("): ", 1)[-1]


@transaction.atomic
def _billing_settle(
    *,
    token: uuid.UUID,
    batch: tuple[int, int, int],
    attempt: int,
    status: int | None,
    error: str,
    duration_ms: int,
    now: datetime,
) -> BillingPushResult:
    first, last, count = batch
    hook = BillingWebhook.objects.select_for_update().get(pk=BillingWebhook.SINGLETON)
    accepted = status is not None and 200 <= status < 300
    delivery = BillingDelivery.objects.create(
        webhook=hook,
        batch_id=f"{first}-{last}",
        first_record=first,
        last_record=last,
        record_count=count,
        attempt=attempt,
        accepted=accepted,
        status_code=status,
        error=error,
        duration_ms=duration_ms,
        at=now,
    )
    outcome = PushOutcome.ACCEPTED if accepted else PushOutcome.FAILED
    mine = BillingWebhook.objects.filter(pk=hook.pk, lease_token=token, batch_last=last)
    if accepted:
        # The cursor only moves forward, past exactly the batch this pusher sent.
        moved = mine.filter(cursor__lt=last).update(
            cursor=last,
            batch_first=None,
            batch_last=None,
            lease_token=None,
            lease_until=None,
            consecutive_failures=0,
            next_attempt_at=None,
            last_success_at=now,
            last_error="",
        )
        if moved:
            _billing_prune(hook)
    else:
        failures = hook.consecutive_failures + 1
        moved = mine.update(
            lease_token=None,
            lease_until=None,
            consecutive_failures=failures,
            next_attempt_at=now + billing_backoff(failures),
            last_error=error,
        )
    if not moved:
        # The lease ran out mid-POST and another pusher took the batch over: it owns the state.
        logger.warning("billing webhook: batch %s settled after its lease ran out", first)
    else:
        logger.log(
            logging.INFO if accepted else logging.WARNING,
            "billing webhook: batch %s-%s (%s records) %s%s",
            first,
            last,
            count,
            outcome,
            f": {error}" if error else "",
        )
    return BillingPushResult(outcome, delivery)


def _billing_prune(hook: BillingWebhook) -> None:
    """Keep the newest deliveries only: they are a troubleshooting log, not a ledger."""
    oldest_kept = (
        BillingDelivery.objects.filter(webhook=hook)
        .order_by("-id")
        .values("id")[BILLING_KEEP_DELIVERIES - 1 : BILLING_KEEP_DELIVERIES]
    )
    BillingDelivery.objects.filter(webhook=hook, id__lt=Subquery(oldest_kept)).delete()


@transaction.atomic
def _billing_audit_push(*, actor: Actor, result: BillingPushResult) -> None:
    hook = BillingWebhook.objects.filter(pk=BillingWebhook.SINGLETON).first()
    if hook is None:
        return
    delivery = result.delivery
    message = f"send now: {result.outcome}"
    if delivery is not None:
        message += f", batch {delivery.batch_id} ({delivery.record_count} records)"
        if delivery.error:
            message += f": {delivery.error}"
    audit_record(actor=actor, verb="billing_webhook.push", target=hook, message=message)


def _billing_settings(hook: BillingWebhook) -> dict:
    return {"url": hook.url, "enabled": hook.enabled, "batch_size": hook.batch_size}


def _billing_url_problem(url: str) -> str | None:
    if not url:
        return "is required"
    if len(url) > BILLING_URL_MAX_LENGTH:
        return f"must be at most {BILLING_URL_MAX_LENGTH} characters"
    try:
        URLValidator(schemes=["http", "https"])(url)
    except ValidationError:
        return f"must be an http:// or https:// URL, got {url!r}"
    return None
