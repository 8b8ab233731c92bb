"""``manage.py bmc_rotate_keys``: seal every stored BMC password with the first key."""

from django.core.management.base import BaseCommand, CommandError

from gpucap.bmc.passwords import SealError
from gpucap.bmc.services import bmc_credentials_reseal


class Command(BaseCommand):
    help = (
        "Seal every stored BMC password again with the first key of BMC_CREDENTIAL_KEYS. Run "
        "it after putting a new key first; then the old key can be dropped (docs/bmc.md)."
    )

    def handle(self, *args, **options) -> None:
        try:
            count = bmc_credentials_reseal()
        except SealError as error:
            raise CommandError(str(error)) from None
        self.stdout.write(f"sealed {count} BMC password{'' if count == 1 else 's'} again")
