"""The BMC app follows the fleet: a node that went down (``node_went_down``, whoever marked it:
an operator, or the hypervisor watch) starts its recovery's grace from now
(``gpucap.bmc.recovery``)."""

from gpucap.bmc import recovery


def recovery_follows_node_down(sender, *, node_id: int, **kwargs) -> None:
    recovery.node_went_down(node_id=node_id)
