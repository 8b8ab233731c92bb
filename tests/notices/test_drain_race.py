"""A drain racing a placement on its node, on real PostgreSQL (threads on separate connections).

The soak (bench/soak.py) found it: a placement holds its capacity set's row from its generation
bump until it commits, and at commit PostgreSQL checks its VM's reference to the node (a
deferred foreign key: a key-share lock on the node's row). A drain (or an uncordon) that had
locked the node's row FOR UPDATE and then waited for the set's row made the two wait for each
other: "deadlock detected", and the operator's or tenant's request answered 500. Node locks
are FOR NO KEY UPDATE now, which a foreign key check does not wait for."""

import threading

import pytest
from django.db import connection, transaction

from gpucap.fleet.models import Node
from gpucap.notices import drains
from gpucap.rentals import services as rentals
from gpucap.rentals.models import VirtualMachine
from tests.rentals.conftest import wait_for
from tests.rentals.vm_helpers import request_vm

pytestmark = pytest.mark.django_db(transaction=True)


def in_thread(outcomes: dict, name: str, call) -> threading.Thread:
    """Run ``call`` in a thread of its own (its own connection); its outcome lands in
    ``outcomes[name]``: "ok" or the exception."""

    def run() -> None:
        try:
            call()
            outcomes[name] = "ok"
        except Exception as exc:  # the test asserts every outcome
            outcomes[name] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def waiting_for_a_lock(statement: str) -> bool:
    """Whether another connection of this database waits for a lock in ``statement``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE %s",
            [f"{statement}%"],
        )
        return cursor.fetchone()[0] > 0


def test_a_drain_and_a_placement_committing_on_its_node_both_go_through(
    fleet_east, tenant, sent_tasks
):
    node = fleet_east["nodes"]["h100-001"]
    vm = request_vm(tenant, fleet_east["pools"]["h100-spot"], name="spot-racer")
    placed, commit = threading.Event(), threading.Event()
    outcomes: dict[str, object] = {}

    def place() -> None:
        with transaction.atomic():
            rentals.vm_place(vm=vm, node=node, gpu_indices=[0])  # bumps the set's generation
            placed.set()
            commit.wait(timeout=60)

    placing = in_thread(outcomes, "place", place)
    wait_for(placed.is_set, timeout=30, what="the placement to hold the set's row")
    draining = in_thread(outcomes, "drain", lambda: drains.node_drain(node=node, actor=None))
    wait_for(
        lambda: waiting_for_a_lock('UPDATE "fleet_capacityset"'),
        timeout=30,
        what="the drain to wait for the set's row",
    )
    commit.set()
    placing.join(timeout=60)
    draining.join(timeout=60)

    assert outcomes == {"place": "ok", "drain": "ok"}
    assert Node.objects.get(pk=node.pk).state == Node.State.DRAINING
    assert VirtualMachine.objects.get(pk=vm.pk).node_id == node.pk
