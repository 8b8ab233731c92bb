from django.conf import settings
from django.db import models
from django.db.models.functions import Lower


class Tenant(models.Model):
    """A customer account. Users reach it through memberships."""

    name = models.CharField(max_length=200, unique=True)
    slug = models.SlugField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        ADMIN = "admin", "Admin"
        MEMBER = "member", "Member"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant__name", "user__username"]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "tenant"], name="membership_user_tenant_unique"
            ),
            models.CheckConstraint(
                condition=models.Q(role__in=["admin", "member"]), name="membership_role_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} ({self.role})"


class Invitation(models.Model):
    """An invitation to join a tenant, mailed to an address. Its token is in that mail and
    nowhere else (only its hash is stored), so only whoever reads the mailbox can accept it:
    nobody becomes a member, and no account gets a password, without its owner's consent."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(
        max_length=16, choices=Membership.Role.choices, default=Membership.Role.MEMBER
    )
    token_hash = models.CharField(max_length=64, unique=True)  # SHA-256 of the token, hex
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # One open invitation per address and tenant: inviting again replaces it.
            models.UniqueConstraint(
                Lower("email"),
                "tenant",
                condition=models.Q(accepted_at=None, revoked_at=None),
                name="invitation_one_open_per_address",
            ),
            models.CheckConstraint(
                condition=models.Q(role__in=["admin", "member"]), name="invitation_role_valid"
            ),
            models.CheckConstraint(
                condition=models.Q(accepted_at=None) | models.Q(revoked_at=None),
                name="invitation_accepted_or_revoked_not_both",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.email} to {self.tenant} ({self.role})"

    def is_open(self, now) -> bool:
        return self.accepted_at is None and self.revoked_at is None and now < self.expires_at
