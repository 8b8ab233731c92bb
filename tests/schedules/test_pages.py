"""The Schedule section of the capacity set page: what a rank means, the entries with their
add/replace form and delete, the overrides with who set them and clear, what is in force and
where it comes from, the 24-hour timeline, and the what-if asked about a later time."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from gpucap.audit.models import AuditEvent
from gpucap.plans.models import Plan
from gpucap.schedules import services as schedules
from gpucap.schedules.models import PolicyOverride, ScheduleEntry
from tests.rentals.vm_helpers import world
from tests.schedules.conftest import day_shift

pytestmark = pytest.mark.django_db

HTMX = {"HX-Request": "true"}
SET = "h100-east"
SET_PAGE = reverse("fleet:capacity-set-detail", kwargs={"name": SET})
SAVE = reverse("fleet:schedule-entry-save", kwargs={"name": SET})
TIMELINE = reverse("fleet:schedule-timeline", kwargs={"name": SET})
WHAT_IF = reverse("plans:what-if", kwargs={"name": SET})


def delete_url(entry: str) -> str:
    return reverse("fleet:schedule-entry-delete", kwargs={"name": SET, "entry": entry})


def clear_url(override: str) -> str:
    return reverse("fleet:policy-override-clear", kwargs={"name": SET, "override": override})


def every_day(**changes) -> dict:
    """An entry open all day every day in UTC, so it is open whenever the test runs."""
    return {
        "name": "always",
        "days": "every day",
        "start": "00:00",
        "end": "00:00",
        "time_zone": "UTC",
        **changes,
    }


def form_data(**fields) -> dict:
    data = {
        "name": "night",
        "days": ["5", "6"],
        "start": "22:00",
        "end": "06:00",
        "time_zone": "Europe/Berlin",
        "rank_order": "",
    }
    data.update(fields)
    return data


def test_the_set_page_shows_the_schedule_what_is_in_force_and_where_it_comes_from(
    operator_client, h100, operator
):
    schedules.schedule_entry_save(
        capacity_set=h100,
        data=every_day(pools={"h100-inference": {"floor_gpus": 8}}),
        actor=operator,
    )
    schedules.policy_override_set(
        capacity_set=h100,
        data={
            "name": "peak",
            "rank_order": ["h100-spot", "h100-ondemand"],
            "ttl_seconds": 3600,
            "reason": "launch day",
        },
        actor=operator,
    )

    page = operator_client.get(SET_PAGE).content.decode()

    assert "rank is a priority, not a calendar" in page
    assert "24-hour preview" in page
    section = page.split('id="set-schedule"')[1].split("</section>")[0]
    assert 'id="entry-always"' in section and "every day 00:00-00:00 UTC" in section
    assert "pool h100-inference floor_gpus 8" in section and "badge-open" in section
    row = section.split('id="override-peak"')[1].split("</tr>")[0]
    assert (
        "olivia" in row and "launch day" in row and "rank order h100-spot &gt; h100-ondemand" in row
    )
    assert (
        'pool h100-inference floor 8 GPUs (own 4) <span class="muted">— entry &quot;always&quot;'
        in section
    )
    assert "override &quot;peak&quot; (set by olivia)" in section
    assert f'hx-get="{TIMELINE}"' in section
    pools = page.split("Pools and who may use them")[1].split("</table>")[0]
    assert "scheduled · own 4" in pools  # h100-inference's floor
    assert "scheduled · own 3" in pools  # h100-spot's rank
    assert 'title="Floor: 8 GPUs"' in page  # the arbiter's bars draw the floor in force


def test_the_timeline_shows_each_boundary_what_changes_and_who_would_be_notified(
    operator_client, h100, full_set, chat, operator
):
    now = timezone.now()
    opens = (now + timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)
    entry = {
        "name": "burst",
        "days": "every day",
        "start": f"{opens:%H:%M}",
        "end": f"{opens + timedelta(hours=1):%H:%M}",
        "time_zone": "UTC",
        "deployments": {"acme-chat": {"min_replicas": 2}},
    }
    schedules.schedule_entry_save(capacity_set=h100, data=entry, actor=operator)
    before = world()

    response = operator_client.get(TIMELINE, headers=HTMX)

    body = response.content.decode()
    assert response.status_code == 200 and "<html" not in body
    first = body.split('<li class="boundary">')[1]
    assert f"{opens:%a %H:%M} UTC" in first and "Entry &quot;burst&quot; opens" in first
    assert "Deployment acme-chat replicas 0-4 → 2-4" in first
    assert "Would notify 2 VMs</strong> (8 GPUs)" in first
    assert first.count('class="victim-row"') == 2 and "h100-spot" in first and "acme" in first
    assert "scheduled-acme-chat-1</code> (a replica the minimum asks for)" in first
    second = body.split('<li class="boundary">')[2]
    assert "Entry &quot;burst&quot; closes" in second and "Would notify nobody." in second
    assert world() == before and not Plan.objects.exists()
    page = operator_client.get(TIMELINE).content.decode()  # without JavaScript: a page
    assert "<html" in page and "the next 24 hours" in page


def test_the_timeline_says_so_when_nothing_changes_in_24_hours(operator_client, h100):
    body = operator_client.get(TIMELINE, headers=HTMX).content.decode()
    assert 'id="no-boundaries"' in body


def test_an_entry_saved_from_the_form_is_written_audited_and_the_section_refreshed(
    operator_client, h100, chat
):
    data = form_data(**{"floor__h100-inference": "8", "min__acme-chat": "1", "max__acme-chat": "3"})
    data["rank_order"] = "h100-spot, h100-ondemand"

    response = operator_client.post(SAVE, data, headers=HTMX)

    assert response.status_code == 200
    assert response["HX-Trigger"] == "set-changed"
    body = response.content.decode()
    assert body.lstrip().startswith('<section class="panel set-schedule" id="set-schedule">')
    assert 'id="entry-night"' in body and "Sat, Sun 22:00-06:00 Europe/Berlin" in body
    entry = ScheduleEntry.objects.get(name="night")
    assert (entry.days, f"{entry.start_time:%H:%M}", entry.time_zone) == (
        [5, 6],
        "22:00",
        "Europe/Berlin",
    )
    assert sorted(entry.changes.values_list("setting", flat=True)) == [
        "floor_gpus",
        "max_replicas",
        "min_replicas",
        "rank_order",
        "rank_order",
    ]
    assert AuditEvent.objects.filter(verb="schedule_entry.create").count() == 1
    # Saved again under its name: replaced, not added.
    operator_client.post(SAVE, form_data(**{"floor__h100-inference": "6"}), headers=HTMX)
    assert ScheduleEntry.objects.get(name="night").changes.count() == 1
    # Without JavaScript: back to the set page.
    response = operator_client.post(SAVE, form_data(name="late", **{"floor__h100-spot": "0"}))
    assert response.status_code == 302 and response["Location"] == SET_PAGE


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"days": []}, "days", "must name the days"),
        ({"start": "25:00"}, "start", "HH:MM"),
        ({"time_zone": "Mars/Olympus"}, "time_zone", "not an IANA time zone"),
        ({"name": "Night Shift"}, "name", "lowercase"),
        ({"floor__h100-inference": "99"}, "floor__h100-inference", "from 0 to 16"),
        ({"rank_order": "h100-spot, nope"}, "rank_order", "nope: not pools"),
        ({"floor__h100-inference": "-1"}, "floor__h100-inference", "greater than or equal to 0"),
    ],
)
def test_bad_input_re_renders_the_form_in_place_naming_the_field(
    operator_client, h100, fields, field, words
):
    data = form_data(**{"floor__h100-ondemand": "4"})
    data.update(fields)

    response = operator_client.post(SAVE, data, headers=HTMX)

    assert response.status_code == 400
    body = response.content.decode()
    assert body.lstrip().startswith('<section class="panel set-schedule"')
    error = body.split(f'id="id_{field}-error"')[1].split("</p>")[0]
    assert words in error
    assert '<details class="entry-form-box" id="entry-form" open>' in body  # open, as typed
    assert not ScheduleEntry.objects.exists()
    assert "HX-Trigger" not in response


def test_a_clashing_entry_is_refused_above_the_form_naming_both(operator_client, h100, operator):
    schedules.schedule_entry_save(
        capacity_set=h100,
        data=day_shift(pools={"h100-inference": {"floor_gpus": 8}}),
        actor=operator,
    )
    data = form_data(name="lunch", days=["2"], start="11:00", end="13:00")
    data["time_zone"] = "Europe/London"
    data["floor__h100-inference"] = "12"

    response = operator_client.post(SAVE, data, headers=HTMX)

    assert response.status_code == 400
    alert = response.content.decode().split('class="alert alert-error" role="alert">')[1]
    alert = alert.split("</div>")[0]
    assert "&quot;day-shift&quot;" in alert and "&quot;lunch&quot;" in alert
    assert not ScheduleEntry.objects.filter(name="lunch").exists()


def test_deleting_an_entry_and_clearing_an_override_take_effect_and_are_audited(
    operator_client, h100, operator
):
    schedules.schedule_entry_save(
        capacity_set=h100,
        data=every_day(pools={"h100-inference": {"floor_gpus": 8}}),
        actor=operator,
    )
    schedules.policy_override_set(
        capacity_set=h100,
        data={"name": "peak", "pools": {"h100-spot": {"floor_gpus": 4}}, "ttl_seconds": 600},
        actor=operator,
    )
    page = operator_client.get(SET_PAGE).content.decode()
    assert 'hx-confirm="Delete schedule entry always of h100-east? It is open now' in page
    assert 'hx-confirm="Clear override peak set by olivia?' in page

    deleted = operator_client.post(delete_url("always"), headers=HTMX)
    cleared = operator_client.post(clear_url("peak"), headers=HTMX)

    assert (deleted.status_code, cleared.status_code) == (200, 200)
    assert deleted["HX-Trigger"] == cleared["HX-Trigger"] == "set-changed"
    assert 'id="own-values"' in cleared.content.decode()
    assert not ScheduleEntry.objects.exists() and not PolicyOverride.objects.exists()
    verbs = set(AuditEvent.objects.values_list("verb", flat=True))
    assert {"schedule_entry.delete", "policy_override.clear"} <= verbs
    h100.pools.get(name="h100-inference").refresh_from_db()
    assert h100.pools.get(name="h100-inference").floor_in_force == 4
    assert operator_client.post(delete_url("always"), headers=HTMX).status_code == 404
    assert operator_client.post(clear_url("nope")).status_code == 404


def test_tenant_members_get_none_of_it(member_client, h100, operator):
    schedules.schedule_entry_save(
        capacity_set=h100, data=every_day(pools={"h100-spot": {"floor_gpus": 4}}), actor=operator
    )
    for method, url in (
        ("get", TIMELINE),
        ("post", SAVE),
        ("post", delete_url("always")),
        ("post", clear_url("always")),
    ):
        assert getattr(member_client, method)(url, headers=HTMX).status_code == 403, url
    assert ScheduleEntry.objects.filter(name="always").exists()


# --- the what-if asked about a later time ---------------------------------------------------------


def _spot_outranks_ondemand_from(h100, operator, hours: int):
    """An entry opening in ``hours`` hours (UTC, daily, one hour long) that ranks h100-spot
    above h100-ondemand: from then, on-demand may no longer reclaim spot VMs."""
    opens = (timezone.now() + timedelta(hours=hours)).replace(minute=0, second=0, microsecond=0)
    schedules.schedule_entry_save(
        capacity_set=h100,
        data={
            "name": "spot-first",
            "days": "every day",
            "start": f"{opens:%H:%M}",
            "end": f"{opens + timedelta(hours=1):%H:%M}",
            "time_zone": "UTC",
            "rank_order": ["h100-spot", "h100-ondemand"],
        },
        actor=operator,
    )
    return opens + timedelta(minutes=30)


def test_the_what_if_form_asks_about_a_later_time_with_the_policy_then(
    operator_client, h100, full_set, fleet_east, operator
):
    at = _spot_outranks_ondemand_from(h100, operator, hours=3)
    ask = {"pool": fleet_east["pools"]["h100-ondemand"].pk, "gpus": 8, "block_gpus": 4}

    now = operator_client.get(WHAT_IF, ask, headers=HTMX).content.decode()
    later = operator_client.get(
        WHAT_IF, {**ask, "at": f"{at:%Y-%m-%dT%H:%M}"}, headers=HTMX
    ).content.decode()
    bad = operator_client.get(WHAT_IF, {**ask, "at": "tomorrow-ish"}, headers=HTMX)

    assert "Served." in now
    assert "Not served." in later and f"At <strong>{at:%a %Y-%m-%d %H:%M} UTC</strong>" in later
    assert bad.status_code == 400
    assert "At (UTC): must be a date and time" in bad.content.decode()


def test_the_what_if_api_takes_an_instant_and_names_a_bad_one(
    operator_api, h100, full_set, fleet_east, operator
):
    at = _spot_outranks_ondemand_from(h100, operator, hours=3)
    url = f"/api/capacity-sets/{h100.pk}/what-if/"
    ask = {"pool": fleet_east["pools"]["h100-ondemand"].pk, "gpus": 8, "block_gpus": 4}
    before = world()

    now = operator_api.post(url, ask, format="json").json()
    later = operator_api.post(url, {**ask, "at": at.isoformat()}, format="json").json()
    bad = operator_api.post(url, {**ask, "at": "half past"}, format="json")

    assert (now["served"], now["at"]) == (True, None)
    assert later["served"] is False and later["reclaimed"] == []
    assert later["at"].startswith(f"{at:%Y-%m-%dT%H:%M}")
    assert bad.status_code == 400 and set(bad.json()["error"]["fields"]) == {"at"}
    assert world() == before


def test_without_javascript_a_refused_entry_comes_back_on_a_page_with_its_errors(
    operator_client, h100
):
    response = operator_client.post(SAVE, form_data(start="noon", **{"floor__h100-spot": "2"}))

    assert response.status_code == 400
    page = response.content.decode()
    assert "<html" in page and "Schedule of h100-east" in page
    assert "From: must be a time of day as HH:MM" in page
    assert 'value="night"' in page  # as typed
    assert not ScheduleEntry.objects.exists()


def test_edit_fills_the_form_with_the_entry_and_saving_replaces_it(
    operator_client, h100, chat, operator
):
    schedules.schedule_entry_save(
        capacity_set=h100,
        data=day_shift(
            pools={"h100-inference": {"floor_gpus": 8}},
            rank_order=["h100-spot", "h100-ondemand"],
            deployments={"acme-chat": {"min_replicas": 2}},
        ),
        actor=operator,
    )
    edit = reverse("fleet:schedule-entry-edit", kwargs={"name": SET, "entry": "day-shift"})

    body = operator_client.get(edit, headers=HTMX).content.decode()

    assert "<html" not in body and "Edit entry day-shift" in body
    form = body.split('class="stacked-form entry-form"')[1].split("</form>")[0]
    for shown in (
        'name="name" value="day-shift"',
        'name="start" value="08:00"',
        'name="end" value="20:00"',
        'value="America/New_York"',
        'name="floor__h100-inference" value="8"',
        'name="min__acme-chat" value="2"',
        'value="h100-spot, h100-ondemand"',
    ):
        assert shown in form, shown
    assert form.count("checked") == 5  # Mon-Fri
    assert operator_client.get(edit).status_code == 200  # without JavaScript: a page
    missing = reverse("fleet:schedule-entry-edit", kwargs={"name": SET, "entry": "nope"})
    assert operator_client.get(missing, headers=HTMX).status_code == 404
