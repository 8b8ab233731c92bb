"""Every REST endpoint under /api/: one router for the viewsets (their commands are
``@action`` routes on them), the token endpoint, and a JSON 404 for any other path."""

from django.urls import path, re_path
from rest_framework.routers import DefaultRouter

from gpucap.allocation.api import TenantQuotaViewSet
from gpucap.api.errors import endpoint_not_found
from gpucap.bmc.api import DiscoveriesView, DiscoveryApplyView, DiscoveryView, NodeBmcView
from gpucap.bmc.bare_metal_api import BareMetalImageViewSet, BareMetalRentalViewSet
from gpucap.bmc.provisioning_api import NodeProvisioningView
from gpucap.bmc.recovery_api import (
    ClusterRecoveryPolicyView,
    NodePowerCycleView,
    NodeRecoveryClearView,
    NodeRecoveryView,
)
from gpucap.fleet.api import (
    CapacitySetViewSet,
    ClusterViewSet,
    GpuViewSet,
    ImageViewSet,
    NodeViewSet,
    PoolViewSet,
)
from gpucap.inference.api import (
    ApiKeyViewSet,
    CapacitySetLoadProfileView,
    InferenceDeploymentViewSet,
)
from gpucap.notices.api import (
    CapacitySetDrainView,
    NodeDrainBlockersView,
    NodeDrainView,
    NoticeViewSet,
    VmReclaimView,
)
from gpucap.notices.dedications_api import NodeDedicateView, NodeReleaseView
from gpucap.plans.api import (
    CapacitySetModeView,
    CapacitySetPlanView,
    CapacitySetWhatIfView,
    PlanViewSet,
)
from gpucap.plans.reservations_api import CapacitySetReservationsView, ReservationViewSet
from gpucap.plans.simulation_api import (
    CapacitySetSimulateView,
    CapacitySetSimulationsView,
    SimulationRunView,
)
from gpucap.portal.api import TenantViewSet
from gpucap.rentals.api import VirtualMachineViewSet
from gpucap.schedules.api import (
    CapacitySetOverridesView,
    CapacitySetPolicyView,
    CapacitySetScheduleView,
    PolicyOverrideView,
    ScheduleEntryView,
)
from gpucap.tenancy.api import ObtainTokenView
from gpucap.usage.api import UsageView

router = DefaultRouter()
router.register("clusters", ClusterViewSet, basename="cluster")
router.register("nodes", NodeViewSet, basename="node")
router.register("gpus", GpuViewSet, basename="gpu")
router.register("capacity-sets", CapacitySetViewSet, basename="capacity-set")
router.register("pools", PoolViewSet, basename="pool")
router.register("images", ImageViewSet, basename="image")
router.register("tenants", TenantViewSet, basename="tenant")
router.register("vms", VirtualMachineViewSet, basename="vm")
router.register("notices", NoticeViewSet, basename="notice")
router.register("plans", PlanViewSet, basename="plan")
router.register("deployments", InferenceDeploymentViewSet, basename="deployment")
router.register("api-keys", ApiKeyViewSet, basename="api-key")
router.register("quotas", TenantQuotaViewSet, basename="quota")
router.register("reservations", ReservationViewSet, basename="reservation")
router.register("bare-metal", BareMetalRentalViewSet, basename="bare-metal")
router.register("bare-metal-images", BareMetalImageViewSet, basename="bare-metal-image")

urlpatterns = [
    path("token/", ObtainTokenView.as_view(), name="api-token"),
    path("nodes/<int:id>/drain/", NodeDrainView.as_view(), name="api-node-drain"),
    path(
        "nodes/<int:id>/drain-blockers/",
        NodeDrainBlockersView.as_view(),
        name="api-node-drain-blockers",
    ),
    path(
        "capacity-sets/<int:id>/drain/",
        CapacitySetDrainView.as_view(),
        name="api-capacity-set-drain",
    ),
    path("nodes/<int:id>/dedicate/", NodeDedicateView.as_view(), name="api-node-dedicate"),
    path("nodes/<int:id>/release/", NodeReleaseView.as_view(), name="api-node-release"),
    path(
        "nodes/<int:id>/provisioning/",
        NodeProvisioningView.as_view(),
        name="api-node-provisioning",
    ),
    path("vms/<int:id>/reclaim/", VmReclaimView.as_view(), name="api-vm-reclaim"),
    path("nodes/<int:id>/bmc/", NodeBmcView.as_view(), name="api-node-bmc"),
    path("bmc/discoveries/", DiscoveriesView.as_view(), name="api-bmc-discoveries"),
    path("bmc/discoveries/<int:id>/", DiscoveryView.as_view(), name="api-bmc-discovery"),
    path(
        "bmc/discoveries/<int:id>/apply/",
        DiscoveryApplyView.as_view(),
        name="api-bmc-discovery-apply",
    ),
    path("nodes/<int:id>/recovery/", NodeRecoveryView.as_view(), name="api-node-recovery"),
    path(
        "nodes/<int:id>/recovery/clear/",
        NodeRecoveryClearView.as_view(),
        name="api-node-recovery-clear",
    ),
    path("nodes/<int:id>/power-cycle/", NodePowerCycleView.as_view(), name="api-node-power-cycle"),
    path(
        "clusters/<int:id>/recovery-policy/",
        ClusterRecoveryPolicyView.as_view(),
        name="api-cluster-recovery-policy",
    ),
    path(
        "capacity-sets/<int:id>/plan/",
        CapacitySetPlanView.as_view(),
        name="api-capacity-set-plan",
    ),
    path(
        "capacity-sets/<int:id>/mode/",
        CapacitySetModeView.as_view(),
        name="api-capacity-set-mode",
    ),
    path(
        "capacity-sets/<int:id>/what-if/",
        CapacitySetWhatIfView.as_view(),
        name="api-capacity-set-what-if",
    ),
    path(
        "capacity-sets/<int:id>/reservations/",
        CapacitySetReservationsView.as_view(),
        name="api-capacity-set-reservations",
    ),
    path(
        "capacity-sets/<int:id>/schedule/",
        CapacitySetScheduleView.as_view(),
        name="api-capacity-set-schedule",
    ),
    path(
        "capacity-sets/<int:id>/schedule/<slug:name>/",
        ScheduleEntryView.as_view(),
        name="api-schedule-entry",
    ),
    path(
        "capacity-sets/<int:id>/overrides/",
        CapacitySetOverridesView.as_view(),
        name="api-capacity-set-overrides",
    ),
    path(
        "capacity-sets/<int:id>/overrides/<slug:name>/",
        PolicyOverrideView.as_view(),
        name="api-policy-override",
    ),
    path(
        "capacity-sets/<int:id>/policy/",
        CapacitySetPolicyView.as_view(),
        name="api-capacity-set-policy",
    ),
    path(
        "capacity-sets/<int:id>/load-profile/",
        CapacitySetLoadProfileView.as_view(),
        name="api-capacity-set-load-profile",
    ),
    path(
        "capacity-sets/<int:id>/simulate/",
        CapacitySetSimulateView.as_view(),
        name="api-capacity-set-simulate",
    ),
    path(
        "capacity-sets/<int:id>/simulations/",
        CapacitySetSimulationsView.as_view(),
        name="api-capacity-set-simulations",
    ),
    path("simulations/<int:id>/", SimulationRunView.as_view(), name="api-simulation"),
    path("usage/", UsageView.as_view(), name="api-usage"),
    *router.urls,
    re_path(r"^", endpoint_not_found),
]
