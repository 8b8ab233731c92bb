"""Read-mostly admin aids for operators. Changes that matter to plans go through services (the
pages and the API); the admin shows the fleet and lets an operator fix descriptive fields."""

from django import forms
from django.contrib import admin

from gpucap.fleet import services as fleet
from gpucap.fleet.models import CapacitySet, Cluster, Gpu, Image, Node, Pool
from gpucap.fleet.services.fabric import module_id_problem, module_ids_problem
from gpucap.fleet.services.images import IMAGE_FIELDS, image_problems


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = ["index", "uuid", "pci_address", "module_id", "health"]
    readonly_fields = ["index", "uuid", "pci_address", "module_id", "health"]
    can_delete = False


class ClusterAdminForm(forms.ModelForm):
    """The driver's settings are checked by the model (``Cluster.clean``); the driver itself
    changes only while no VM runs on the cluster, as the API refuses it."""

    class Meta:
        model = Cluster
        fields = ["name", "driver", "driver_settings"]

    def clean(self):
        data = super().clean()
        driver = data.get("driver")
        if self.instance.pk and driver and driver != self.instance.driver:
            busy = fleet.cluster_driver_busy(self.instance, driver=driver)
            if busy:
                self.add_error("driver", busy)
        return data


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    form = ClusterAdminForm
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


class NodeAdminForm(forms.ModelForm):
    """The guest network as the API checks it: each value, no overlap with another node's
    subnet (naming it), and no change while guests hold GPUs on the node."""

    class Meta:
        model = Node
        # The admin adds the node's other editable fields (bmc_address, labels).
        fields = ["guest_bridge", "guest_subnet"]

    def clean(self):
        data = super().clean()
        bridge = data.get("guest_bridge", self.instance.guest_bridge) or ""
        subnet = data.get("guest_subnet", self.instance.guest_subnet) or ""
        node = self.instance if self.instance.pk else None
        changed = node is None or (bridge, subnet) != (node.guest_bridge, node.guest_subnet)
        if not changed:
            return data
        for field, problem in fleet.node_guest_network_problems(
            node=node, guest_bridge=bridge, guest_subnet=subnet
        ).items():
            self.add_error(field, problem)
        busy = fleet.node_guest_network_busy(node) if node is not None else ""
        if busy:
            self.add_error("guest_subnet", busy)
        return data


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    form = NodeAdminForm
    list_display = [
        "hostname",
        "cluster",
        "capacity_set",
        "gpu_model",
        "fabric",
        "gpu_count",
        "state",
        "guest_subnet",
    ]
    list_filter = ["cluster", "capacity_set", "fabric", "state", "gpu_model"]
    search_fields = ["hostname", "bmc_address", "guest_subnet"]
    list_select_related = ["cluster", "capacity_set"]
    readonly_fields = [
        "cluster",
        "capacity_set",
        "gpu_model",
        "fabric",
        "gpu_count",
        "state",
        "partitions",
        "fabric_partition_ids",
        # Dedicating warns other tenants' VMs first: the node page and the API do it.
        "dedicated_tenant",
    ]
    inlines = [GpuInline]


class GpuForm(forms.ModelForm):
    """A GPU's one editable field, its Fabric Manager module id, checked as the service checks
    it (the node is read-only here, so the form would not check the id is free on it)."""

    class Meta:
        model = Gpu
        fields = ["module_id"]

    def clean_module_id(self) -> int | None:
        module_id = self.cleaned_data["module_id"]
        others = Gpu.objects.filter(node=self.instance.node_id).exclude(pk=self.instance.pk)
        problem = module_id_problem(module_id) or module_ids_problem(
            dict(others.values_list("index", "module_id")) | {self.instance.index: module_id}
        )
        if problem:
            raise forms.ValidationError(problem)
        return module_id


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    form = GpuForm
    list_display = ["__str__", "uuid", "pci_address", "module_id", "health"]
    list_filter = ["health", "node__cluster"]
    search_fields = ["uuid", "node__hostname", "pci_address"]
    list_select_related = ["node"]
    readonly_fields = ["node", "index", "uuid", "pci_address", "health"]

    def has_add_permission(self, request) -> bool:
        return False  # GPUs are registered with their node

    def save_model(self, request, obj, form, change) -> None:
        # The module id is the one field edited here; the service checks and audits it.
        if change and "module_id" in form.changed_data:
            fleet.gpu_set_module_id(gpu=obj, module_id=obj.module_id, actor=request.user)


@admin.register(Pool)
class PoolAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "cluster", "capacity_set", "rank", "floor_gpus"]
    list_filter = ["kind", "cluster", "capacity_set"]
    search_fields = ["name"]
    list_select_related = ["cluster", "capacity_set"]
    readonly_fields = ["cluster", "capacity_set", "rank", "floor_gpus", "kind"]
    filter_horizontal = ["tenants"]


class ImageAdminForm(forms.ModelForm):
    """Checks an image with the catalogue's own rules, each problem next to its field."""

    class Meta:
        model = Image
        fields = ["cluster", "name", *IMAGE_FIELDS]

    def clean(self):
        data = super().clean()
        cluster = data.get("cluster") or getattr(self.instance, "cluster", None)
        if cluster is not None and not self.errors:
            values = {field: data.get(field, default) for field, default in IMAGE_FIELDS.items()}
            values["node_paths"] = values["node_paths"] or {}
            values["ports"] = values["ports"] or []
            for field, problem in image_problems(cluster=cluster, values=values).items():
                self.add_error(field, problem)
        return data


@admin.register(Image)
class ImageAdmin(admin.ModelAdmin):
    """The image catalogue; every save and delete goes through the fleet services (audited)."""

    form = ImageAdminForm
    list_display = ["name", "cluster", "default_user", "ports", "enabled", "updated_at"]
    list_filter = ["cluster", "enabled"]
    search_fields = ["name", "base_image", "description"]
    list_select_related = ["cluster"]

    def get_readonly_fields(self, request, obj=None):
        return ["cluster", "name"] if obj is not None else []

    def save_model(self, request, obj, form, change):
        values = {
            field: form.cleaned_data[field] for field in IMAGE_FIELDS if field in form.cleaned_data
        }
        if change:
            fleet.image_update(image=obj, actor=request.user, **values)
        else:
            created = fleet.image_create(
                cluster=obj.cluster, name=obj.name, actor=request.user, **values
            )
            obj.pk = created.pk

    def delete_model(self, request, obj):
        fleet.image_delete(image=obj, actor=request.user)

    def delete_queryset(self, request, queryset):
        for image in queryset:
            fleet.image_delete(image=image, actor=request.user)
