"""Every change to the fleet goes through here: validated, atomic, audited, and bumping the
capacity set's generation whenever the change could alter a plan. One module per entity; the
rules that the fleet file checks too live in gpucap.fleet.rules.

Callers use the package: ``from gpucap.fleet import services as fleet; fleet.node_create(...)``.
"""

from gpucap.fleet.services._common import capacity_set_bump, lock_set
from gpucap.fleet.services.capacity_sets import (
    capacity_set_create,
    capacity_set_delete,
    capacity_set_gpu_total,
    capacity_set_update,
)
from gpucap.fleet.services.clusters import (
    cluster_create,
    cluster_delete,
    cluster_driver_busy,
    cluster_rename,
    cluster_update,
)
from gpucap.fleet.services.dedication import node_set_dedicated_tenant
from gpucap.fleet.services.fabric import (
    gpu_set_module_id,
    node_set_fabric_partitions,
    node_set_module_ids,
)
from gpucap.fleet.services.gpus import gpu_replace
from gpucap.fleet.services.images import (
    image_create,
    image_delete,
    image_name_problem,
    image_update,
)
from gpucap.fleet.services.node_states import (
    node_cordon,
    node_recovered,
    node_set_state,
    node_uncordon,
)
from gpucap.fleet.services.nodes import (
    generated_gpu,
    gpu_set_health,
    node_create,
    node_delete,
    node_guest_network_busy,
    node_guest_network_problems,
    node_join_set,
    node_leave_set,
    node_update,
)
from gpucap.fleet.services.pools import (
    pool_create,
    pool_delete,
    pool_rerank,
    pool_set_floor,
    pool_set_protect,
    pool_set_tenants,
)

__all__ = [
    "capacity_set_bump",
    "capacity_set_create",
    "capacity_set_delete",
    "capacity_set_gpu_total",
    "capacity_set_update",
    "cluster_create",
    "cluster_delete",
    "cluster_driver_busy",
    "cluster_rename",
    "cluster_update",
    "generated_gpu",
    "gpu_replace",
    "gpu_set_health",
    "gpu_set_module_id",
    "image_create",
    "image_delete",
    "image_name_problem",
    "image_update",
    "lock_set",
    "node_cordon",
    "node_create",
    "node_delete",
    "node_guest_network_busy",
    "node_guest_network_problems",
    "node_join_set",
    "node_leave_set",
    "node_recovered",
    "node_set_dedicated_tenant",
    "node_set_fabric_partitions",
    "node_set_module_ids",
    "node_set_state",
    "node_uncordon",
    "node_update",
    "pool_create",
    "pool_delete",
    "pool_rerank",
    "pool_set_floor",
    "pool_set_protect",
    "pool_set_tenants",
]
