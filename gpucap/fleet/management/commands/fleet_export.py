"""``manage.py fleet_export [-o FILE]``: write the fleet in the fleet-file format."""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from gpucap.fleet.fleetfile import fleet_file_export


class Command(BaseCommand):
    help = (
        "Write tenants, operators, clusters, nodes, capacity sets and pools as a fleet file "
        "(docs/fleet-file.md), to standard output or to a file. Passwords are never written."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("-o", "--output", metavar="FILE", help="write to FILE, not stdout")

    def handle(self, *args, output: str | None, **options) -> None:
        text = fleet_file_export()
        if output is None:
            self.stdout.write(text, ending="")
            return
        try:
            Path(output).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"{output}: cannot write the file: {exc.strerror}") from None
        self.stdout.write(f"wrote {output}")
