"""A node's state: ready, cordoned, draining, down, and the moves between them. Operators move
nodes (``node_set_state``; a drain is started by ``gpucap.notices.drains``); a node marked down
takes its VMs with it; recovery brings a down node back (``node_recovered``)."""

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from gpucap.audit.services import Actor, audit_record
from gpucap.errors import Conflict
from gpucap.fleet.models import Node
from gpucap.fleet.services._common import capacity_set_bump
from gpucap.fleet.signals import node_state_changing, node_went_down

# Which states an operator may move a node between, and the audit verb for each move.
_NODE_TRANSITIONS = {
    ("ready", "cordoned"): "node.cordon",
    ("draining", "cordoned"): "node.cordon",
    ("cordoned", "ready"): "node.uncordon",
    ("draining", "ready"): "node.uncordon",
    ("ready", "down"): "node.mark_down",
    ("cordoned", "down"): "node.mark_down",
    ("draining", "down"): "node.mark_down",
    ("down", "cordoned"): "node.mark_up",
    # Started only by gpucap.notices.drains.node_drain, which also warns the node's guests.
    ("ready", "draining"): "node.drain",
    ("cordoned", "draining"): "node.drain",
}


@transaction.atomic
def node_set_state(*, node: Node, state: str, actor: Actor = None, message: str = "") -> Node:
    """Move a node between ready/cordoned/down. A node back from down stays cordoned until an
    operator uncordons it (it may need checks first). Draining is started by the drain service.
    A node marked down takes its VMs with it (``signals.node_went_down``)."""
    if state not in Node.State.values:
        raise ValidationError({"state": f"unknown state {state!r}"})
    # FOR NO KEY UPDATE, as every node and GPU lock here but a delete's: a placement on this
    # node holds its set's row (the generation bump) until its commit checks its references to
    # the node and GPUs (deferred foreign keys, FOR KEY SHARE). FOR UPDATE would wait for that
    # check while the placement waits for our bump: a deadlock (tests/notices/test_drain_race.py).
    node = Node.objects.select_for_update(no_key=True).get(pk=node.pk)
    if node.state == state:
        return node
    verb = _NODE_TRANSITIONS.get((node.state, state))
    if verb is None:
        raise Conflict(f"node {node.hostname} is {node.state}; it cannot become {state}")
    _node_move(node, state, verb=verb, actor=actor, message=message)
    if state == Node.State.DOWN:
        # Its VMs are lost with it (rentals follows: spot back to pending, the rest failed).
        node_went_down.send(sender=Node, node_id=node.pk, hostname=node.hostname, message=message)
    return node


@transaction.atomic
def node_recovered(*, node: Node, message: str = "") -> Node:
    """A down node's hypervisor answers again after recovery power-cycled it
    (``gpucap.bmc.recovery``): it is ``ready`` at once. Only recovery calls this, once it has
    seen the hypervisor answer; an operator's own way back from down stays ``down ->
    cordoned`` (``node_set_state``), for checks first. A node that is not down is left as it
    is (returned unchanged)."""
    node = Node.objects.select_for_update(no_key=True).get(pk=node.pk)
    if node.state != Node.State.DOWN:
        return node
    _node_move(node, Node.State.READY, verb="node.recover", actor=None, message=message)
    return node


def _node_move(node: Node, state: str, *, verb: str, actor: Actor, message: str) -> None:
    """Move a locked node to ``state``: the row, the set's generation, the audit event. A
    receiver of ``node_state_changing`` may refuse the move first (``Conflict``)."""
    node_state_changing.send(sender=Node, node=node, old=node.state, new=state)
    before = node.state
    Node.objects.filter(pk=node.pk, state=before).update(state=state, updated_at=timezone.now())
    node.state = state
    capacity_set_bump(capacity_set_id=node.capacity_set_id)
    audit_record(
        actor=actor,
        verb=verb,
        target=node,
        before={"state": before},
        after={"state": state},
        message=message,
    )


def node_cordon(*, node: Node, actor: Actor = None) -> Node:
    return node_set_state(node=node, state=Node.State.CORDONED, actor=actor)


def node_uncordon(*, node: Node, actor: Actor = None) -> Node:
    return node_set_state(node=node, state=Node.State.READY, actor=actor)
