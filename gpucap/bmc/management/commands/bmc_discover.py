"""``manage.py bmc_discover FILE [--dry-run]``: register or update the nodes the BMCs describe."""

from django.core.management.base import BaseCommand, CommandError

from gpucap.bmc.discovery import DiscoveryError, discovery_run
from gpucap.bmc.discovery_file import discovery_file_load


class Command(BaseCommand):
    help = (
        "Read each BMC the file lists over Redfish and make the fleet say what they say: new "
        "nodes with their GPUs, GPU health, swapped cards, credentials (docs/bmc.md). All or "
        "nothing; running it twice changes nothing the second time."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("file", help="the discovery list (YAML)")
        parser.add_argument(
            "--dry-run", action="store_true", help="read the BMCs and list what would change"
        )

    def handle(self, *args, file: str, dry_run: bool, **options) -> None:
        try:
            result = discovery_run(entries=discovery_file_load(file), dry_run=dry_run)
        except DiscoveryError as error:
            if len(error.problems) == 1:
                raise CommandError(error.problems[0]) from None
            lines = [f"{file}: {len(error.problems)} problems, nothing applied:", *error.problems]
            raise CommandError("\n".join(lines)) from None
        for line in result.lines():
            self.stdout.write(line)
        self.stdout.write(result.summary())
