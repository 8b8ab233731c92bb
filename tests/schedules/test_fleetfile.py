"""A capacity set's schedule in the fleet file (``schedules:`` of a set's entry).

Entries are applied through the schedule services with the rest of the file, all or nothing;
the dry run says in words what would be created, changed and deleted; entries that would set
one value at once are refused naming both; each problem names its place in the file; export and
apply round-trip; a second apply changes nothing."""

import textwrap
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from gpucap.audit.models import AuditEvent
from gpucap.fleet.models import CapacitySet, Cluster, Node, Pool
from gpucap.schedules.models import PolicyChange, ScheduleEntry

SCHEDULES = """\
    schedules:
      - name: day-shift
        days: mon-fri
        start: "08:00"
        end: "20:00"
        time_zone: America/New_York
        pools: {h100-inference: {floor_gpus: 16}}
      - name: research-nights
        days: every day
        start: "20:00"
        end: "08:00"
        time_zone: America/New_York
        rank_order: [h100-ondemand, h100-inference]
"""

FLEET = """\
version: 1
clusters:
  - name: east
    nodes:
      - hostname: "h100-{:03d}"
        count: 3
        gpu_model: H100-SXM5-80GB
        fabric: nvswitch
        gpus: 8
        capacity_set: h100-east
capacity_sets:
  - name: h100-east
    cluster: east
    gpu_model: H100-SXM5-80GB
    fabric: nvswitch
SCHEDULES
pools:
  - {name: h100-inference, kind: inference, cluster: east, capacity_set: h100-east, rank: 1, floor_gpus: 8}
  - {name: h100-ondemand, kind: on_demand, cluster: east, capacity_set: h100-east, rank: 2}
  - {name: h100-spot, kind: spot, cluster: east, capacity_set: h100-east, rank: 3}
"""  # noqa: E501


def fleet(schedules: str = SCHEDULES) -> str:
    return FLEET.replace("SCHEDULES\n", schedules)


@pytest.fixture
def fleet_file(tmp_path):
    def write(text: str, name: str = "fleet.yaml"):
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


def apply(path, *args) -> str:
    out = StringIO()
    call_command("fleet_apply", str(path), *args, stdout=out)
    return out.getvalue()


def refused(path, *args) -> str:
    """The refusal, with the file named as the operator typed it."""
    with pytest.raises(CommandError) as excinfo:
        apply(path, *args)
    return str(excinfo.value).replace(f"{path.parent}/", "")


def export() -> str:
    out = StringIO()
    call_command("fleet_export", stdout=out)
    return out.getvalue()


def schedule() -> dict:
    """The set's entries as stored: name -> (days, start, end, zone, what each sets)."""
    return {
        entry.name: (
            entry.days,
            entry.start_time.strftime("%H:%M"),
            entry.end_time.strftime("%H:%M"),
            entry.time_zone,
            sorted(
                (
                    c.setting,
                    c.pool.name if c.pool else c.deployment.slug,
                    c.value if c.position is None else c.position,
                )
                for c in entry.changes.select_related("pool", "deployment")
            ),
        )
        for entry in ScheduleEntry.objects.order_by("name")
    }


def state() -> dict:
    """What applying a file can change here, to prove a refused or repeated apply wrote
    nothing."""
    return {
        "schedule": schedule(),
        "changes": PolicyChange.objects.count(),
        "sets": list(CapacitySet.objects.values_list("name", "generation")),
        "pools": list(
            Pool.objects.order_by("name").values_list(
                "name", "rank", "floor_gpus", "scheduled_rank", "scheduled_floor_gpus"
            )
        ),
        "audit": AuditEvent.objects.count(),
    }


@pytest.mark.django_db
def test_a_sets_schedule_in_the_file_is_applied_through_the_schedule_services(fleet_file):
    output = apply(fleet_file(fleet()))

    assert schedule() == {
        "day-shift": (
            [0, 1, 2, 3, 4],
            "08:00",
            "20:00",
            "America/New_York",
            [("floor_gpus", "h100-inference", 16)],
        ),
        "research-nights": (
            [0, 1, 2, 3, 4, 5, 6],
            "20:00",
            "08:00",
            "America/New_York",
            [("rank_order", "h100-inference", 2), ("rank_order", "h100-ondemand", 1)],
        ),
    }
    assert (
        "create schedule entry h100-east/day-shift: Mon-Fri 08:00-20:00 America/New_York: "
        "sets pool h100-inference floor_gpus 16"
    ) in output
    assert (
        "create schedule entry h100-east/research-nights: every day 20:00-08:00 "
        "America/New_York: sets rank order h100-ondemand > h100-inference"
    ) in output
    assert "created 1 cluster, 1 capacity set, 3 nodes, 3 pools and 2 schedule entries" in output
    verbs = AuditEvent.objects.filter(verb__startswith="schedule_entry.")
    assert sorted(verbs.values_list("verb", "object_label")) == [
        ("schedule_entry.create", "h100-east/day-shift"),
        ("schedule_entry.create", "h100-east/research-nights"),
    ]


@pytest.mark.django_db
def test_applying_the_same_file_twice_changes_nothing(fleet_file):
    path = fleet_file(fleet())
    apply(path)
    before = state()

    output = apply(path)

    assert state() == before  # no writes, no audit events, no generation bumps
    assert output.strip() == "nothing to change, unchanged 10"


@pytest.mark.django_db
def test_dry_run_says_which_entries_would_be_created_changed_and_deleted(fleet_file):
    apply(fleet_file(fleet()))
    before = state()
    changed = fleet(
        SCHEDULES.replace('start: "08:00"', 'start: "07:00"')
        .replace("floor_gpus: 16", "floor_gpus: 20")
        .replace("- name: research-nights", "- name: weekend-research")
        .replace("days: every day", "days: [sat, sun]")
    )

    output = apply(fleet_file(changed), "--dry-run")

    lines = output.splitlines()
    assert (
        "would delete schedule entry h100-east/research-nights: every day 20:00-08:00 "
        "America/New_York: sets rank order h100-ondemand > h100-inference"
    ) in lines
    assert (
        "would update schedule entry h100-east/day-shift: window Mon-Fri 08:00-20:00 "
        "America/New_York -> Mon-Fri 07:00-20:00 America/New_York; sets pool h100-inference "
        "floor_gpus 16 -> pool h100-inference floor_gpus 20"
    ) in lines
    assert (
        "would create schedule entry h100-east/weekend-research: Sat, Sun 20:00-08:00 "
        "America/New_York: sets rank order h100-ondemand > h100-inference"
    ) in lines
    assert lines[-1] == (
        "dry run, nothing written: would create 1 schedule entry, would update 1 schedule "
        "entry, would delete 1 schedule entry, unchanged 8"
    )
    assert state() == before

    apply(fleet_file(changed))

    assert set(schedule()) == {"day-shift", "weekend-research"}
    assert schedule()["day-shift"][1] == "07:00"


@pytest.mark.django_db
def test_entries_setting_one_floor_at_once_are_refused_naming_both_and_nothing_applied(
    fleet_file,
):
    clashing = SCHEDULES + textwrap.indent(
        textwrap.dedent("""\
            - name: evening-peak
              days: mon-fri
              start: "18:00"
              end: "22:00"
              time_zone: America/New_York
              pools: {h100-inference: {floor_gpus: 20}}
        """),
        "      ",
    )

    message = refused(fleet_file(fleet(clashing)))

    assert message.startswith(
        "fleet.yaml: capacity_sets[0].schedules[2] (evening-peak): conflicts with "
        'capacity_sets[0].schedules[0] (day-shift): entries "day-shift" and "evening-peak" '
        "both set pool h100-inference's floor_gpus while both are open (first at "
    )
    assert message.endswith(
        '18:00 America/New_York): "day-shift" sets it to 16, "evening-peak" to 20'
    )
    assert CapacitySet.objects.count() == 0  # the whole file refused, the set too
    assert ScheduleEntry.objects.count() == 0


@pytest.mark.django_db
def test_a_refused_schedule_change_keeps_the_entries_there(fleet_file):
    apply(fleet_file(fleet()))
    before = state()
    clashing = SCHEDULES.replace('end: "20:00"', 'end: "21:00"').replace(
        "rank_order: [h100-ondemand, h100-inference]",
        "pools: {h100-inference: {floor_gpus: 4}}",
    )

    message = refused(fleet_file(fleet(clashing)))

    assert "capacity_sets[0].schedules[1] (research-nights): conflicts with " in message
    assert state() == before


@pytest.mark.django_db
def test_bad_fields_are_named_with_their_place_in_the_file(fleet_file):
    bad = """\
    schedules:
      - name: day-shift
        days: mon-fri
        start: "08:00"
        end: 20:00
        time_zone: Mars/Olympus_Mons
        pools: {h100-inference: {floor_gpus: 16}}
      - name: Night Shift
        days: [mon, funday]
        start: "25:00"
        ends: "08:00"
        time_zone: UTC
      - name: day-shift
        days: sat
        start: "08:00"
        end: "20:00"
        time_zone: UTC
        pools: {h100-inference: {floor_gpus: 8}}
"""

    message = refused(fleet_file(fleet(bad)))

    assert message.splitlines() == [
        "fleet.yaml: 8 problems, nothing applied:",
        "fleet.yaml: capacity_sets[0].schedules[0] (day-shift): end: must be a time of day as "
        'HH:MM (24-hour, e.g. "08:00"), got 1200; in YAML, quote the time ("20:00")',
        "fleet.yaml: capacity_sets[0].schedules[0] (day-shift): time_zone: 'Mars/Olympus_Mons' "
        "is not an IANA time zone (e.g. America/New_York, Europe/Berlin, UTC)",
        "fleet.yaml: capacity_sets[0].schedules[1] (Night Shift): ends: unknown key; did you "
        "mean end?",
        "fleet.yaml: capacity_sets[0].schedules[1] (Night Shift): name: must be 1-64 lowercase "
        "letters, digits and hyphens, not starting or ending with one",
        "fleet.yaml: capacity_sets[0].schedules[1] (Night Shift): days: 'funday' is not a day: "
        "must name the days the window starts on: a list such as [mon, tue] or [0, 1] (0 is "
        'Monday), or text such as "mon-fri" or "every day"',
        "fleet.yaml: capacity_sets[0].schedules[1] (Night Shift): start: must be a time of day "
        "as HH:MM (24-hour, e.g. \"08:00\"), got '25:00'",
        "fleet.yaml: capacity_sets[0].schedules[1] (Night Shift): end: is required",
        "fleet.yaml: capacity_sets[0].schedules[2] (day-shift): name: day-shift is declared "
        "twice (first at capacity_sets[0].schedules[0] (day-shift))",
    ]
    assert CapacitySet.objects.count() == 0


@pytest.mark.django_db
def test_what_an_entry_sets_is_checked_against_the_sets_pools(fleet_file):
    bad = """\
    schedules:
      - name: day-shift
        days: mon-fri
        start: "08:00"
        end: "20:00"
        time_zone: America/New_York
        pools: {h100-inferense: {floor_gpus: 16}, h100-spot: {floor_gpus: 30}}
        rank_order: [h100-ondemand, l40s-spot]
"""

    message = refused(fleet_file(fleet(bad)))

    assert message.splitlines()[1:] == [
        "fleet.yaml: capacity_sets[0].schedules[0] (day-shift): pools.h100-inferense: is not a "
        "pool of this capacity set",
        "fleet.yaml: capacity_sets[0].schedules[0] (day-shift): pools.h100-spot.floor_gpus: "
        "must be a whole number from 0 to 24, got 30",
        "fleet.yaml: capacity_sets[0].schedules[0] (day-shift): rank_order: l40s-spot: not "
        "pools of this capacity set",
    ]


@pytest.mark.django_db
def test_an_entrys_floors_must_fit_the_set_with_the_other_pools_floors(fleet_file):
    too_much = SCHEDULES.replace("floor_gpus: 16", "floor_gpus: 20")
    text = fleet(too_much).replace("rank: 2}", "rank: 2, floor_gpus: 8}")

    message = refused(fleet_file(text))

    assert message == (
        "fleet.yaml: capacity_sets[0].schedules[0] (day-shift): pools: floors would add up to "
        "28 GPUs while this is in force; the set has 24"
    )


@pytest.mark.django_db
def test_a_set_that_leaves_out_schedules_keeps_its_entries_and_an_empty_list_removes_them(
    fleet_file,
):
    apply(fleet_file(fleet()))
    before = state()

    output = apply(fleet_file(fleet("")))

    assert state() == before
    assert (
        "not in file (left as is): 2 schedule entries: h100-east/day-shift, "
        "h100-east/research-nights"
    ) in output

    output = apply(fleet_file(fleet("    schedules: []\n")))

    assert ScheduleEntry.objects.count() == 0
    assert "deleted 2 schedule entries" in output.splitlines()[-1]
    assert sorted(
        AuditEvent.objects.filter(verb="schedule_entry.delete").values_list(
            "object_label", flat=True
        )
    ) == ["h100-east/day-shift", "h100-east/research-nights"]


@pytest.mark.django_db
def test_export_round_trips_the_schedule_through_an_empty_database(fleet_file):
    apply(fleet_file(fleet()))
    first = export()
    assert (
        textwrap.indent(
            textwrap.dedent("""\
                schedules:
                  - name: day-shift
                    days: mon-fri
                    start: "08:00"
                    end: "20:00"
                    time_zone: America/New_York
                    pools:
                      h100-inference: {floor_gpus: 16}
                  - name: research-nights
                    days: every day
                    start: "20:00"
                    end: "08:00"
                    time_zone: America/New_York
                    rank_order: [h100-ondemand, h100-inference]
            """),
            "    ",
        )
        in first
    )
    stored = schedule()
    Pool.objects.all().delete()
    Node.objects.all().delete()
    CapacitySet.objects.all().delete()
    Cluster.objects.all().delete()
    AuditEvent.objects.all().delete()

    apply(fleet_file(first, name="exported.yaml"))

    assert schedule() == stored
    assert export() == first
    events = AuditEvent.objects.count()
    assert apply(fleet_file(first, name="exported.yaml")).strip().startswith("nothing to change")
    assert AuditEvent.objects.count() == events


@pytest.mark.django_db
def test_an_entry_may_set_the_replicas_of_a_deployment_already_in_the_database(
    fleet_file, fleet_east, tenant
):
    from gpucap.fleet import services as fleet_services
    from gpucap.inference import services as inference

    pool = fleet_east["pools"]["h100-inference"]
    fleet_services.pool_set_tenants(pool=pool, tenants=[tenant])
    chat = inference.deployment_create(
        tenant=tenant, pool=pool, name="chat", model_name="gpucap/sim-8b", gpus_per_replica=1
    )
    text = f"""\
    capacity_sets:
      - name: h100-east
        cluster: east
        gpu_model: H100-SXM5-80GB
        fabric: nvswitch
        schedules:
          - name: day-shift
            days: mon-fri
            start: "08:00"
            end: "20:00"
            time_zone: America/New_York
            deployments: {{{chat.slug}: {{min_replicas: 2, max_replicas: 3}}}}
          - name: typo
            days: sat
            start: "08:00"
            end: "20:00"
            time_zone: UTC
            deployments: {{{chat.slug}x: {{min_replicas: 2}}}}
    """

    assert refused(fleet_file(text)) == (
        f"fleet.yaml: capacity_sets[0].schedules[1] (typo): deployments.{chat.slug}x: is not "
        "an inference deployment of this capacity set"
    )

    apply(fleet_file(text.split("      - name: typo")[0]))

    assert schedule()["day-shift"][4] == [
        ("max_replicas", chat.slug, 3),
        ("min_replicas", chat.slug, 2),
    ]
    assert f"deployments:\n          {chat.slug}: {{min_replicas: 2, max_replicas: 3}}" in export()


@pytest.mark.django_db
def test_two_entries_that_swap_windows_are_applied_though_each_meets_the_other_midway(
    fleet_file,
):
    two = """\
    schedules:
      - name: day-shift
        days: mon-fri
        start: "08:00"
        end: "20:00"
        time_zone: America/New_York
        pools: {h100-inference: {floor_gpus: 16}}
      - name: evening
        days: mon-fri
        start: "20:00"
        end: "23:00"
        time_zone: America/New_York
        pools: {h100-inference: {floor_gpus: 12}}
"""
    apply(fleet_file(fleet(two)))
    swapped = (
        two.replace('"08:00"', "START")
        .replace('start: "20:00"', 'start: "08:00"')
        .replace("START", '"20:00"')
        .replace('end: "20:00"', "END")
        .replace('end: "23:00"', 'end: "20:00"')
        .replace("END", 'end: "23:00"')
    )

    output = apply(fleet_file(fleet(swapped)))

    assert "updated 2 schedule entries" in output.splitlines()[-1]
    assert {name: entry[1:3] for name, entry in schedule().items()} == {
        "day-shift": ("20:00", "23:00"),
        "evening": ("08:00", "20:00"),
    }
    assert apply(fleet_file(fleet(swapped))).strip() == "nothing to change, unchanged 10"


@pytest.mark.django_db
def test_schedules_must_be_a_list_and_given_no_value_reads_as_left_out(fleet_file):
    assert refused(fleet_file(fleet("    schedules: {day-shift: mon-fri}\n"))) == (
        "fleet.yaml: capacity_sets[0] (h100-east): schedules: must be a list of schedule "
        "entries (lines starting with -), got a mapping"
    )
    apply(fleet_file(fleet()))

    output = apply(fleet_file(fleet("    schedules:\n")))

    assert ScheduleEntry.objects.count() == 2
    assert "not in file (left as is): 2 schedule entries" in output


@pytest.mark.django_db
def test_a_dry_run_of_a_new_set_with_a_schedule_checks_it_against_the_pools_the_file_creates(
    fleet_file,
):
    output = apply(fleet_file(fleet()), "--dry-run")

    assert "would create schedule entry h100-east/day-shift: Mon-Fri 08:00-20:00" in output
    assert output.splitlines()[-1] == (
        "dry run, nothing written: would create 1 cluster, 1 capacity set, 3 nodes, 3 pools and "
        "2 schedule entries, unchanged 0"
    )
    assert CapacitySet.objects.count() == ScheduleEntry.objects.count() == 0
