"""REST API for scheduled capacity policies (issue #18): a capacity set's schedule entries, the
temporary overrides an outside calendar or capacity controller sets, and the policy in force
at any instant. Operators only, as every other capacity-set endpoint.

- ``GET /api/capacity-sets/{id}/schedule/`` lists the set's entries in their written form
  (gpucap/schedules/spec.py), with the window in words and whether it is open now; ``POST``
  creates one, or replaces the one of that name. ``GET``, ``PUT`` (create or replace) and
  ``DELETE /api/capacity-sets/{id}/schedule/{name}/`` are one entry.
- ``GET /api/capacity-sets/{id}/overrides/`` lists the overrides that have not expired; ``POST``
  sets one (or replaces the one of that name) until ``expires_at`` or for ``ttl_seconds``;
  ``GET`` and ``DELETE /api/capacity-sets/{id}/overrides/{name}/`` are one override. An override
  expires by itself: the set's policy is applied again at that moment.
- ``GET /api/capacity-sets/{id}/policy/?at=...`` is what is in force at ``at`` (default now):
  each pool's rank and floor and each deployment's replica range, own and in force and where
  from, and every boundary of the 24 hours after ``at`` with what changes there.

The input serializers (gpucap/schedules/serializers.py) check a request's shape (JSON types,
fields they do not know); what a value means (a pool of this set, a time zone, a window that
clashes with another entry) is the services' to say, in the same ``{field: reason}`` words, so
the API, the fleet file and the set page's form refuse the same mistake the same way.
"""

from datetime import datetime, time, timedelta

from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, status
from rest_framework.response import Response

from gpucap.api.base import OperatorCommand
from gpucap.fleet.models import CapacitySet, Pool
from gpucap.inference.models import InferenceDeployment
from gpucap.schedules import calendar, services, spec
from gpucap.schedules.models import PolicyOverride, ScheduleEntry
from gpucap.schedules.selectors import SetSchedule, set_schedule
from gpucap.schedules.serializers import (
    PolicyOverrideSerializer,
    PolicyOverrideSetSerializer,
    PolicyQuerySerializer,
    PolicySerializer,
    ScheduleEntryCreateSerializer,
    ScheduleEntryReplaceSerializer,
    ScheduleEntrySerializer,
)

# What the policy endpoint looks ahead for boundaries.
PREVIEW = timedelta(hours=24)

# --- views ------------------------------------------------------------------------------------


class CapacitySetScheduleView(OperatorCommand):
    @extend_schema(
        responses=ScheduleEntrySerializer(many=True), operation_id="capacity_sets_schedule_list"
    )
    def get(self, request, id: int):
        """The set's schedule entries, by name."""
        schedule = set_schedule(_capacity_set(id))
        now = timezone.now()
        return Response(
            ScheduleEntrySerializer(
                [_entry_body(row, entry, now) for row, entry in _entries(schedule)], many=True
            ).data
        )

    @extend_schema(
        request=ScheduleEntryCreateSerializer,
        responses={200: ScheduleEntrySerializer, 201: ScheduleEntrySerializer},
        operation_id="capacity_sets_schedule_create",
    )
    def post(self, request, id: int):
        """Create an entry (201), or replace the one of that name (200). Refused (400, naming
        both) when it would set a value another entry sets while both are open. What is in
        force changes at once if its window is open now (audited; the arbiter plans again)."""
        capacity_set = _capacity_set(id)
        data = _validated(ScheduleEntryCreateSerializer, request.data)
        return _entry_saved(request, capacity_set, data)


class ScheduleEntryView(OperatorCommand):
    @extend_schema(
        responses=ScheduleEntrySerializer, operation_id="capacity_sets_schedule_retrieve"
    )
    def get(self, request, id: int, name: str):
        """One entry of the set's schedule."""
        schedule = set_schedule(_capacity_set(id))
        for row, entry in _entries(schedule):
            if row.name == name:
                return Response(ScheduleEntrySerializer(_entry_body(row, entry)).data)
        raise _no_entry(schedule.capacity_set, name)

    @extend_schema(
        request=ScheduleEntryReplaceSerializer,
        responses={200: ScheduleEntrySerializer, 201: ScheduleEntrySerializer},
        operation_id="capacity_sets_schedule_update",
    )
    def put(self, request, id: int, name: str):
        """Replace the entry (200), or create it (201), whole: what the body does not set, it no
        longer sets."""
        capacity_set = _capacity_set(id)
        data = _validated(ScheduleEntryReplaceSerializer, request.data)
        return _entry_saved(request, capacity_set, {"name": name, **data})

    @extend_schema(
        responses={204: OpenApiResponse(description="Deleted; what it set is no longer in force.")},
        operation_id="capacity_sets_schedule_destroy",
    )
    def delete(self, request, id: int, name: str):
        """Delete the entry (audited); if its window is open, its values leave force at once."""
        capacity_set = _capacity_set(id)
        row = ScheduleEntry.objects.filter(capacity_set=capacity_set, name=name).first()
        if row is None:
            raise _no_entry(capacity_set, name)
        services.schedule_entry_delete(entry=row, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class CapacitySetOverridesView(OperatorCommand):
    @extend_schema(
        responses=PolicyOverrideSerializer(many=True),
        operation_id="capacity_sets_overrides_list",
    )
    def get(self, request, id: int):
        """The set's overrides that have not expired (those yet to start included), by name."""
        schedule = set_schedule(_capacity_set(id))
        now = timezone.now()
        return Response(
            PolicyOverrideSerializer(
                [_override_body(row, o, now) for row, o in _overrides(schedule, now)], many=True
            ).data
        )

    @extend_schema(
        request=PolicyOverrideSetSerializer,
        responses={200: PolicyOverrideSerializer, 201: PolicyOverrideSerializer},
        operation_id="capacity_sets_overrides_create",
    )
    def post(self, request, id: int):
        """Set an override (201), or replace the one of that name (200): it wins over the
        schedule from starts_at (or now) until it expires, by itself, at expires_at (or
        ttl_seconds on). Refused (400) when another override sets the same value meanwhile.
        For an outside scheduler: check what it will do with the policy endpoint (or the set
        page's 24-hour preview) before trusting it."""
        capacity_set = _capacity_set(id)
        data = _validated(PolicyOverrideSetSerializer, request.data)
        existed = PolicyOverride.objects.filter(
            capacity_set=capacity_set, name=data["name"]
        ).exists()
        row = services.policy_override_set(capacity_set=capacity_set, data=data, actor=request.user)
        body = _one_override(capacity_set, row.name)
        return Response(body, status=status.HTTP_200_OK if existed else status.HTTP_201_CREATED)


class PolicyOverrideView(OperatorCommand):
    @extend_schema(
        responses=PolicyOverrideSerializer, operation_id="capacity_sets_overrides_retrieve"
    )
    def get(self, request, id: int, name: str):
        """One override that has not expired."""
        return Response(_one_override(_capacity_set(id), name))

    @extend_schema(
        responses={204: OpenApiResponse(description="Cleared; what it set is no longer in force.")},
        operation_id="capacity_sets_overrides_destroy",
    )
    def delete(self, request, id: int, name: str):
        """Clear an override before it expires (audited)."""
        capacity_set = _capacity_set(id)
        row = (
            PolicyOverride.objects.filter(capacity_set=capacity_set, name=name)
            .filter(expires_at__gt=timezone.now())
            .first()
        )
        if row is None:
            raise _no_override(capacity_set, name)
        services.policy_override_clear(override=row, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class CapacitySetPolicyView(OperatorCommand):
    @extend_schema(
        parameters=[PolicyQuerySerializer],
        responses=PolicySerializer,
        operation_id="capacity_sets_policy_retrieve",
    )
    def get(self, request, id: int):
        """What is in force at `at` (default now) by the set's schedule and overrides: each
        pool's rank and floor, each deployment's replica range (own, in force, and from where),
        the entries and overrides active then, and each boundary of the next 24 hours with
        what changes there. Nothing is stored or changed."""
        capacity_set = _capacity_set(id)
        query = _validated(PolicyQuerySerializer, request.query_params)
        at = query.get("at") or timezone.now()
        return Response(PolicySerializer(_policy_body(capacity_set, at)).data)


# --- helpers ----------------------------------------------------------------------------------


def _capacity_set(capacity_set_id: int) -> CapacitySet:
    capacity_set = CapacitySet.objects.filter(pk=capacity_set_id).first()
    if capacity_set is None:
        raise exceptions.NotFound(f"no capacity set {capacity_set_id}")
    return capacity_set


def _no_entry(capacity_set: CapacitySet, name: str) -> exceptions.NotFound:
    return exceptions.NotFound(f'capacity set {capacity_set.name} has no schedule entry "{name}"')


def _no_override(capacity_set: CapacitySet, name: str) -> exceptions.NotFound:
    return exceptions.NotFound(
        f'capacity set {capacity_set.name} has no override "{name}" in force or to come'
    )


def _validated(serializer_class, data) -> dict:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def _entry_saved(request, capacity_set: CapacitySet, data: dict) -> Response:
    existed = ScheduleEntry.objects.filter(capacity_set=capacity_set, name=data["name"]).exists()
    row = services.schedule_entry_save(capacity_set=capacity_set, data=data, actor=request.user)
    schedule = set_schedule(capacity_set)
    body = next(_entry_body(r, e) for r, e in _entries(schedule) if r.pk == row.pk)
    return Response(
        ScheduleEntrySerializer(body).data,
        status=status.HTTP_200_OK if existed else status.HTTP_201_CREATED,
    )


def _entries(schedule: SetSchedule):
    return zip(schedule.entry_rows, schedule.entries, strict=True)


def _overrides(schedule: SetSchedule, now: datetime):
    for row, override in zip(schedule.override_rows, schedule.overrides, strict=True):
        if override.expires_at > now:
            yield row, override


def _one_override(capacity_set: CapacitySet, name: str) -> dict:
    now = timezone.now()
    for row, override in _overrides(set_schedule(capacity_set), now):
        if row.name == name:
            return PolicyOverrideSerializer(_override_body(row, override, now)).data
    raise _no_override(capacity_set, name)


def _entry_body(row: ScheduleEntry, entry: calendar.Entry, now: datetime | None = None) -> dict:
    window = entry.window
    return {
        "id": row.pk,
        "name": row.name,
        "days": [calendar.DAY_NAMES[day] for day in sorted(window.days)],
        "start": _clock(window.start),
        "end": _clock(window.end),
        "time_zone": window.zone,
        **_changes_written(entry.changes),
        "window": window.describe(),
        "active_now": window.active_at(now or timezone.now()),
        "created_at": row.created_at,
        "updated_at": row.updated_at,
    }


def _override_body(row: PolicyOverride, override: calendar.Override, now: datetime) -> dict:
    return {
        "id": row.pk,
        "name": row.name,
        **_changes_written(override.changes),
        "starts_at": row.starts_at,
        "expires_at": row.expires_at,
        "reason": row.reason,
        "set_by": row.set_by,
        "active_now": override.active_at(now),
        "created_at": row.created_at,
    }


def _changes_written(changes) -> dict:
    written = spec.written(list(changes))
    return {
        "pools": written.get("pools", {}),
        "rank_order": written.get("rank_order"),
        "deployments": written.get("deployments", {}),
    }


def _clock(moment: time) -> str:
    return moment.strftime("%H:%M:%S" if moment.second else "%H:%M")


def _policy_body(capacity_set: CapacitySet, at: datetime) -> dict:
    schedule = set_schedule(capacity_set)
    policy = schedule.policy_at(at)
    sources = policy.sources
    rank_source = sources.get((calendar.RANK_ORDER, ""))
    pools = sorted(
        Pool.objects.filter(capacity_set=capacity_set), key=lambda p: policy.ranks[p.name]
    )
    deployments = InferenceDeployment.objects.filter(pool__capacity_set=capacity_set)
    boundaries = []
    before = policy
    for moment in schedule.boundaries(at, at + PREVIEW):
        after = schedule.policy_at(moment)
        boundaries.append({"at": moment, "differences": before.differences(after)})
        before = after
    return {
        "capacity_set": capacity_set.pk,
        "capacity_set_name": capacity_set.name,
        "at": at,
        "pools": [
            {
                "id": pool.pk,
                "name": pool.name,
                "kind": pool.kind,
                "rank": pool.rank,
                "rank_in_force": policy.ranks[pool.name],
                "rank_source": rank_source if policy.ranks[pool.name] != pool.rank else None,
                "floor_gpus": pool.floor_gpus,
                "floor_in_force": policy.floors[pool.name],
                "floor_source": sources.get((calendar.FLOOR_GPUS, pool.name)),
            }
            for pool in pools
        ],
        "deployments": [
            {
                "id": deployment.pk,
                "slug": deployment.slug,
                "pool": deployment.pool.name,
                "min_replicas": deployment.min_replicas,
                "max_replicas": deployment.max_replicas,
                "min_replicas_in_force": policy.replicas[deployment.slug][0],
                "max_replicas_in_force": policy.replicas[deployment.slug][1],
                "min_replicas_source": sources.get((calendar.MIN_REPLICAS, deployment.slug)),
                "max_replicas_source": sources.get((calendar.MAX_REPLICAS, deployment.slug)),
            }
            for deployment in deployments.select_related("pool").order_by("slug")
        ],
        "active_entries": [e.name for e in schedule.entries if e.window.active_at(at)],
        "active_overrides": [
            {
                "name": o.name,
                "set_by": o.set_by,
                "starts_at": o.starts_at,
                "expires_at": o.expires_at,
            }
            for o in schedule.overrides
            if o.active_at(at)
        ],
        "boundaries": boundaries,
    }
