"""Stored discoveries (docs/bmc.md, "Discovery through the API and the node page"): asked for
by an operator, carried out by the Celery task ``bmc.discover``, never in a web request.

- `discovery_request` (the API's list of BMCs) and `node_rediscover` (a node's page: its
  stored credentials) check what they are given, store the run ``reading`` and send the task.
- The task reads every BMC and stores the preview: the change lines and their digest, or the
  problems (``failed``: nothing can be applied).
- `discovery_apply_request` turns a preview to ``applying`` (once: a conditional update) and
  sends the task again, which reads every BMC again and, in one transaction, applies the
  changes only when they are still the previewed ones. Otherwise the run ends ``refused`` and
  the fresh preview is stored as a run of its own (``fresh_run``), ready to be applied in turn:
  what is applied is always what an operator saw.

Passwords given with the entries are sealed in the run until it ends, then dropped; a node's
entry reads the node's stored credentials at each read. Reading twice (a message delivered
again, two workers) is harmless: a run changes state by conditional updates, and the apply
holds the run's row. A worker marks the run's progress when it takes it and after each BMC;
a run that shows none for ``BMC_DISCOVERY_STALE_SECONDS`` is sent again or failed, and a
preview not applied within ``BMC_DISCOVERY_PREVIEW_TTL_SECONDS`` expires, its passwords
dropped (`gpucap.bmc.discovery_upkeep`).
"""

import logging
import re
from datetime import datetime, timedelta
from enum import StrEnum
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import InterfaceError, OperationalError, transaction
from django.db.models import Q
from django.utils import timezone

from gpucap.audit.services import Actor
from gpucap.bmc.discovery import (
    DiscoveryEntry,
    DiscoveryError,
    DiscoveryStale,
    changes_digest,
    discovery_compare,
    discovery_entry,
    discovery_read,
)
from gpucap.bmc.models import DiscoveryRun
from gpucap.bmc.passwords import SealError, password_open, password_seal
from gpucap.bmc.redfish import inventory_read
from gpucap.errors import Conflict
from gpucap.fleet import rules
from gpucap.fleet.fleetfile.spec import ApplyResult, Change
from gpucap.fleet.models import Cluster, Fabric, Node
from gpucap.inputs import text_problem
from gpucap.tasks import enqueue_on_commit

logger = logging.getLogger(__name__)

TASK = "bmc.discover"
MAX_ENTRIES = 256
# What a stored entry keeps: all an entry says but its password.
FIELDS = (
    "cluster",
    "address",
    "username",
    "verify_tls",
    "hostname",
    "gpu_model",
    "fabric",
    "system_id",
)
_SYSTEM_ID = re.compile(r"^[A-Za-z0-9._-]{0,64}$")
State = DiscoveryRun.State


class Outcome(StrEnum):
    PREVIEWED = "previewed"
    APPLIED = "applied"
    REFUSED = "refused"
    FAILED = "failed"
    NOTHING = "nothing"  # not reading nor applying (gone, or done by another worker)


@transaction.atomic
def discovery_request(*, entries: list[dict], actor: Actor = None) -> DiscoveryRun:
    """Store a discovery of ``entries`` (each as the YAML entry, with ``password``) and send it
    to a worker. Every problem is a ``ValidationError`` naming ``entries[i].field``; nothing
    is stored then."""
    problems = _entries_problems(entries)
    if problems:
        raise ValidationError(problems)
    try:
        sealed = [password_seal(entry["password"]) for entry in entries]
    except SealError as error:
        raise ValidationError({"entries[0].password": str(error)}) from None
    stored = [{key: entry.get(key, _DEFAULTS.get(key, "")) for key in FIELDS} for entry in entries]
    run = DiscoveryRun.objects.create(
        requested_by=_user(actor), entries=stored, passwords_sealed=sealed
    )
    enqueue_on_commit(TASK, run.pk)
    return run


@transaction.atomic
def node_rediscover(*, node: Node, actor: Actor = None) -> DiscoveryRun:
    """Discover ``node`` again with its stored address and credentials (its page's
    Rediscover). A discovery of the node still running is the answer: asking twice reads once.
    A node without a BMC address or credentials is a ``ValidationError`` naming ``bmc``."""
    node = Node.objects.select_for_update(no_key=True).select_related("cluster").get(pk=node.pk)
    running = DiscoveryRun.objects.filter(node=node, state__in=DiscoveryRun.ACTIVE).first()
    if running is not None:
        return running
    entry = discovery_entry(node)  # checks the address and credentials are there
    stored = {key: getattr(entry, key) for key in FIELDS}
    run = DiscoveryRun.objects.create(
        requested_by=_user(actor),
        node=node,
        entries=[{**stored, "node": node.pk}],
        passwords_sealed=[""],
    )
    enqueue_on_commit(TASK, run.pk)
    return run


def discovery_apply_request(*, run: DiscoveryRun, actor: Actor = None) -> DiscoveryRun:
    """Apply a previewed run: a worker reads the BMCs again and applies the changes if they
    are still the previewed ones. ``Conflict`` when the run is not a preview (any more); a
    preview older than ``BMC_DISCOVERY_PREVIEW_TTL_SECONDS`` expires now and is not applied."""
    now = timezone.now()
    previews_expire(now=now, run_id=run.pk)  # its own transaction: it stays expired
    with transaction.atomic():
        in_time = Q(read_at__gte=_expired_before(now)) | Q(read_at__isnull=True)
        asked = DiscoveryRun.objects.filter(in_time, pk=run.pk, state=State.PREVIEWED).update(
            state=State.APPLYING,
            applied_by=_user(actor),
            apply_requested_at=now,
            progress_at=now,
            sends=1,
        )
        run = DiscoveryRun.objects.select_related("fresh_run").get(pk=run.pk)
        if not asked:
            raise not_appliable(run)
        enqueue_on_commit(TASK, run.pk)
    return run


def previews_expire(*, now: datetime, run_id: int | None = None) -> int:
    """Previews older than ``BMC_DISCOVERY_PREVIEW_TTL_SECONDS`` expire: nothing can apply
    them, and their sealed passwords are dropped. How many did (of ``run_id`` alone, if given)."""
    overdue = DiscoveryRun.objects.filter(state=State.PREVIEWED, read_at__lt=_expired_before(now))
    if run_id is not None:
        overdue = overdue.filter(pk=run_id)
    return overdue.update(state=State.EXPIRED, passwords_sealed=[], finished_at=now)


def _expired_before(now: datetime) -> datetime:
    return now - timedelta(seconds=settings.BMC_DISCOVERY_PREVIEW_TTL_SECONDS)


def not_appliable(run: DiscoveryRun) -> Conflict:
    """Why ``run`` cannot be applied, in the words an operator acts on."""
    if run.state == State.REFUSED:
        fresh = f"run {run.fresh_run_id}" if run.fresh_run_id else "a new discovery"
        return Conflict(
            f"discovery {run.pk} was refused: the BMCs said something else when it was applied "
            f"than its preview showed, and nothing was applied; review the fresh preview, "
            f"{fresh}, and apply that one",
            code="stale_preview",
        )
    words = {
        State.READING: ("is still reading the BMCs: apply it once it is previewed", "not_ready"),
        State.APPLYING: ("is being applied already", "applying"),
        State.APPLIED: ("was applied already", "applied_already"),
        State.FAILED: ("has problems and cannot be applied; fix them and discover again", "failed"),
        State.EXPIRED: ("was not applied in time: the preview expired; discover again", "expired"),
    }
    text, code = words[run.state]
    return Conflict(f"discovery {run.pk} {text}", code=code)


def discovery_carry_out(*, run_id: int, read=inventory_read) -> Outcome:
    """What ``bmc.discover`` does: read the BMCs of a run that is reading (store the preview)
    or applying (apply it if it still holds). A database that is away raises (the task
    retries); any other error ends the run failed, saying so."""
    run = DiscoveryRun.objects.filter(pk=run_id).first()
    if run is None or run.state not in DiscoveryRun.ACTIVE or not _progress(run):
        return Outcome.NOTHING
    try:
        readings = discovery_read(_entries(run), read=_showing_progress(run, read))
        if run.state == State.READING:
            return _previewed(run, discovery_compare(readings, dry_run=True))
        return _apply(run.pk, readings)
    except _Gone:
        return Outcome.NOTHING
    except DiscoveryError as error:
        return _failed(run, error.problems)
    except (OperationalError, InterfaceError):
        raise
    except Exception as exc:  # a bug met by chance: say so on the run rather than hang
        logger.exception("discovery %s failed", run_id)
        return _failed(run, [f"discovery failed on gpucap's side ({type(exc).__name__}: {exc})"])


def run_result(run: DiscoveryRun) -> ApplyResult:
    """The run's changes in ``fleet_apply``'s words: "would ..." until applied."""
    return ApplyResult(
        changes=tuple(Change(**change) for change in run.changes),
        unchanged=run.unchanged,
        left_as_is=(),
        dry_run=run.state != State.APPLIED,
    )


# --- carrying a run out -------------------------------------------------------------------------


class _Gone(Exception):
    """The run is no longer in the state this worker took it in (failed as lost, or carried
    out by another worker): this one stops reading."""


def _progress(run: DiscoveryRun) -> bool:
    """Mark that a worker is at work on ``run``; False when it is not in its state any more."""
    marked = DiscoveryRun.objects.filter(pk=run.pk, state=run.state).update(
        progress_at=timezone.now()
    )
    return marked == 1


def _showing_progress(run: DiscoveryRun, read):
    def read_one(target):
        try:
            return read(target)
        finally:  # a BMC that refused is progress too
            if not _progress(run):
                raise _Gone  # the run is gone: what the BMC said no longer matters

    return read_one


def _entries(run: DiscoveryRun) -> list[DiscoveryEntry]:
    """The run's entries with their passwords: sealed in the run, or a node's stored ones."""
    entries, problems = [], []
    for place, (stored, sealed) in enumerate(zip(run.entries, run.passwords_sealed, strict=True)):
        where = f"entries[{place}]"
        if "node" in stored:
            node = Node.objects.select_related("cluster").filter(pk=stored["node"]).first()
            if node is None:
                problems.append(f"node {stored['hostname']}: no longer registered")
                continue
            try:
                entries.append(discovery_entry(node))
            except ValidationError as error:
                problems.extend(error.messages)
            continue
        try:
            password = password_open(sealed, node=stored["hostname"] or stored["address"])
        except SealError:
            problems.append(
                f"{where}: its password cannot be opened with the keys in BMC_CREDENTIAL_KEYS "
                "(a key dropped since the preview?); discover again"
            )
            continue
        fields = {key: stored[key] for key in FIELDS}
        entries.append(DiscoveryEntry(where=where, password=password, **fields))
    if problems:
        raise DiscoveryError(problems)
    return entries


def _previewed(run: DiscoveryRun, result: ApplyResult) -> Outcome:
    previewed = DiscoveryRun.objects.filter(pk=run.pk, state=State.READING).update(
        state=State.PREVIEWED, read_at=timezone.now(), **_changes(result)
    )
    return Outcome.PREVIEWED if previewed else Outcome.NOTHING


def _apply(run_id: int, readings) -> Outcome:
    """Apply under the run's row lock, in the transaction that applies the changes: a second
    worker waits, then finds the run applied and does nothing."""
    with transaction.atomic():
        run = (
            DiscoveryRun.objects.select_for_update(of=("self",))
            .select_related("applied_by")
            .filter(pk=run_id, state=State.APPLYING)
            .first()
        )
        if run is None:
            return Outcome.NOTHING
        try:
            result = discovery_compare(
                readings, dry_run=False, actor=run.applied_by, digest=run.digest
            )
        except DiscoveryStale as stale:
            run.fresh_run = DiscoveryRun.objects.create(
                requested_by=run.applied_by,
                node_id=run.node_id,
                entries=run.entries,
                passwords_sealed=run.passwords_sealed,
                state=State.PREVIEWED,
                read_at=timezone.now(),
                **_changes(stale.fresh),
            )
            _end(run, State.REFUSED)
            return Outcome.REFUSED
        except DiscoveryError as error:
            _end(run, State.FAILED, problems=error.problems)
            return Outcome.FAILED
        for key, value in _changes(result).items():
            setattr(run, key, value)
        _end(run, State.APPLIED)
        return Outcome.APPLIED


def _end(run: DiscoveryRun, state: str, *, problems: list[str] | None = None) -> None:
    run.state, run.passwords_sealed, run.finished_at = state, [], timezone.now()
    if problems is not None:
        run.problems = problems
    run.save()


def _failed(run: DiscoveryRun, problems: list[str]) -> Outcome:
    ended = DiscoveryRun.objects.filter(pk=run.pk, state=run.state).update(
        state=State.FAILED, problems=problems, passwords_sealed=[], finished_at=timezone.now()
    )
    return Outcome.FAILED if ended else Outcome.NOTHING


def _changes(result: ApplyResult) -> dict:
    changes = [
        {"verb": c.verb, "noun": c.noun, "label": c.label, "detail": c.detail}
        for c in result.changes
    ]
    return {
        "changes": changes,
        "unchanged": result.unchanged,
        "digest": changes_digest(result.changes),
    }


# --- checking a request -------------------------------------------------------------------------

_DEFAULTS = {"verify_tls": True}


def _entries_problems(entries) -> dict[str, str]:
    if not isinstance(entries, list) or not entries:
        return {"entries": "list at least one BMC"}
    if len(entries) > MAX_ENTRIES:
        return {"entries": f"at most {MAX_ENTRIES} BMCs at once, got {len(entries)}"}
    named = [e.get("cluster") for e in entries if isinstance(e, dict)]
    clusters = set(Cluster.objects.filter(name__in=named).values_list("name", flat=True))
    problems = {}
    for place, entry in enumerate(entries):
        for key, problem in _entry_problems(entry, clusters).items():
            problems[f"entries[{place}].{key}"] = problem
    return problems


def _entry_problems(entry: dict, clusters: set[str]) -> dict[str, str]:
    problems = {}
    for key in ("cluster", "address", "username", "password"):
        if not isinstance(entry.get(key), str) or not entry[key].strip():
            problems[key] = "is required"
    if "cluster" not in problems and entry["cluster"] not in clusters:
        problems["cluster"] = f"no cluster named {entry['cluster']}"
    if "address" not in problems and (problem := address_problem(entry["address"])):
        problems["address"] = problem
    for key, name in (("username", True), ("password", False), ("hostname", True)):
        value = entry.get(key, "")
        if (
            key not in problems
            and isinstance(value, str)
            and (bad := text_problem(value, name=name))
        ):
            problems[key] = bad
    hostname = entry.get("hostname", "")
    if "hostname" not in problems and hostname and (bad := rules.hostname_problem(hostname)):
        problems["hostname"] = bad
    if entry.get("fabric", "") not in ("", *Fabric.values):
        problems["fabric"] = f"must be one of: {', '.join(Fabric.values)} (or empty)"
    if not _SYSTEM_ID.match(entry.get("system_id", "") or ""):
        problems["system_id"] = (
            "must be a Redfish id: letters, digits, '.', '_' and '-' (at most 64)"
        )
    return problems


def address_problem(address: str) -> str | None:
    """What is wrong with a BMC address: a host name or IP address, with a port or not, or an
    ``http(s)://`` URL; None when it will do."""
    if any(ch.isspace() for ch in address.strip()) or address != address.strip():
        return "must not contain spaces"
    url = address if "://" in address else f"https://{address}"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError:
        return "is not a host name, an address or a URL"
    if parts.scheme not in ("http", "https"):
        return f"speaks {parts.scheme}://; a BMC is reached over https:// (or http://)"
    if not parts.hostname:
        return "names no host"
    return None


def _user(actor: Actor):
    return actor if actor is not None and actor.is_authenticated else None
