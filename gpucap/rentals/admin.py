"""Read-mostly admin aids for operators. A VM changes state only through the lifecycle service
(the pages and the API), never by editing a row here: a hand-edited state would skip the GPU
release, the usage interval and the audit event that go with it."""

import re

from django.contrib import admin

from gpucap.rentals.models import Allocation, GuestAddress, VirtualMachine


class AllocationInline(admin.TabularInline):
    model = Allocation
    extra = 0
    fields = ["gpu", "created_at", "released_at"]
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False


class GuestAddressInline(admin.TabularInline):
    model = GuestAddress
    extra = 0
    fields = ["address", "mac", "node", "created_at", "released_at"]
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(VirtualMachine)
class VirtualMachineAdmin(admin.ModelAdmin):
    list_display = [
        "__str__",
        "tenant",
        "pool",
        "state",
        "gpu_count",
        "node",
        "ip_address",
        "requested_at",
    ]
    list_filter = ["state", "role", "pool", "tenant"]
    search_fields = ["name", "job", "ip_address", "tenant__slug", "node__hostname"]
    list_select_related = ["tenant", "pool", "node"]
    readonly_fields = [field.name for field in VirtualMachine._meta.fields if field.name != "id"]
    inlines = [AllocationInline, GuestAddressInline]

    def get_search_results(self, request, queryset, search_term):
        """An instance id as guests and the API show it (``vm-42``, or just ``42``) finds that
        VM."""
        instance = re.fullmatch(r"(?:vm-)?(\d{1,18})", search_term.strip())
        if instance:
            return queryset.filter(pk=int(instance[1])), False
        return super().get_search_results(request, queryset, search_term)

    def has_add_permission(self, request) -> bool:
        return False  # tenants request VMs through the pages or the API

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # terminate instead; the row stays for usage and audit


@admin.register(Allocation)
class AllocationAdmin(admin.ModelAdmin):
    list_display = ["vm", "gpu", "created_at", "released_at"]
    list_filter = [("released_at", admin.EmptyFieldListFilter), "gpu__node__cluster"]
    search_fields = ["vm__name", "gpu__node__hostname", "gpu__uuid"]
    list_select_related = ["vm", "gpu__node"]
    readonly_fields = ["vm", "gpu", "created_at", "released_at"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(GuestAddress)
class GuestAddressAdmin(admin.ModelAdmin):
    """Which VM had which address when: what an abuse report about an address needs."""

    list_display = ["address", "mac", "vm", "node", "created_at", "released_at"]
    list_filter = [("released_at", admin.EmptyFieldListFilter), "node__cluster"]
    search_fields = ["address", "mac", "vm__name", "node__hostname"]
    list_select_related = ["vm", "node"]
    readonly_fields = ["vm", "node", "address", "mac", "created_at", "released_at"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
