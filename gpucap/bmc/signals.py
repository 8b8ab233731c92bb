"""The BMC app's events.

``bare_metal_rental_changed``: a whole machine was rented to a tenant or its rental ended
(``gpucap.bmc.bare_metal``). Usage (``gpucap/usage/receivers.py``) opens the rental's usage
interval, the node's GPUs held from its start, and closes it at its end; the BMC app sits below
usage, so it tells rather than calls. Sent inside the transaction that made the change.
Argument: ``rental`` (its ``started_at`` and ``ended_at`` say which).
"""

from django.dispatch import Signal

bare_metal_rental_changed = Signal()
