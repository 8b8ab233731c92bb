"""Read-only admin views of stored plans: a plan is history, changed only by the planning
services (approve, enforcement, supersede), never by editing a row here."""

from django.contrib import admin

from gpucap.plans.models import Plan, PlanAction


class PlanActionInline(admin.TabularInline):
    model = PlanAction
    extra = 0
    fields = ["kind", "position", "vm", "for_vm", "tenant", "pool", "node", "gpus", "reason"]
    fields += ["progress"]
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    list_display = ["__str__", "status", "mode", "complete", "placements", "preemptions"]
    list_display += ["unsatisfied", "created_at", "approved_by"]
    list_filter = ["status", "mode", "trigger", "capacity_set"]
    list_select_related = ["capacity_set", "approved_by"]
    readonly_fields = [field.name for field in Plan._meta.fields if field.name != "id"]
    inlines = [PlanActionInline]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
