"""Notices act on VMs: the rentals fixtures (VMs in any state, captured tasks, the simulated
fleet) serve these tests too."""

from tests.rentals.conftest import sent_tasks, sim, vm_in  # noqa: F401
