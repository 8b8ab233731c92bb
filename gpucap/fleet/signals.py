"""The fleet's events. ``capacity_set_changed``, sent by ``capacity_set_bump`` whenever
something a capacity set's plan depends on changed (its generation was bumped): a node cordoned
or joining, a pool re-ranked or its floor moved, a VM's demand or capacity (through the plans
app's own receiver of the VM lifecycle). Sent inside the transaction that made the change.

Why a signal: plans sits above the fleet (it reads the fleet to plan it), so the fleet must not
import it; plans subscribes in its ``AppConfig.ready()`` and asks for a prompt, debounced replan
(gpucap/plans/triggers.py). Argument: ``capacity_set_id``.
"""

from django.dispatch import Signal

capacity_set_changed = Signal()

# An operator marked a node down (``node_set_state``): what ran there is lost with it. Rentals
# (``gpucap/rentals/receivers.py``) sends each VM holding GPUs there back to pending (spot) or
# to failed (the rest), releasing its GPUs. Sent inside the transaction that changed the
# node's state. Arguments: ``node_id``, ``hostname``, ``message`` (the operator's words, or "").
node_went_down = Signal()

# A node was dedicated to a tenant or released to the shared pool (``node_set_dedicated_tenant``,
# whether from the node's page, the API or the fleet file). Usage (``gpucap/usage/receivers.py``)
# ends the usage intervals of the VMs there whose attribution changes (a tenant's own VMs become
# or stop being "dedicated" GPU time) and opens the next. Sent inside the transaction that
# changed the node. Argument: ``node_id``.
node_dedication_changed = Signal()

# A GPU's health became failed (``gpu_set_health``, whoever called it: discovery, the API, the
# fleet file). Notices (``gpucap/notices/receivers.py``) gives every running VM holding the card
# a drain notice and stops it at the deadline, on-demand VMs too: their card is broken. Sent
# inside the transaction that changed the health, only when it changed. Arguments: ``gpu_id``,
# ``node_id``, ``actor`` (who set it failed; None for the system).
gpu_failed = Signal()

# About to move a node between states (``node_set_state``), sent once the move is legal and
# before anything changes: a receiver that must keep the node where it is raises
# ``gpucap.errors.Conflict`` naming why, and nothing changes. The BMC app keeps a node rented
# whole to a tenant out of service (``gpucap.bmc.bare_metal``: no ``ready`` or ``draining``
# while the rental lasts). Arguments: ``node``, ``old``, ``new``.
node_state_changing = Signal()

# About to dedicate a node to a tenant or release it (``node_set_dedicated_tenant``), before
# anything changes; a receiver may refuse with ``Conflict``, as above (a node rented whole stays
# its tenant's until the rental ends). Arguments: ``node``, ``tenant`` (None: released).
node_dedication_changing = Signal()
