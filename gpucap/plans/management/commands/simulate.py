"""``manage.py simulate SET PROFILE``: replay a load profile (JSON, gpucap/simulation/profile.py)
against a capacity set as it is now, with its ranks, floors, protection windows and schedule, in
simulated time, and print what it would cause: notices per pool, replicas against load, queue
waits and refusals, and the worst moments with the arbiter's plan then. Nothing live is touched.
Exit 2 with one line per problem when the set or the profile cannot be read.

``--store`` stores the run (as the API's POST /api/capacity-sets/{id}/simulate/ does), carries
it out in this process and prints its id and figures."""

import json
from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from gpucap.fleet.models import CapacitySet
from gpucap.plans.models import SimulationRun
from gpucap.plans.simulation import simulate_set
from gpucap.plans.simulation_runs import simulation_carry_out, simulation_request
from gpucap.simulation import ProfileError, SimulationError, profile_from_json, result_to_dict


class Command(BaseCommand):
    help = (
        "Replay a load profile against a capacity set's priorities and schedule in simulated "
        "time, and print every reclaim, notice and unserved request it would cause."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("set", help="The capacity set's name.")
        parser.add_argument("profile", help="The load profile, a JSON file (- for stdin).")
        parser.add_argument("--hours", type=int, default=24, help="How long (default 24).")
        parser.add_argument("--step", type=int, default=60, help="Seconds a step (default 60).")
        parser.add_argument(
            "--wait-threshold",
            type=float,
            default=1.0,
            help="A request waiting longer than this many seconds counts as late (default 1).",
        )
        parser.add_argument("--json", action="store_true", help="Print the whole result as JSON.")
        parser.add_argument(
            "--store",
            action="store_true",
            help="Store the run (listed with the set's simulations), carry it out here and "
            "print its id.",
        )
        parser.add_argument("--name", default="", help="The stored run's label (with --store).")

    def handle(self, *args, **options) -> None:
        capacity_set = CapacitySet.objects.filter(name=options["set"]).first()
        if capacity_set is None:
            raise CommandError(f"set: no capacity set is named {options['set']!r}", returncode=2)
        if options["hours"] < 1 or options["step"] < 1:
            raise CommandError("--hours and --step must be 1 or more", returncode=2)
        try:
            text = (
                self.stdin.read()
                if options["profile"] == "-"
                else Path(options["profile"]).read_text()
            )
        except OSError as error:
            raise CommandError(f"profile: cannot read: {error}", returncode=2) from None
        if options["store"]:
            self._store(capacity_set, text, options)
            return
        try:
            profile = profile_from_json(text)
            result = simulate_set(
                capacity_set,
                profile,
                step_seconds=options["step"],
                duration_seconds=options["hours"] * 3600,
                wait_threshold_seconds=options["wait_threshold"],
            )
        except ProfileError as error:
            lines = [f"profile: {field}: {reason}" for field, reason in error.problems.items()]
            raise CommandError("\n".join(lines), returncode=2) from None
        except SimulationError as error:
            raise CommandError("\n".join(map(str, error.problems)), returncode=2) from None
        if options["json"]:
            self.stdout.write(json.dumps(result_to_dict(result), indent=1))
            return
        self.stdout.write(
            f"{capacity_set.name}: {len(result.steps)} steps of {result.step_seconds} s from "
            f"{result.start:%Y-%m-%d %H:%M} UTC, {result.plans_made} plans made"
        )
        for figure in result.figures():
            self.stdout.write(f"  {figure.label}: {figure.shown()}")
        for moment in result.worst:
            self.stdout.write(f"worst ({moment.kind}) at {moment.at:%H:%M} UTC: {moment.words}")

    def _store(self, capacity_set: CapacitySet, text: str, options: dict) -> None:
        try:
            run = simulation_request(
                capacity_set,
                profile=text,
                name=options["name"],
                hours=options["hours"],
                step_seconds=options["step"],
                wait_threshold_seconds=options["wait_threshold"],
                send=False,
            )
        except ValidationError as error:
            lines = [
                f"{field}: {message}"
                for field, messages in error.message_dict.items()
                for message in messages
            ]
            raise CommandError("\n".join(lines), returncode=2) from None
        simulation_carry_out(run_id=run.pk)
        run = SimulationRun.objects.get(pk=run.pk)
        if run.state != SimulationRun.State.DONE:
            raise CommandError(f"simulation run {run.pk} {run.state}: {run.error}", returncode=1)
        self.stdout.write(f"simulation run {run.pk} of {capacity_set.name}: {run.state}")
        for figure in run.result["figures"]:
            self.stdout.write(f"  {figure['label']}: {figure['shown']}")
