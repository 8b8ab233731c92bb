"""The schedules API's serializers: the written form of an entry or an override coming in
(shape only: JSON types and fields they do not know; what a value means is the services' to
say), and the entries, overrides and policy going out. The views are in `gpucap.schedules.api`.
"""

from datetime import datetime

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from gpucap.api.base import InputSerializer
from gpucap.schedules import spec

FIRST_YEAR, LAST_YEAR = 1970, 9998

# --- the written form, in and out -------------------------------------------------------------


class PoolSettingsSerializer(InputSerializer):
    """What an entry or an override sets for one pool."""

    floor_gpus = serializers.IntegerField(
        required=False, help_text="The pool's floor while this is in force, in GPUs."
    )


class DeploymentSettingsSerializer(InputSerializer):
    """What an entry or an override sets for one inference deployment."""

    min_replicas = serializers.IntegerField(
        required=False,
        help_text="The deployment's minimum while this is in force: a raised minimum makes the "
        "autoscaler ask for replicas, which are demand for the set's arbiter.",
    )
    max_replicas = serializers.IntegerField(required=False)


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "description": 'e.g. "mon-fri", "sat, sun", "every day"'},
            {
                "type": "array",
                "items": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
                "description": "e.g. [mon, tue] or [0, 1] (0 is Monday)",
            },
        ],
        "description": "The days the window starts on.",
    }
)
class DaysField(serializers.Field):
    """Text or a list: which days it names is the schedule reader's business (spec.read_days)."""

    default_error_messages = {
        "invalid": 'must name days: a list such as ["mon", "tue"] or [0, 1], or text such as '
        '"mon-fri" or "every day"'
    }

    def to_internal_value(self, data):
        if not isinstance(data, (str, list)):
            self.fail("invalid")
        return data

    def to_representation(self, value):
        return value


@extend_schema_field(
    {
        "type": "string",
        "pattern": r"^([01]\d|2[0-3]):[0-5]\d(:[0-5]\d)?$",
        "description": "A time of day on the wall clock of time_zone, HH:MM (24-hour).",
    }
)
class ClockField(serializers.CharField):
    """HH:MM, read by spec.read_clock."""


@extend_schema_field(OpenApiTypes.DATETIME)
class MomentField(serializers.CharField):
    """An ISO 8601 time with a time zone, read by the service (a time without one is refused,
    not guessed)."""


def _changes_fields() -> dict:
    return {
        "pools": serializers.DictField(
            child=PoolSettingsSerializer(),
            required=False,
            help_text="By pool name: its floor_gpus while this is in force.",
        ),
        "rank_order": serializers.ListField(
            child=serializers.CharField(),
            required=False,
            allow_null=True,
            help_text="Two or more of the set's pools, highest priority first: they take the "
            "ranks they hold among themselves in this order; the other pools keep theirs.",
        ),
        "deployments": serializers.DictField(
            child=DeploymentSettingsSerializer(),
            required=False,
            help_text="By deployment slug: its min_replicas and/or max_replicas.",
        ),
    }


class ScheduleEntryReplaceSerializer(InputSerializer):
    """An entry's window and what it sets (the name is the path's)."""

    hints = {
        "name": "is the entry's name in the path; to rename, create the new and delete the old"
    }

    days = DaysField()
    start = ClockField(help_text='When the window opens, e.g. "08:00".')
    end = ClockField(
        help_text='When it closes, e.g. "20:00"; at or before start, the next day (an end equal '
        "to the start: a whole day)."
    )
    time_zone = serializers.CharField(help_text="IANA time zone, e.g. America/New_York.")

    def get_fields(self):
        return {**super().get_fields(), **_changes_fields()}


class ScheduleEntryCreateSerializer(ScheduleEntryReplaceSerializer):
    """A named entry: its window and what it sets while open."""

    hints = {}

    name = serializers.CharField(help_text=f"Unique in the set: {spec.NAME_RULE}.")


class PolicyOverrideSetSerializer(InputSerializer):
    """A named override: what it sets, and from when until when."""

    hints = dict.fromkeys(
        spec.WINDOW_FIELDS,
        "an override has no window: it lasts from starts_at (or now) until expires_at",
    )

    name = serializers.CharField(help_text=f"Unique in the set: {spec.NAME_RULE}.")
    expires_at = MomentField(
        required=False, help_text="When it ends (at most 31 days on); or give ttl_seconds."
    )
    ttl_seconds = serializers.IntegerField(
        required=False, help_text="How long it lasts from starts_at (or now); or give expires_at."
    )
    starts_at = MomentField(required=False, help_text="When it begins; absent: at once.")
    reason = serializers.CharField(required=False, allow_blank=True, max_length=200)

    def get_fields(self):
        return {**super().get_fields(), **_changes_fields()}


class ScheduleEntrySerializer(serializers.Serializer):
    """An entry in its written form (what POST takes), with its id, its window in words and
    whether it is open now."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    days = serializers.ListField(
        child=serializers.CharField(), help_text="The days the window starts on: mon .. sun."
    )
    start = serializers.CharField(help_text="HH:MM on the wall clock of time_zone.")
    end = serializers.CharField(help_text="HH:MM; at or before start: the next day.")
    time_zone = serializers.CharField()
    pools = serializers.DictField(child=PoolSettingsSerializer())
    rank_order = serializers.ListField(child=serializers.CharField(), allow_null=True)
    deployments = serializers.DictField(child=DeploymentSettingsSerializer())
    window = serializers.CharField(help_text="In words: Mon-Fri 08:00-20:00 America/New_York.")
    active_now = serializers.BooleanField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class PolicyOverrideSerializer(serializers.Serializer):
    """An override: what it sets, from when until when, who set it and why."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    pools = serializers.DictField(child=PoolSettingsSerializer())
    rank_order = serializers.ListField(child=serializers.CharField(), allow_null=True)
    deployments = serializers.DictField(child=DeploymentSettingsSerializer())
    starts_at = serializers.DateTimeField(allow_null=True, help_text="Null: from when it was set.")
    expires_at = serializers.DateTimeField()
    reason = serializers.CharField(allow_blank=True)
    set_by = serializers.CharField(help_text="Who set it: the API user's name.")
    active_now = serializers.BooleanField(help_text="False until starts_at.")
    created_at = serializers.DateTimeField()


# --- the policy in force ----------------------------------------------------------------------


class PolicyPoolSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    kind = serializers.CharField(help_text="on_demand, spot or inference")
    rank = serializers.IntegerField(help_text="The pool's own rank (1 is the highest priority).")
    rank_in_force = serializers.IntegerField()
    rank_source = serializers.CharField(
        allow_null=True,
        help_text='Where a rank other than its own comes from: entry "..." or override "..." '
        "(set by ...); null: its own.",
    )
    floor_gpus = serializers.IntegerField(help_text="The pool's own floor.")
    floor_in_force = serializers.IntegerField()
    floor_source = serializers.CharField(allow_null=True, help_text="Null: its own.")


class PolicyDeploymentSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    slug = serializers.CharField()
    pool = serializers.CharField(help_text="Pool name.")
    min_replicas = serializers.IntegerField(help_text="The deployment's own.")
    max_replicas = serializers.IntegerField(help_text="The deployment's own.")
    min_replicas_in_force = serializers.IntegerField()
    max_replicas_in_force = serializers.IntegerField()
    min_replicas_source = serializers.CharField(allow_null=True, help_text="Null: its own.")
    max_replicas_source = serializers.CharField(allow_null=True, help_text="Null: its own.")


class PolicyOverrideActiveSerializer(serializers.Serializer):
    name = serializers.CharField()
    set_by = serializers.CharField()
    starts_at = serializers.DateTimeField(allow_null=True)
    expires_at = serializers.DateTimeField()


class PolicyBoundarySerializer(serializers.Serializer):
    at = serializers.DateTimeField(
        help_text="When an entry opens or closes, or an override starts or expires."
    )
    differences = serializers.ListField(
        child=serializers.CharField(),
        help_text="What changes then, in words; empty when nothing does (one entry closes as "
        "another that sets the same opens).",
    )


class PolicySerializer(serializers.Serializer):
    capacity_set = serializers.IntegerField()
    capacity_set_name = serializers.CharField()
    at = serializers.DateTimeField()
    pools = PolicyPoolSerializer(many=True, help_text="In the order of their ranks in force.")
    deployments = PolicyDeploymentSerializer(many=True)
    active_entries = serializers.ListField(
        child=serializers.CharField(), help_text="Names of the entries open at `at`."
    )
    active_overrides = PolicyOverrideActiveSerializer(many=True)
    boundaries = PolicyBoundarySerializer(
        many=True, help_text="Every boundary in the 24 hours after `at`, in order."
    )


class PolicyQuerySerializer(InputSerializer):
    at = serializers.DateTimeField(
        required=False,
        help_text="ISO 8601, e.g. 2026-12-02T13:00:00Z (without an offset: UTC). Default: now.",
    )

    def validate_at(self, at: datetime) -> datetime:
        # The calendar reads the days around `at` and the 24 hours after it.
        if not FIRST_YEAR <= at.year <= LAST_YEAR:
            raise serializers.ValidationError(f"must be in the years {FIRST_YEAR}-{LAST_YEAR}")
        return at
