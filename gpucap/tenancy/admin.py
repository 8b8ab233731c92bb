from django.contrib import admin

from gpucap.tenancy.forms import AdminLoginForm
from gpucap.tenancy.models import Invitation, Membership, Tenant

# /admin/login/ counts wrong passwords with /login/ (gpucap.tenancy.password_attempts).
admin.site.login_form = AdminLoginForm


class ReadOnlyMemberships:
    """Memberships change on the members page (invitations a mailbox's owner accepts) or through
    a fleet file, both audited and mailed to the member; never silently here."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class MembershipInline(ReadOnlyMemberships, admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "created_at"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(ReadOnlyMemberships, admin.ModelAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", "tenant"]
    search_fields = ["user__username", "user__email", "tenant__name"]
    list_select_related = ["user", "tenant"]
    autocomplete_fields = ["user"]


@admin.register(Invitation)
class InvitationAdmin(admin.ModelAdmin):
    """Read-only: invitations are sent, accepted and withdrawn on the members page."""

    list_display = ["email", "tenant", "role", "invited_by", "created_at", "expires_at"]
    list_filter = ["tenant"]
    search_fields = ["email", "tenant__name"]
    list_select_related = ["tenant", "invited_by"]
    exclude = ["token_hash"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
