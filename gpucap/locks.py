"""PostgreSQL advisory locks, in one place so their keys never collide.

gpucap uses the two-key form ``(class, object id)``: the class says what the id is, so ids of
different tables never collide (and two-key locks never collide with one-key bigint locks).
Classes are four ASCII letters read as a 32-bit integer:

=================  ======  ===========================================  =====================
class              letters  id                                          held by
=================  ======  ===========================================  =====================
``DRIVER_WORK``    gpvc    a VM: driver work on it                      session (reconcile)
``STANDALONE``     gpsp    a cluster: standalone placement              transaction
``CAPACITY_SET``   gpcs    a capacity set: planning and applying plans  transaction
``USAGE``          gpus    0: making usage records                      transaction
``PROVISIONING``   gpbp    a provisioning run: stepping it              session (bmc tasks)
=================  ======  ===========================================  =====================
"""

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection

DRIVER_WORK = 0x67707663
STANDALONE = 0x67707370
CAPACITY_SET = 0x67706373
USAGE = 0x67707573
PROVISIONING = 0x67706270


def key(lock_class: int, object_id: int) -> tuple[int, int]:
    """The two int4 keys PostgreSQL takes for ``object_id`` (wrapped into int4 range)."""
    return lock_class, (object_id + 2**31) % 2**32 - 2**31


def xact_lock(lock_class: int, object_id: int) -> None:
    """Wait for the lock; it is held until the current transaction ends."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", key(lock_class, object_id))


@contextmanager
def session_try_lock(lock_class: int, object_id: int) -> Iterator[bool]:
    """Try the lock without waiting; yields whether it was taken, and releases it after. A
    session lock: PostgreSQL also releases it when the holder's connection ends, a worker
    killed with SIGKILL included."""
    keys = key(lock_class, object_id)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", keys)
        taken = cursor.fetchone()[0]
    try:
        yield taken
    finally:
        if taken:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s, %s)", keys)
