"""Rebuilding a store that came back empty, from the edge.

A Redis that restarts without its data answers every read with "no such key": the metadata
endpoint would tell guests there is no VM at their address, the router that their API keys are
wrong, until the periodic resync runs. Each full resync therefore writes a sentinel key (its
``synced`` key: gpucap.notices.cache, gpucap.inference.cache); an app that reads nothing where
a document should be and finds no sentinel either knows the store is unsynced, answers 503 with
``Retry-After`` instead of a false 404 or 401, and starts the resync here at once.

One process of the whole fleet rebuilds a store: the one whose ``SET <claim> NX EX`` won
(``CLAIM_SECONDS``, after which another may try again, should this one have died or the
database have failed it). It runs the app's resync (database reads, then one pipelined write)
in a thread of its own, closing that thread's database connections after.
"""

import asyncio
import logging
from collections.abc import Callable

from asgiref.sync import sync_to_async
from django.db import connections

# Long enough for a fleet's resync, short enough that a failed one is retried soon.
CLAIM_SECONDS = 10
# What a client is told to wait before asking again while the store is rebuilt.
RETRY_AFTER_SECONDS = 1

log = logging.getLogger(__name__)

# The resyncs running in this process, by name: kept so none is collected while it runs, and
# so a second request does not start a second one.
_running: dict[str, asyncio.Task] = {}


class StoreUnsynced(Exception):
    """The store holds no full resync (it was never synced, or Redis lost its data)."""


def resync_start(name: str, resync: Callable[[], int]) -> None:
    """Run ``resync`` in a thread unless this process already runs it; the caller holds the
    claim."""
    if name in _running:
        return
    in_thread = sync_to_async(_resync_logged, thread_sensitive=False)
    task = asyncio.ensure_future(in_thread(name, resync))
    _running[name] = task
    task.add_done_callback(lambda _: _running.pop(name, None))


def _resync_logged(name: str, resync: Callable[[], int]) -> None:
    try:
        count = resync()
        log.warning("%s: the store was empty; resynced %d documents", name, count)
    except Exception:
        log.exception("%s: resync of an empty store failed; retried after the claim lapses", name)
    finally:
        connections.close_all()
