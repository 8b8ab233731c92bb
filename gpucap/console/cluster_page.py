"""What the cluster page shows (`gpucap.console.views.cluster_detail`, and the answers of its
panels, `gpucap.console.cluster_discovery` and `cluster_recovery`): the fleet's read of the
cluster, its recovery policy (`gpucap.console.recovery_policy_panel`) and the "Discover
machines" panel (`gpucap.console.discovery_panel`)."""

from gpucap.bmc.models import DiscoveryRun
from gpucap.console.discovery_panel import DiscoveryRows, discovery_context
from gpucap.console.recovery_policy_panel import recovery_policy_context
from gpucap.fleet import selectors


def cluster_context(
    page: selectors.ClusterPage,
    *,
    run: DiscoveryRun | None = None,
    rows: DiscoveryRows | None = None,
) -> dict:
    """The cluster page; ``run`` and ``rows`` are the discovery panel's (the run it shows, the
    rows as posted with their errors). A fixed number of queries."""
    return {
        "nav": "fleet",
        "page": page,
        "cluster": page.cluster,
        **recovery_policy_context(page.cluster),
        **discovery_context(page.cluster, run=run, rows=rows),
    }
