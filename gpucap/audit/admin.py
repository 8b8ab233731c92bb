from django.contrib import admin

from gpucap.audit.models import AuditEvent


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows the admin shows and never changes: what services write, and nothing else may."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    """The audit log is append-only: readable here, never editable."""

    list_display = ["created_at", "actor_label", "verb", "object_type", "object_label"]
    list_filter = ["verb", "object_type"]
    search_fields = ["actor_label", "object_label", "message"]
    date_hierarchy = "created_at"
