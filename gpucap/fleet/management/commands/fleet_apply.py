"""``manage.py fleet_apply FILE.yaml``: make the fleet what the file declares."""

from django.core.management.base import BaseCommand, CommandError

from gpucap.fleet.fleetfile import FleetFileError, fleet_file_apply, fleet_file_load


class Command(BaseCommand):
    help = (
        "Create or update the tenants, operators, clusters, nodes, capacity sets and pools a "
        "fleet file declares, and the schedules of its capacity sets (docs/fleet-file.md). All or "
        "nothing; never deletes, except schedule entries missing from a set's listed schedules; "
        "running the same file twice changes nothing."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("file", help="the fleet file (YAML)")
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="check the file against the database and list what would change; write nothing",
        )

    def handle(self, *args, file: str, dry_run: bool, **options) -> None:
        try:
            result = fleet_file_apply(fleet_file_load(file), dry_run=dry_run)
        except FleetFileError as exc:
            raise CommandError(_refusal(file, exc.problems)) from None
        for line in result.lines():
            self.stdout.write(line)
        self.stdout.write(result.summary())


def _refusal(file: str, problems: list[str]) -> str:
    if len(problems) == 1:
        return problems[0]
    return "\n".join([f"{file}: {len(problems)} problems, nothing applied:", *problems])
