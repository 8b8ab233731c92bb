"""Read-mostly admin aids for operators. Changes that matter to plans go through services (the
pages and the API); the admin shows the fleet and lets an operator fix descriptive fields."""

from django.contrib import admin

from gpucap.fleet.models import CapacitySet, Cluster, Gpu, Node, Pool


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = ["index", "uuid", "pci_address", "health"]
    readonly_fields = ["index", "uuid", "pci_address", "health"]
    can_delete = False


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ["name", "driver", "created_at"]
    search_fields = ["name"]


@admin.register(CapacitySet)
class CapacitySetAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "cluster",
        "gpu_model",
        "fabric",
        "mode",
        "notice_seconds",
        "generation",
    ]
    list_filter = ["cluster", "fabric", "mode"]
    search_fields = ["name", "gpu_model"]
    readonly_fields = ["cluster", "gpu_model", "fabric", "mode", "generation"]


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = [
        "hostname",
        "cluster",
        "capacity_set",
        "gpu_model",
        "fabric",
        "gpu_count",
        "state",
    ]
    list_filter = ["cluster", "capacity_set", "fabric", "state", "gpu_model"]
    search_fields = ["hostname", "bmc_address"]
    list_select_related = ["cluster", "capacity_set"]
    readonly_fields = [
        "cluster",
        "capacity_set",
        "gpu_model",
        "fabric",
        "gpu_count",
        "state",
        "partitions",
    ]
    inlines = [GpuInline]


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["__str__", "uuid", "pci_address", "health"]
    list_filter = ["health", "node__cluster"]
    search_fields = ["uuid", "node__hostname", "pci_address"]
    list_select_related = ["node"]
    readonly_fields = ["node", "index", "uuid", "pci_address", "health"]


@admin.register(Pool)
class PoolAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "cluster", "capacity_set", "rank", "floor_gpus"]
    list_filter = ["kind", "cluster", "capacity_set"]
    search_fields = ["name"]
    list_select_related = ["cluster", "capacity_set"]
    readonly_fields = ["cluster", "capacity_set", "rank", "floor_gpus", "kind"]
    filter_horizontal = ["tenants"]
