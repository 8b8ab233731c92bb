from django.urls import path

from gpucap.console import (
    bare_metal,
    bmc_panel,
    cluster_discovery,
    cluster_recovery,
    dedication,
    provisioning,
    recovery,
    reservations,
    schedule,
    views,
)

# The namespace stays "fleet": these are the fleet's pages, at /fleet/, whoever builds them.
app_name = "fleet"

urlpatterns = [
    path("", views.fleet_overview, name="overview"),
    path("sets/", views.capacity_set_list, name="capacity-set-list"),
    path("sets/<slug:name>/", views.capacity_set_detail, name="capacity-set-detail"),
    path("sets/<slug:name>/live/", views.capacity_set_live, name="capacity-set-live"),
    path("sets/<slug:name>/drain/", views.capacity_set_drain, name="capacity-set-drain"),
    path(
        "sets/<slug:name>/schedule/entries/",
        schedule.schedule_entry_save,
        name="schedule-entry-save",
    ),
    path(
        "sets/<slug:name>/schedule/entries/<slug:entry>/",
        schedule.schedule_entry_edit,
        name="schedule-entry-edit",
    ),
    path(
        "sets/<slug:name>/schedule/entries/<slug:entry>/delete/",
        schedule.schedule_entry_delete,
        name="schedule-entry-delete",
    ),
    path(
        "sets/<slug:name>/schedule/overrides/<slug:override>/clear/",
        schedule.policy_override_clear,
        name="policy-override-clear",
    ),
    path(
        "sets/<slug:name>/schedule/timeline/", schedule.schedule_timeline, name="schedule-timeline"
    ),
    path(
        "sets/<slug:name>/reservations/",
        reservations.reservations_section,
        name="reservations-section",
    ),
    path(
        "sets/<slug:name>/reservations/add/", reservations.reservation_add, name="reservation-add"
    ),
    path(
        "sets/<slug:name>/reservations/<int:pk>/delete/",
        reservations.reservation_delete,
        name="reservation-delete",
    ),
    path("clusters/", views.cluster_list, name="cluster-list"),
    path("clusters/<slug:name>/", views.cluster_detail, name="cluster-detail"),
    path(
        "clusters/<slug:name>/bare-metal-images/",
        bare_metal.images_section,
        name="bare-metal-images",
    ),
    path(
        "clusters/<slug:name>/bare-metal-images/add/",
        bare_metal.image_add,
        name="bare-metal-image-add",
    ),
    path(
        "clusters/<slug:name>/bare-metal-images/<int:pk>/offer/",
        bare_metal.image_offer,
        name="bare-metal-image-offer",
    ),
    path(
        "clusters/<slug:name>/bare-metal-images/<int:pk>/delete/",
        bare_metal.image_delete,
        name="bare-metal-image-delete",
    ),
    path(
        "clusters/<slug:name>/recovery-policy/",
        cluster_recovery.cluster_recovery_policy,
        name="cluster-recovery-policy",
    ),
    path(
        "clusters/<slug:name>/discover/",
        cluster_discovery.cluster_discover,
        name="cluster-discover",
    ),
    path(
        "clusters/<slug:name>/discover/row/",
        cluster_discovery.cluster_discover_row,
        name="cluster-discover-row",
    ),
    path(
        "clusters/<slug:name>/discoveries/<int:run_id>/",
        cluster_discovery.cluster_discovery,
        name="cluster-discovery",
    ),
    path(
        "clusters/<slug:name>/discoveries/<int:run_id>/apply/",
        cluster_discovery.cluster_discovery_apply,
        name="cluster-discovery-apply",
    ),
    path("nodes/<slug:cluster>/<str:hostname>/", views.node_detail, name="node-detail"),
    path("nodes/<slug:cluster>/<str:hostname>/cordon/", views.node_cordon, name="node-cordon"),
    path(
        "nodes/<slug:cluster>/<str:hostname>/uncordon/", views.node_uncordon, name="node-uncordon"
    ),
    path("nodes/<slug:cluster>/<str:hostname>/drain/", views.node_drain, name="node-drain"),
    path(
        "nodes/<slug:cluster>/<str:hostname>/dedicate/",
        dedication.node_dedicate,
        name="node-dedicate",
    ),
    path(
        "nodes/<slug:cluster>/<str:hostname>/release/",
        dedication.node_release,
        name="node-release",
    ),
    path(
        "nodes/<slug:cluster>/<str:hostname>/bare-metal/",
        bare_metal.node_section,
        name="node-bare-metal",
    ),
    path(
        "nodes/<slug:cluster>/<str:hostname>/bare-metal/rent/",
        bare_metal.node_rent,
        name="node-bare-metal-rent",
    ),
    path(
        "nodes/<slug:cluster>/<str:hostname>/bare-metal/end/",
        bare_metal.node_rental_end,
        name="node-bare-metal-end",
    ),
    path("nodes/<slug:cluster>/<str:hostname>/bmc/", bmc_panel.node_bmc, name="node-bmc"),
    path(
        "nodes/<slug:cluster>/<str:hostname>/bmc/credentials/",
        bmc_panel.node_bmc_credentials,
        name="node-bmc-credentials",
    ),
    path(
        "nodes/<slug:cluster>/<str:hostname>/bmc/credentials/delete/",
        bmc_panel.node_bmc_credentials_delete,
        name="node-bmc-credentials-delete",
    ),
    path(
        "nodes/<slug:cluster>/<str:hostname>/bmc/rediscover/",
        bmc_panel.node_rediscover,
        name="node-bmc-rediscover",
    ),
    path(
        "nodes/<slug:cluster>/<str:hostname>/bmc/discoveries/<int:run_id>/apply/",
        bmc_panel.node_discovery_apply,
        name="node-bmc-apply",
    ),
    path(
        "nodes/<slug:cluster>/<str:hostname>/recovery/",
        recovery.node_recovery,
        name="node-recovery",
    ),
    path(
        "nodes/<slug:cluster>/<str:hostname>/power-cycle/",
        recovery.node_power_cycle,
        name="node-power-cycle",
    ),
    path(
        "nodes/<slug:cluster>/<str:hostname>/recovery/clear/",
        recovery.node_recovery_clear,
        name="node-recovery-clear",
    ),
    path(
        "nodes/<slug:cluster>/<str:hostname>/provisioning/",
        provisioning.node_provisioning,
        name="node-provisioning",
    ),
]
