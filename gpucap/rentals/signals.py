"""What rentals tells the apps that follow a VM: ``vm_transitioned``, the one lifecycle event,
sent by ``rentals.services.vm_transition`` after every change of a VM's state (DESIGN.md
section 4); and ``guest_shut_down_early``, sent by the reconciler (below).

Why a signal rather than an explicit dispatcher: the HackSoft Django Styleguide keeps signals
for decoupling (and cache invalidation) only, and this is that case. Rentals must not know who
follows a VM's lifecycle; each app that keeps something in step with it subscribes in its own
``AppConfig.ready()``:

- usage (``gpucap/usage/receivers.py``): opens a usage interval when the VM takes GPUs and
  closes it when the VM lets them go;
- notices (``gpucap/notices/receivers.py``): completes the VM's open notice when it lets go of
  its GPUs, checks after commit whether its node ends a drain, republishes its metadata;
- plans (``gpucap/plans/receivers.py``): bumps the capacity set's generation (a replan);
- inference (``gpucap/inference/receivers.py``): republishes the route of a replica's
  deployment (the router sends only to running replicas).

An explicit dispatcher in rentals would have to import every one of those apps, and it is those
imports (rentals -> notices -> rentals) that made the import circles this replaces.

It is sent inside the transaction, after the VM row is saved, its GPU allocations released (an
``Allocation`` is a rentals row, so that stays in rentals) and the move audited. Receivers write
in the same transaction (an exception rolls the transition back) and defer any work outside the
database to ``gpucap.tasks.on_commit`` (robust: one failing hook never stops the others). Arguments:

- ``vm``: the locked ``VirtualMachine`` as it is now (``vm.state == new``);
- ``old``, ``new``: the state before and after;
- ``now``: the moment of the move (what ``started_at`` / ``stopped_at`` and the release use);
- ``node_id``: the node the VM held (on a move that takes GPUs: the node it now holds), or None.

``gpucap.rentals.services.HOLDING`` says in which states a VM holds GPUs.
"""

from django.dispatch import Signal

vm_transitioned = Signal()

# The reconciler saw a notified VM's guest powered off before its notice's deadline (the
# hypervisor says so). What that means is the notice's business: notices
# (``gpucap/notices/receivers.py``) completes the notice as ``guest_shutdown`` and frees the
# GPUs now rather than at the deadline. Sent inside the reconciler's repair, under the VM's row
# lock; harmless twice. Argument: ``vm``.
guest_shut_down_early = Signal()
