"""Rentals follows the fleet: a node an operator marked down (``node_went_down``,
gpucap/fleet/signals.py) lost what ran on it, so each VM holding GPUs there goes through
``vm_host_lost`` (a spot VM back to pending, any other failed, GPUs released)."""

from gpucap.rentals.services import vms_host_lost


def vms_follow_node_down(sender, *, node_id: int, hostname: str, message: str = "", **kwargs):
    reason = "an operator marked it down" + (f" ({message})" if message else "")
    vms_host_lost(node_id=node_id, reason=reason)
