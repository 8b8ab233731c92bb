"""Reads of the audit log for pages, each in a fixed number of queries."""

import json
from dataclasses import dataclass

from django.core.paginator import Page, Paginator
from django.db import models

from gpucap.audit.models import AuditEvent

PAGE_SIZE = 50


@dataclass(frozen=True)
class Change:
    field: str
    before: str
    after: str


def event_changes(event: AuditEvent) -> list[Change]:
    """The fields an event's before/after differ in, as short text, in key order."""
    keys = sorted(set(event.before) | set(event.after))
    return [
        Change(field=key, before=_short(event.before.get(key)), after=_short(event.after.get(key)))
        for key in keys
        if event.before.get(key) != event.after.get(key)
    ]


def _short(value: object, limit: int = 80) -> str:
    if value is None:
        return "—"
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class AuditFilterOptions:
    verbs: list[str]
    object_types: list[str]


def audit_filter_options() -> AuditFilterOptions:
    events = AuditEvent.objects.order_by()
    return AuditFilterOptions(
        verbs=list(events.order_by("verb").values_list("verb", flat=True).distinct()),
        object_types=list(
            events.order_by("object_type").values_list("object_type", flat=True).distinct()
        ),
    )


def audit_page(*, verb: str = "", object_type: str = "", page: object = 1) -> Page:
    """One page of events, newest first, each with its ``changes``. Two queries (count, rows)."""
    events = AuditEvent.objects.order_by("-created_at", "-id")
    if verb:
        events = events.filter(verb=verb)
    if object_type:
        events = events.filter(object_type=object_type)
    result = Paginator(events, PAGE_SIZE).get_page(page)
    result.object_list = list(result.object_list)
    for event in result.object_list:
        event.changes = event_changes(event)
    return result


def events_for(target: models.Model, *, limit: int = 10) -> list[AuditEvent]:
    """The latest events about one object, newest first. One query."""
    events = list(
        AuditEvent.objects.filter(
            object_type=target._meta.model_name, object_id=str(target.pk)
        ).order_by("-created_at", "-id")[:limit]
    )
    for event in events:
        event.changes = event_changes(event)
    return events
