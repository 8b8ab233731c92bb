"""``manage.py demo``: load the demo fleet (gpucap/demo/fleet.yaml), put the demo tenants' VMs
on it (gpucap/demo/workload.py) and print the logins."""

from pathlib import Path

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from gpucap.demo.usage_history import demo_usage_history
from gpucap.demo.workload import demo_workload
from gpucap.envvars import env_int
from gpucap.fleet.fleetfile import FleetFile, FleetFileError, fleet_file_apply, fleet_file_load

DEMO_FILE = Path(__file__).resolve().parents[2] / "demo" / "fleet.yaml"


class Command(BaseCommand):
    help = (
        "Load the demo fleet from gpucap/demo/fleet.yaml (safe to run again: it changes only "
        "what differs from the file) and print the URL and the demo logins."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--url", help="where the web server answers (default: http://127.0.0.1:$PORT/, 8000)"
        )
        parser.add_argument(
            "--no-workload",
            action="store_true",
            help="load the fleet only, without the demo tenants' VMs, requests and past usage",
        )

    def handle(self, *args, url: str | None, **options) -> None:
        try:
            url = url or f"http://127.0.0.1:{env_int('PORT', 8000, minimum=1)}/"
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        try:
            demo = fleet_file_load(DEMO_FILE)
            result = fleet_file_apply(demo)
        except FleetFileError as exc:
            raise CommandError("\n".join(["the demo fleet did not load:", *exc.problems])) from None
        if options["verbosity"] > 1:
            for line in result.lines():
                self.stdout.write(line)
        self.stdout.write(f"demo fleet ({DEMO_FILE.name}): {result.summary()}")
        if not options["no_workload"]:
            self.stdout.write(demo_workload())
            self.stdout.write(demo_usage_history())
        self.stdout.write("")
        self.stdout.write(f"Open {url}")
        for line in _logins(demo):
            self.stdout.write(line)


def _logins(demo: FleetFile) -> list[str]:
    """The demo's logins as the file declares them (local demo passwords, printed on purpose)."""
    lines = []
    for operator in demo.operators:
        if operator.password:
            lines.append(f"  operator         {operator.username} / {operator.password}")
    for tenant in demo.tenants:
        for member in tenant.members:
            if member.password:
                who = f"{tenant.slug} {member.role}"
                lines.append(f"  {who:<16} {member.username} / {member.password}")
    return lines
