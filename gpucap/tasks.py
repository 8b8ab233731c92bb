"""Project-wide task plumbing: how every service sends a Celery task, and the housekeeping task
no app owns."""

from celery import shared_task
from django.core.management import call_command
from django.db import transaction

from gpucap.celery import app


def enqueue_on_commit(task_name: str, *args, **options) -> None:
    """Send the task ``task_name`` once the current transaction commits (at once outside one),
    so a task never runs for a change that rolled back, nor before the change is visible.
    Tasks load what they need by id and are idempotent: a message sent twice is harmless.
    ``options`` go to ``send_task`` (``eta``, ``countdown``)."""
    transaction.on_commit(lambda: app.send_task(task_name, args=list(args), **options))


@shared_task(name="gpucap.sessions_clear")
def sessions_clear() -> None:
    """Housekeeping: drop expired login sessions (idempotent)."""
    call_command("clearsessions")
