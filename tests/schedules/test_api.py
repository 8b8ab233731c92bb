"""The API of scheduled policies (#18): a set's schedule entries and overrides written and read
through the services, refused whole and by field when wrong, for operators only; the policy in
force at chosen instants; and an override that expires by itself under a real Celery worker."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gpucap.audit.models import AuditEvent
from gpucap.fleet.models import CapacitySet, Pool
from gpucap.inference import services as inference
from gpucap.schedules import services
from gpucap.schedules.models import PolicyChange, PolicyOverride, ScheduleEntry
from tests.rentals import conftest as rentals_fixtures
from tests.rentals.conftest import wait_for

celery_queue = rentals_fixtures.celery_queue
workers = rentals_fixtures.workers

# Wednesday 2 December 2026, 12:00 UTC = 07:00 in New York.
NOON = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
DAY_SHIFT = {
    "name": "day-shift",
    "days": "mon-fri",
    "start": "08:00",
    "end": "20:00",
    "time_zone": "America/New_York",
    "pools": {"h100-inference": {"floor_gpus": 8}},
    "rank_order": ["h100-spot", "h100-ondemand"],
}
PEAK = {"name": "peak", "pools": {"h100-inference": {"floor_gpus": 12}}, "ttl_seconds": 3600}


@pytest.fixture
def h100(fleet_east) -> CapacitySet:
    return fleet_east["sets"]["h100-east"]


def schedule_url(capacity_set, name: str = "") -> str:
    return f"/api/capacity-sets/{capacity_set.pk}/schedule/" + (f"{name}/" if name else "")


def overrides_url(capacity_set, name: str = "") -> str:
    return f"/api/capacity-sets/{capacity_set.pk}/overrides/" + (f"{name}/" if name else "")


def policy_url(capacity_set, at: str = "") -> str:
    return f"/api/capacity-sets/{capacity_set.pk}/policy/" + (f"?at={at}" if at else "")


def generation(capacity_set) -> int:
    return CapacitySet.objects.get(pk=capacity_set.pk).generation


def state() -> tuple:
    """Everything a refused write must leave as it was."""
    return (
        list(ScheduleEntry.objects.values_list("name", "days", "start_time", "end_time")),
        list(PolicyOverride.objects.values_list("name", "expires_at")),
        list(PolicyChange.objects.values_list("setting", "pool", "deployment", "value")),
        list(Pool.objects.values_list("name", "scheduled_rank", "scheduled_floor_gpus")),
        list(CapacitySet.objects.values_list("name", "generation")),
        AuditEvent.objects.count(),
    )


def fields_of(response) -> dict:
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid" and error["message"]
    return error["fields"]


# --- entries ----------------------------------------------------------------------------------


def test_an_operator_creates_lists_replaces_and_deletes_an_entry(h100, operator_api):
    created = operator_api.post(schedule_url(h100), DAY_SHIFT, format="json")

    assert created.status_code == 201, created.content
    body = created.json()
    assert {k: body[k] for k in ("name", "days", "start", "end", "time_zone")} == {
        "name": "day-shift",
        "days": ["mon", "tue", "wed", "thu", "fri"],
        "start": "08:00",
        "end": "20:00",
        "time_zone": "America/New_York",
    }
    assert body["pools"] == {"h100-inference": {"floor_gpus": 8}}
    assert body["rank_order"] == ["h100-spot", "h100-ondemand"]
    assert body["deployments"] == {}
    assert body["window"] == "Mon-Fri 08:00-20:00 America/New_York"
    assert isinstance(body["active_now"], bool)
    assert operator_api.get(schedule_url(h100)).json() == [body]
    assert operator_api.get(schedule_url(h100, "day-shift")).json() == body

    night = {**DAY_SHIFT, "days": ["sat", "sun"], "start": "22:00", "end": "06:00"}
    del night["rank_order"]
    replaced = operator_api.post(schedule_url(h100), night, format="json")

    assert replaced.status_code == 200, replaced.content
    assert replaced.json()["id"] == body["id"]
    assert replaced.json()["window"] == "Sat, Sun 22:00-06:00 America/New_York"
    assert replaced.json()["rank_order"] is None
    assert ScheduleEntry.objects.get().days == [5, 6]

    put = {k: v for k, v in DAY_SHIFT.items() if k != "name"}
    assert operator_api.put(schedule_url(h100, "day-shift"), put, format="json").status_code == 200
    assert operator_api.get(schedule_url(h100, "day-shift")).json()["days"][0] == "mon"
    made = operator_api.put(
        schedule_url(h100, "weekend"),
        {**put, "days": "sat", "pools": {"h100-ondemand": {"floor_gpus": 2}}, "rank_order": None},
        format="json",
    )
    assert made.status_code == 201, made.content
    assert [e["name"] for e in operator_api.get(schedule_url(h100)).json()] == [
        "day-shift",
        "weekend",
    ]

    deleted = operator_api.delete(schedule_url(h100, "day-shift"))

    assert deleted.status_code == 204
    gone = operator_api.get(schedule_url(h100, "day-shift"))
    assert gone.status_code == 404
    assert gone.json()["error"]["code"] == "not_found"
    assert "day-shift" in gone.json()["error"]["message"]
    verbs = list(AuditEvent.objects.filter(verb__startswith="schedule_entry.").values_list("verb"))
    assert [v for (v,) in verbs].count("schedule_entry.create") == 2
    assert {v for (v,) in verbs} == {
        "schedule_entry.create",
        "schedule_entry.update",
        "schedule_entry.delete",
    }


def test_an_entry_setting_a_floor_another_sets_at_once_is_refused_naming_both(h100, operator_api):
    assert operator_api.post(schedule_url(h100), DAY_SHIFT, format="json").status_code == 201
    before = state()
    lunch = {
        "name": "lunch",
        "days": ["wed"],
        "start": "11:00",
        "end": "13:00",
        "time_zone": "Europe/London",
        "pools": {"h100-inference": {"floor_gpus": 16}},
    }

    fields = fields_of(operator_api.post(schedule_url(h100), lunch, format="json"))

    reasons = " ".join(fields["non_field_errors"])
    assert '"day-shift"' in reasons and '"lunch"' in reasons and "h100-inference" in reasons
    assert state() == before


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "Night Shift"}, "name"),
        ({"name": 7}, "name"),
        ({"days": ["someday"]}, "days"),
        ({"days": 5}, "days"),
        ({"days": []}, "days"),
        ({"start": "25:00"}, "start"),
        ({"end": 2000}, "end"),
        ({"time_zone": "Mars/Olympus"}, "time_zone"),
        ({"pools": {"nope": {"floor_gpus": 1}}}, "pools.nope"),
        ({"pools": {"h100-spot": {"floor_gpus": -1}}}, "pools.h100-spot.floor_gpus"),
        ({"pools": {"h100-spot": {"floor_gpus": "8"}}}, "pools.h100-spot.floor_gpus"),
        ({"pools": {"h100-spot": {"floor_gpus": 999}}}, "pools.h100-spot.floor_gpus"),
        ({"pools": {"h100-spot": {"rank": 1}}}, "pools.h100-spot.rank"),
        ({"pools": {"h100-spot": {"floor_gpus": 14}}}, "pools"),  # floors over the set's 16
        ({"rank_order": ["h100-spot"]}, "rank_order"),
        ({"rank_order": ["h100-spot", "h100-spot"]}, "rank_order"),
        ({"rank_order": ["h100-spot", "stranger"]}, "rank_order"),
        ({"deployments": {"ghost": {"min_replicas": 1}}}, "deployments.ghost"),
        ({"color": "blue"}, "color"),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_changes_nothing(
    h100, operator_api, change, field
):
    before = state()

    fields = fields_of(
        operator_api.post(schedule_url(h100), {**DAY_SHIFT, **change}, format="json")
    )

    assert field in fields, fields
    assert state() == before


def test_an_entry_that_sets_nothing_or_lacks_its_window_is_refused(h100, operator_api):
    bare = {k: v for k, v in DAY_SHIFT.items() if k not in ("pools", "rank_order")}
    assert "non_field_errors" in fields_of(
        operator_api.post(schedule_url(h100), bare, format="json")
    )
    windowless = {k: v for k, v in DAY_SHIFT.items() if k not in ("start", "time_zone")}
    assert {"start", "time_zone"} <= set(
        fields_of(operator_api.post(schedule_url(h100), windowless, format="json"))
    )
    renamed = operator_api.put(schedule_url(h100, "day-shift"), DAY_SHIFT, format="json")
    assert "name" in fields_of(renamed)  # the name is the path's
    assert not ScheduleEntry.objects.exists()


def test_a_deployment_s_replica_range_is_scheduled(h100, operator_api, tenant, member):
    pool = Pool.objects.get(name="h100-inference")
    pool.tenants.add(tenant)
    chat = inference.deployment_create(
        tenant=tenant,
        pool=pool,
        name="chat",
        model_name="gpucap/sim-8b",
        gpus_per_replica=1,
        min_replicas=0,
        max_replicas=2,
        actor=member,
    )
    data = {
        **DAY_SHIFT,
        "pools": {},
        "rank_order": None,
        "deployments": {chat.slug: {"min_replicas": 2, "max_replicas": 4}},
    }
    created = operator_api.post(schedule_url(h100), data, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["deployments"] == {chat.slug: {"min_replicas": 2, "max_replicas": 4}}

    upside_down = {**data, "deployments": {chat.slug: {"min_replicas": 5, "max_replicas": 4}}}
    field = f"deployments.{chat.slug}.min_replicas"
    assert field in fields_of(operator_api.post(schedule_url(h100), upside_down, format="json"))

    at = operator_api.get(policy_url(h100, "2026-12-02T14:00:00Z")).json()
    (row,) = at["deployments"]
    assert (row["min_replicas"], row["max_replicas"]) == (0, 2)
    assert (row["min_replicas_in_force"], row["max_replicas_in_force"]) == (2, 4)
    assert row["min_replicas_source"] == 'entry "day-shift"'


def test_listing_entries_takes_the_same_queries_however_many_there_are(h100, operator_api):
    operator_api.post(overrides_url(h100), PEAK, format="json")
    operator_api.post(schedule_url(h100), DAY_SHIFT, format="json")
    with CaptureQueriesContext(connection) as one:
        assert operator_api.get(schedule_url(h100)).status_code == 200
    for n, day in enumerate(("sat", "sun"), start=1):
        entry = {**DAY_SHIFT, "name": f"weekend-{n}", "days": day, "rank_order": None}
        entry["pools"] = {"h100-ondemand": {"floor_gpus": n}}
        assert operator_api.post(schedule_url(h100), entry, format="json").status_code == 201

    with CaptureQueriesContext(connection) as three:
        assert len(operator_api.get(schedule_url(h100)).json()) == 3
    with CaptureQueriesContext(connection) as overrides:
        assert len(operator_api.get(overrides_url(h100)).json()) == 1

    assert len(three) == len(one) == len(overrides)
    assert len(one) <= 8, [q["sql"] for q in one.captured_queries]


# --- overrides --------------------------------------------------------------------------------


def test_an_override_is_set_listed_in_force_and_cleared(h100, operator_api, operator):
    before = generation(h100)

    set_ = operator_api.post(overrides_url(h100), {**PEAK, "reason": "launch day"}, format="json")

    assert set_.status_code == 201, set_.content
    body = set_.json()
    assert body["pools"] == {"h100-inference": {"floor_gpus": 12}}
    assert (body["set_by"], body["reason"], body["active_now"]) == ("olivia", "launch day", True)
    assert body["starts_at"] is None
    expires = datetime.fromisoformat(body["expires_at"])
    created = datetime.fromisoformat(body["created_at"])
    assert timedelta(minutes=59) < expires - created <= timedelta(hours=1)
    assert operator_api.get(overrides_url(h100)).json() == [body]
    assert operator_api.get(overrides_url(h100, "peak")).json() == body
    assert Pool.objects.get(name="h100-inference").floor_in_force == 12
    assert generation(h100) == before + 1
    policy = operator_api.get(policy_url(h100)).json()
    inference_pool = next(p for p in policy["pools"] if p["name"] == "h100-inference")
    assert inference_pool["floor_in_force"] == 12
    assert inference_pool["floor_source"] == 'override "peak" (set by olivia)'
    assert [o["name"] for o in policy["active_overrides"]] == ["peak"]

    cleared = operator_api.delete(overrides_url(h100, "peak"))

    assert cleared.status_code == 204
    assert operator_api.get(overrides_url(h100)).json() == []
    assert operator_api.get(overrides_url(h100, "peak")).status_code == 404
    assert operator_api.delete(overrides_url(h100, "peak")).status_code == 404
    assert Pool.objects.get(name="h100-inference").floor_in_force == 4
    assert AuditEvent.objects.filter(verb="policy_override.set", actor=operator).exists()
    assert AuditEvent.objects.filter(verb="policy_override.clear", actor=operator).exists()


def test_an_override_that_starts_later_is_listed_but_not_yet_in_force(h100, operator_api):
    starts = datetime.now(UTC) + timedelta(hours=2)
    data = {
        "name": "evening",
        "rank_order": ["h100-spot", "h100-inference"],
        "starts_at": starts.isoformat(),
        "expires_at": (starts + timedelta(hours=3)).isoformat(),
    }

    set_ = operator_api.post(overrides_url(h100), data, format="json")

    assert set_.status_code == 201, set_.content
    assert set_.json()["active_now"] is False
    assert set_.json()["rank_order"] == ["h100-spot", "h100-inference"]
    assert Pool.objects.get(name="h100-spot").rank_in_force == 3
    later = (starts + timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    pools = {p["name"]: p for p in operator_api.get(policy_url(h100, later)).json()["pools"]}
    assert (pools["h100-spot"]["rank_in_force"], pools["h100-inference"]["rank_in_force"]) == (1, 3)
    assert pools["h100-spot"]["rank_source"] == 'override "evening" (set by olivia)'
    assert pools["h100-ondemand"]["rank_source"] is None


def test_a_second_override_of_the_same_floor_is_refused_naming_the_first(h100, operator_api):
    assert operator_api.post(overrides_url(h100), PEAK, format="json").status_code == 201
    before = state()

    fields = fields_of(
        operator_api.post(overrides_url(h100), {**PEAK, "name": "surge"}, format="json")
    )

    assert '"peak"' in fields["non_field_errors"][0]
    assert state() == before
    replaced = operator_api.post(
        overrides_url(h100), {**PEAK, "pools": {"h100-inference": {"floor_gpus": 6}}}, format="json"
    )
    assert replaced.status_code == 200, replaced.content
    assert Pool.objects.get(name="h100-inference").floor_in_force == 6


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"ttl_seconds": 0}, "ttl_seconds"),
        ({"ttl_seconds": "60"}, "ttl_seconds"),
        ({"ttl_seconds": 32 * 24 * 3600}, "ttl_seconds"),
        ({"expires_at": "tomorrow"}, "expires_at"),
        ({"expires_at": "2026-12-31T20:00:00Z"}, "ttl_seconds"),  # both
        ({"ttl_seconds": None}, "ttl_seconds"),
        ({"starts_at": "2026-12-02T10:00:00"}, "starts_at"),  # no time zone
        ({"reason": "x" * 201}, "reason"),
        ({"days": "mon-fri"}, "days"),
        ({"name": "PEAK!"}, "name"),
        ({"pools": {"h100-inference": {"floor_gpus": 17}}}, "pools.h100-inference.floor_gpus"),
    ],
)
def test_bad_override_input_is_refused_naming_the_field_and_changes_nothing(
    h100, operator_api, change, field
):
    before = state()

    fields = fields_of(operator_api.post(overrides_url(h100), {**PEAK, **change}, format="json"))

    assert field in fields, fields
    assert state() == before


def test_an_override_must_expire(h100, operator_api):
    data = {k: v for k, v in PEAK.items() if k != "ttl_seconds"}
    assert "expires_at" in fields_of(operator_api.post(overrides_url(h100), data, format="json"))
    past = {**data, "expires_at": "2020-01-01T00:00:00Z"}
    assert "expires_at" in fields_of(operator_api.post(overrides_url(h100), past, format="json"))
    assert not PolicyOverride.objects.exists()


# --- the policy at chosen instants ------------------------------------------------------------


@pytest.fixture
def day_shift(h100, operator):
    return services.schedule_entry_save(capacity_set=h100, data=DAY_SHIFT, actor=operator, now=NOON)


def test_the_policy_before_the_window_opens_names_the_boundaries_of_the_next_24_hours(
    h100, day_shift, operator_api
):
    policy = operator_api.get(policy_url(h100, "2026-12-02T12:00:00Z")).json()

    assert policy["capacity_set_name"] == "h100-east"
    assert policy["at"] == "2026-12-02T12:00:00Z"
    assert policy["active_entries"] == [] and policy["active_overrides"] == []
    pools = [(p["name"], p["rank_in_force"], p["floor_in_force"]) for p in policy["pools"]]
    assert pools == [("h100-inference", 1, 4), ("h100-ondemand", 2, 0), ("h100-spot", 3, 0)]
    assert policy["boundaries"] == [
        {
            "at": "2026-12-02T13:00:00Z",  # 08:00 in New York
            "differences": [
                "pool h100-inference floor 4 → 8 GPUs",
                "rank order h100-inference > h100-ondemand > h100-spot → "
                "h100-inference > h100-spot > h100-ondemand",
            ],
        },
        {
            "at": "2026-12-03T01:00:00Z",  # 20:00 in New York
            "differences": [
                "pool h100-inference floor 8 → 4 GPUs",
                "rank order h100-inference > h100-spot > h100-ondemand → "
                "h100-inference > h100-ondemand > h100-spot",
            ],
        },
    ]


def test_the_policy_while_the_window_is_open_says_where_each_value_comes_from(
    h100, day_shift, operator_api
):
    policy = operator_api.get(policy_url(h100, "2026-12-02T09:30:00-05:00")).json()

    assert policy["at"] == "2026-12-02T14:30:00Z"
    assert policy["active_entries"] == ["day-shift"]
    pools = {p["name"]: p for p in policy["pools"]}
    assert [p["name"] for p in policy["pools"]] == ["h100-inference", "h100-spot", "h100-ondemand"]
    assert (pools["h100-inference"]["floor_gpus"], pools["h100-inference"]["floor_in_force"]) == (
        4,
        8,
    )
    assert pools["h100-inference"]["floor_source"] == 'entry "day-shift"'
    assert pools["h100-inference"]["rank_source"] is None
    assert (pools["h100-spot"]["rank"], pools["h100-spot"]["rank_in_force"]) == (3, 2)
    assert pools["h100-spot"]["rank_source"] == 'entry "day-shift"'
    assert pools["h100-ondemand"]["floor_source"] is None
    assert [b["at"] for b in policy["boundaries"]] == [
        "2026-12-03T01:00:00Z",
        "2026-12-03T13:00:00Z",
    ]


def test_on_a_saturday_the_weekday_window_is_closed(h100, day_shift, operator_api):
    policy = operator_api.get(policy_url(h100, "2026-12-05T15:00:00Z")).json()

    assert policy["active_entries"] == []
    assert {p["name"]: p["floor_in_force"] for p in policy["pools"]}["h100-inference"] == 4
    assert policy["boundaries"] == []  # Monday's opening is more than 24 hours away


@pytest.mark.parametrize("at", ["noon", "2026-13-01T00:00:00Z", "0001-01-01T00:00:00Z"])
def test_a_bad_instant_is_refused_naming_at(h100, operator_api, at):
    assert "at" in fields_of(operator_api.get(policy_url(h100, at)))


# --- who may ----------------------------------------------------------------------------------


def routes(capacity_set) -> list[tuple[str, str, dict]]:
    return [
        ("get", schedule_url(capacity_set), {}),
        ("post", schedule_url(capacity_set), {**DAY_SHIFT, "name": "theirs"}),
        ("get", schedule_url(capacity_set, "day-shift"), {}),
        ("put", schedule_url(capacity_set, "day-shift"), {"days": "sat"}),
        ("delete", schedule_url(capacity_set, "day-shift"), {}),
        ("get", overrides_url(capacity_set), {}),
        ("post", overrides_url(capacity_set), {**PEAK, "name": "theirs"}),
        ("get", overrides_url(capacity_set, "peak"), {}),
        ("delete", overrides_url(capacity_set, "peak"), {}),
        ("get", policy_url(capacity_set), {}),
    ]


@pytest.mark.parametrize(
    ("client", "status"), [("member_api", 403), ("other_member_api", 403), ("anonymous_api", 401)]
)
def test_tenant_members_and_anonymous_callers_are_refused_and_change_nothing(
    h100, day_shift, operator, request, client, status
):
    services.policy_override_set(capacity_set=h100, data=PEAK, actor=operator)
    api = request.getfixturevalue(client)
    before = state()

    for method, url, data in routes(h100):
        response = getattr(api, method)(url, data, format="json")
        assert response.status_code == status, (method, url, response.content)
        assert response.json()["error"]["code"], (method, url)

    assert state() == before


def test_an_unknown_set_entry_or_override_is_a_404_in_the_error_shape(h100, operator_api):
    missing = CapacitySet.objects.order_by("-pk").first().pk + 100
    for url in (
        f"/api/capacity-sets/{missing}/schedule/",
        f"/api/capacity-sets/{missing}/overrides/",
        f"/api/capacity-sets/{missing}/policy/",
        schedule_url(h100, "nope"),
        overrides_url(h100, "nope"),
    ):
        response = operator_api.get(url)
        assert response.status_code == 404, url
        assert response.json()["error"]["code"] == "not_found", url
    for url in (schedule_url(h100, "nope"), overrides_url(h100, "nope")):
        assert operator_api.delete(url).status_code == 404, url
    assert operator_api.get(schedule_url(h100, "no.such")).json()["error"]["code"] == "not_found"


# --- an override expires by itself ------------------------------------------------------------


@pytest.fixture
def worker(workers, fleet_east):
    return workers()


def test_an_override_expires_by_itself_when_the_worker_applies_its_expiry(
    worker, h100, operator_api
):
    """The override's expiry is a boundary: `schedules.apply` is sent for that moment, and the
    worker removes it then; nothing in the test calls the service."""
    data = {"name": "burst", "pools": {"h100-inference": {"floor_gpus": 8}}, "ttl_seconds": 5}

    set_ = operator_api.post(overrides_url(h100), data, format="json")

    assert set_.status_code == 201, set_.content
    bumped = generation(h100)
    # The floor in force while it lasts, asked of the API at the moment it was set.
    while_set = set_.json()["created_at"].replace("+00:00", "Z")
    policy = operator_api.get(policy_url(h100, while_set)).json()
    assert {p["name"]: p["floor_in_force"] for p in policy["pools"]}["h100-inference"] == 8
    assert policy["boundaries"][0]["differences"] == ["pool h100-inference floor 8 → 4 GPUs"]
    applied = AuditEvent.objects.filter(verb="policy.apply").order_by("pk").first()
    assert applied.after["changes"] == ["pool h100-inference floor 4 → 8 GPUs"]

    def expired() -> bool:
        pool = Pool.objects.get(name="h100-inference")
        return not PolicyOverride.objects.exists() and pool.scheduled_floor_gpus is None

    wait_for(expired, timeout=60, what="the worker to expire the override", log=worker.log)

    assert operator_api.get(overrides_url(h100)).json() == []
    policy = operator_api.get(policy_url(h100)).json()
    assert {p["name"]: p["floor_in_force"] for p in policy["pools"]}["h100-inference"] == 4
    assert Pool.objects.get(name="h100-inference").floor_in_force == 4
    expiry = AuditEvent.objects.get(verb="policy_override.expire")
    assert (expiry.object_label, expiry.actor_label) == ("h100-east/burst", "system")
    restored = AuditEvent.objects.filter(verb="policy.apply").order_by("pk").last()
    assert restored.after["changes"] == ["pool h100-inference floor 8 → 4 GPUs"]
    assert generation(h100) > bumped


@pytest.mark.parametrize(
    "change",
    [
        {"starts_at": "9999-12-31T23:59:59Z"},
        {"starts_at": "0001-01-01T00:00:00+01:00"},
        {"expires_at": "0001-01-01T00:30:00+01:00", "ttl_seconds": None},
        {
            "starts_at": "9999-12-31T23:00:00Z",
            "expires_at": "9999-12-31T23:59:59Z",
            "ttl_seconds": None,
        },
    ],
)
def test_an_override_at_the_ends_of_the_calendar_is_refused_not_a_server_error(
    h100, operator_api, change
):
    data = {k: v for k, v in {**PEAK, **change}.items() if v is not None}

    response = operator_api.post(overrides_url(h100), data, format="json")

    assert response.status_code == 400, response.content
    assert not PolicyOverride.objects.exists()


def test_the_schema_documents_lists_the_replace_shape_and_the_instant(anonymous_api, db):
    schema = anonymous_api.get("/api/schema/?format=json").json()
    paths, components = schema["paths"], schema["components"]["schemas"]
    for path in ("/api/capacity-sets/{id}/schedule/", "/api/capacity-sets/{id}/overrides/"):
        answer = paths[path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert answer["type"] == "array", path
        assert set(paths[path]["post"]["responses"]) >= {"200", "201", "400"}, path
    put = paths["/api/capacity-sets/{id}/schedule/{name}/"]["put"]
    shape = put["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    replace = components[shape.rsplit("/", 1)[-1]]
    assert "name" not in replace["properties"]
    assert {"days", "start", "end", "time_zone"} <= set(replace["required"])
    assert replace["additionalProperties"] is False
    at = {p["name"]: p for p in paths["/api/capacity-sets/{id}/policy/"]["get"]["parameters"]}
    assert at["at"]["schema"]["format"] == "date-time"
    assert not at["at"].get("required", False)
