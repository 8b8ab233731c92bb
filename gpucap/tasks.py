from celery import shared_task
from django.core.management import call_command


@shared_task(name="gpucap.sessions_clear")
def sessions_clear() -> None:
    """Housekeeping: drop expired login sessions (idempotent)."""
    call_command("clearsessions")
