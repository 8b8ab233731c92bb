"""Notices act on VMs: the rentals fixtures (VMs in any state, captured tasks, the simulated
fleet, real workers) serve these tests too."""

from tests.rentals.conftest import celery_queue, sent_tasks, sim, vm_in, workers  # noqa: F401
