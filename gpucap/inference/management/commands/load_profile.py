"""``manage.py load_profile SET --days N [--fold day|replay]``: print a load profile of the set
recorded from what really happened (gpucap/inference/load_profile.py) as JSON, the form
``manage.py simulate SET PROFILE`` reads::

    manage.py load_profile h100-east --days 7 > p.json && manage.py simulate h100-east p.json

Exit 2 with one line when the set is unknown or ``--days`` is out of range."""

import json

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from gpucap.fleet.models import CapacitySet
from gpucap.inference.load_profile import FOLDS, recorded_profile


class Command(BaseCommand):
    help = (
        "Print a load profile of a capacity set recorded from the router's counters and the "
        "rentals of the last N days (JSON, for manage.py simulate)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("set", help="The capacity set's name.")
        parser.add_argument(
            "--days", type=int, default=7, help="Days before now to record from (default 7)."
        )
        parser.add_argument(
            "--fold",
            choices=FOLDS,
            default="day",
            help="day: one day by time of day, starting now (default); replay: the days as "
            "they were.",
        )

    def handle(self, *args, **options) -> None:
        capacity_set = CapacitySet.objects.filter(name=options["set"]).first()
        if capacity_set is None:
            raise CommandError(f"set: no capacity set is named {options['set']!r}", returncode=2)
        if not 1 <= options["days"] <= settings.LOAD_HISTORY_DAYS:
            raise CommandError(
                f"--days must be 1 to {settings.LOAD_HISTORY_DAYS} (LOAD_HISTORY_DAYS)",
                returncode=2,
            )
        profile = recorded_profile(
            capacity_set, days=options["days"], now=timezone.now(), fold=options["fold"]
        )
        self.stdout.write(json.dumps(profile, indent=1))
