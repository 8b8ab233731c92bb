"""Every REST endpoint under /api/: one router for the viewsets (their commands are
``@action`` routes on them), the token endpoint, and a JSON 404 for any other path."""

from django.urls import path, re_path
from rest_framework.routers import DefaultRouter

from gpucap.api import endpoint_not_found
from gpucap.fleet.api import (
    CapacitySetViewSet,
    ClusterViewSet,
    GpuViewSet,
    NodeViewSet,
    PoolViewSet,
)
from gpucap.rentals.api import VirtualMachineViewSet
from gpucap.tenancy.api import ObtainTokenView, TenantViewSet

router = DefaultRouter()
router.register("clusters", ClusterViewSet, basename="cluster")
router.register("nodes", NodeViewSet, basename="node")
router.register("gpus", GpuViewSet, basename="gpu")
router.register("capacity-sets", CapacitySetViewSet, basename="capacity-set")
router.register("pools", PoolViewSet, basename="pool")
router.register("tenants", TenantViewSet, basename="tenant")
router.register("vms", VirtualMachineViewSet, basename="vm")

urlpatterns = [
    path("token/", ObtainTokenView.as_view(), name="api-token"),
    *router.urls,
    re_path(r"^", endpoint_not_found),
]
