"""Usage intervals are written by the VM lifecycle and read by billing: the admin only shows
them."""

from django.contrib import admin

from gpucap.audit.admin import ReadOnlyAdmin
from gpucap.usage.models import BillingDelivery, UsageInterval


@admin.register(UsageInterval)
class UsageIntervalAdmin(ReadOnlyAdmin):
    list_display = [
        "vm",
        "tenant",
        "pool_kind",
        "gpu_model",
        "gpu_count",
        "started_at",
        "ended_at",
    ]
    list_filter = ["pool_kind", "gpu_model", "tenant", ("ended_at", admin.EmptyFieldListFilter)]
    search_fields = ["vm__name", "tenant__slug"]
    list_select_related = ["vm", "tenant"]
    date_hierarchy = "started_at"


@admin.register(BillingDelivery)
class BillingDeliveryAdmin(ReadOnlyAdmin):
    """Deliveries to the billing webhook, read-only; its settings are on /usage/billing/, where
    changes are validated and audited."""

    list_display = ["at", "batch_id", "record_count", "attempt", "accepted", "status_code", "error"]
    list_filter = ["accepted", "status_code"]
    search_fields = ["batch_id", "error"]
    date_hierarchy = "at"
