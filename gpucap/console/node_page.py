"""What the node page shows (`gpucap.console.views.node_detail` and the dedication panel's
answers, `gpucap.console.dedication`): its GPUs each with the VM holding it, its partitions,
recent changes, who holds a drain up, the tenant it is dedicated to with who still holds
the dedication up, and its recovery (`gpucap.console.recovery`)."""

from django import forms

from gpucap.audit.selectors import events_for
from gpucap.bmc.recovery_selectors import recovery_panel
from gpucap.console.bmc_forms import bmc_context
from gpucap.console.provisioning_panel import provisioning_context
from gpucap.fleet import selectors
from gpucap.fleet.models import Node
from gpucap.notices.dedications import dedication_holders
from gpucap.notices.selectors import drain_blockers
from gpucap.rentals.selectors import gpu_holders
from gpucap.tenancy.models import Tenant


class DedicateForm(forms.Form):
    tenant = forms.ModelChoiceField(
        queryset=Tenant.objects.order_by("name"),
        empty_label="Pick a tenant",
        to_field_name="slug",
        error_messages={
            "required": "pick the tenant the node is given to",
            "invalid_choice": "no such tenant",
        },
        help_text="Only this tenant's VMs are placed on the node from then on.",
    )


def node_context(tile: selectors.NodeTile, *, dedicate_form: DedicateForm | None = None) -> dict:
    """The node page. A fixed number of queries."""
    node = tile.node
    holders = gpu_holders(node_id=node.pk)
    return {
        "nav": "fleet",
        "tile": tile,
        "gpu_rows": [(square, holders.get(square.index)) for square in tile.squares],
        "node": node,
        "partition_table": selectors.partition_table(node),
        "events": events_for(node),
        "can_cordon": node.state in (Node.State.READY, Node.State.DRAINING),
        "can_uncordon": node.state in (Node.State.CORDONED, Node.State.DRAINING),
        "can_drain": node.state in (Node.State.READY, Node.State.CORDONED),
        "blockers": drain_blockers(node) if node.state == Node.State.DRAINING else None,
        # A shared node: the form; a dedicated one: other tenants' VMs still on it.
        "dedicate_form": dedicate_form or DedicateForm(),
        "dedication_holders": dedication_holders(node) if node.dedicated_tenant_id else None,
        **bmc_context(node),  # console/node_bmc.html
        "recovery": recovery_panel(node),
        **provisioning_context(node),
    }
