"""Cache publishes collected per transaction and flushed once, after it commits.

A service that changes what a Redis cache serves (the instance metadata documents, the router's
routes and keys) names the changed id; the ids named in one transaction are collected and, once
it commits, written by ONE callback in one pipelined round trip: an Approve that stops N VMs
makes one metadata flush and one route flush, not one publish per VM.

The callback is robust (``gpucap.tasks.on_commit``): a cache that is down logs and counts the
error, never fails the request, which committed already, and never keeps the hooks after it
(a VM's driver task goes before it anyway) from running; the periodic resyncs
(``metadata_resync``, ``inference_resync``) repair the cache within one interval.

The collection lives on the database connection, beside Django's own list of commit callbacks,
and belongs to the flush callback registered when its first id arrived. When that callback is no
longer pending — it ran, or its transaction (or the savepoint it was registered in) rolled back
and Django discarded it — the ids collected with it are dropped and the next id starts a fresh
collection with a fresh callback. Outside a transaction the id is flushed at once. (An id named
in a savepoint that rolled back inside a transaction that commits is flushed all the same:
harmless, as a flush writes what the database says at the time.)

A collection also belongs to one transaction as the application opened it: the outermost atomic
block that is not a test case's wrapper (Django's own durable check skips those the same way).
Under a ``TestCase`` (or pytest-django's ``db``) each service call is then its own
transaction, as in production, and ``captureOnCommitCallbacks`` sees its flush.
"""

from collections.abc import Callable

from django.db import transaction

from gpucap.tasks import application_transaction, on_commit

Flush = Callable[[set], None]


def publish_on_commit(cache: str, ident, flush: Flush, *, using: str | None = None) -> None:
    """Have ``flush`` write ``ident`` to ``cache`` once the current transaction commits, with
    every other id of that cache named in the same transaction."""
    connection = transaction.get_connection(using)
    if not connection.in_atomic_block:
        on_commit(lambda: flush({ident}), what=f"{cache} cache flush", using=using)
        return
    collections = connection.__dict__.setdefault("gpucap_cache_flushes", {})
    key = application_transaction(connection)
    collection = collections.get(cache)
    if collection is None or collection.key != key or not collection.pending(connection):
        collection = _Collection(cache, key, flush, collections)
        collections[cache] = collection
        on_commit(collection.flush, what=f"{cache} cache flush", using=using)
    collection.ids.add(ident)


class _Collection:
    """The ids of one cache waiting for one transaction to commit."""

    def __init__(self, cache: str, key: tuple, flush: Flush, collections: dict) -> None:
        self.cache, self.key, self._flush, self._collections = cache, key, flush, collections
        self.ids: set = set()

    def pending(self, connection) -> bool:
        """Whether this collection's callback still waits for the commit (not run, not
        discarded by a rollback)."""
        return any(
            getattr(hook, "func", hook) == self.flush for _, hook, _ in connection.run_on_commit
        )

    def flush(self) -> None:
        if self._collections.get(self.cache) is self:
            del self._collections[self.cache]
        if self.ids:
            self._flush(self.ids)
