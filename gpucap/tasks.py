"""Project-wide task plumbing: how every service sends a Celery task and runs anything else
after its transaction commits, and the housekeeping task no app owns.

Post-commit side effects cannot swallow each other: every hook goes through ``on_commit``,
which runs it robustly (a hook that raises is logged and counted in
``gpucap_on_commit_failures_total``, and the hooks after it still run), so a cache publish, a
mail or a broker hiccup never keeps a VM's driver task from being sent, and never turns a change
the database committed into a 500. Driver tasks go first (``first=True``): a metadata store that
is slow to answer does not delay a stop. What a failed hook did not do is repaired by the
periodic passes (the notices sweep, the reconciler, the cache resyncs).
"""

import logging
from collections.abc import Callable
from datetime import datetime

from celery import shared_task
from django.core.management import call_command
from django.db import connection, transaction
from django.utils import timezone

from gpucap import metrics
from gpucap.celery import app
from gpucap.redis_clients import shared_redis

logger = logging.getLogger(__name__)


def enqueue_on_commit(task_name: str, *args, **options) -> None:
    """Send the task ``task_name`` once the current transaction commits (at once outside one),
    ahead of the transaction's other hooks, so a task never runs for a change that rolled back,
    nor before the change is visible. Tasks load what they need by id and are idempotent: a
    message sent twice is harmless; one the broker refused is sent again by the periodic pass
    that owns that work. ``options`` go to ``send_task`` (``eta``, ``countdown``)."""
    on_commit(
        lambda: app.send_task(task_name, args=list(args), **options),
        what=f"send {task_name}",
        first=True,
    )


def wake_at(task_name: str, target_id: int, when: datetime) -> None:
    """Send ``task_name`` for ``target_id`` at ``when`` (``eta``), once the current transaction
    commits: a set planned again when a protection window ends, a schedule's boundary applied
    on time. Idempotent: asking again for the same task, target and moment sends nothing more."""
    on_commit(lambda: _send_at(task_name, target_id, when), what=f"send {task_name} at {when}")


def _send_at(task_name: str, target_id: int, when: datetime) -> None:
    seconds = max(0.0, (when - timezone.now()).total_seconds())
    key = (
        f"gpucap:wake:{connection.settings_dict['NAME']}:{task_name}:{target_id}:"
        f"{when.timestamp():.6f}"
    )
    # The key outlives the moment by a margin, so a retry just after it sends nothing twice.
    if shared_redis().set(key, "1", nx=True, ex=int(seconds) + 30):
        app.send_task(task_name, args=[target_id], eta=when)


def on_commit(
    func: Callable[[], object], *, what: str, first: bool = False, using: str | None = None
) -> None:
    """Run ``func`` once the current transaction commits (at once outside one), robustly: if it
    raises, the error is logged with ``what`` and counted, and the other hooks still run.
    ``first``: before the hooks registered without it in the same transaction (in the order
    the ``first`` ones were registered)."""
    hook = _Hook(func, what)
    connection = transaction.get_connection(using)
    if not first or not connection.in_atomic_block:
        transaction.on_commit(hook, using=using)
        return
    transaction.on_commit(hook, using=using)
    _move_ahead(connection, hook)


class _Hook:
    """One robust post-commit hook. ``func`` is what was asked to run (gpucap.cache_flush
    looks for its own callback among the pending ones)."""

    first = False

    def __init__(self, func: Callable[[], object], what: str) -> None:
        self.func, self.what = func, what
        self.__name__ = getattr(func, "__name__", what)  # for tests and tracebacks
        self.__qualname__ = f"on_commit({what})"

    def __call__(self) -> None:
        try:
            self.func()
        except Exception:
            logger.exception("after commit: %s failed; the other hooks run on", self.what)
            metrics.shared_count(metrics.ON_COMMIT_FAILURES, hook=self.what)


def _move_ahead(connection, hook: _Hook) -> None:
    """Move the just-registered ``hook`` before the hooks of the current transaction that are
    not ``first``. Only hooks of the transaction the application opened are passed: those a
    test case's wrapper holds from earlier transactions stay where they are."""
    hook.first = True
    pending = connection.run_on_commit
    entry = pending.pop()
    start = _transaction_start(connection)
    at = len(pending)
    while at > start and not getattr(pending[at - 1][1], "first", False):
        at -= 1
    pending.insert(at, entry)


def application_transaction(connection) -> tuple:
    """Which transaction the application is in: the depth of its outermost atomic block and,
    when that block is nested in a test case's wrapper, the savepoint it opened (unique);
    ``(None, None)`` outside one."""
    for depth, block in enumerate(connection.atomic_blocks):
        if not getattr(block, "_from_testcase", False):
            return (depth, connection.savepoint_ids[depth - 1] if depth else None)
    return (None, None)


def _transaction_start(connection) -> int:
    """Where the hooks of the transaction the application opened begin in ``run_on_commit``.
    In production that is the whole list."""
    depth, savepoint = application_transaction(connection)
    pending = connection.run_on_commit
    if depth is None:
        return len(pending)
    if depth == 0:
        return 0
    at = len(pending)
    while at > 0 and savepoint in pending[at - 1][0]:
        at -= 1
    return at


@shared_task(name="gpucap.sessions_clear")
def sessions_clear() -> None:
    """Housekeeping: drop expired login sessions (idempotent)."""
    call_command("clearsessions")
