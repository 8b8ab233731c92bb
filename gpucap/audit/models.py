from django.conf import settings
from django.db import models


class AuditEvent(models.Model):
    """One change an operator, tenant or the system made: who, what verb, on which object,
    the state before and after, and when. Written by services only, never edited."""

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    actor_label = models.CharField(max_length=150, help_text="Username, or 'system'.")
    verb = models.CharField(max_length=64, db_index=True)
    object_type = models.CharField(max_length=64)
    object_id = models.CharField(max_length=64)
    object_label = models.CharField(max_length=200)
    before = models.JSONField(default=dict, blank=True)
    after = models.JSONField(default=dict, blank=True)
    message = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["object_type", "object_id"])]

    def __str__(self) -> str:
        when = f"{self.created_at:%Y-%m-%d %H:%M:%S}"
        return f"{when} {self.actor_label} {self.verb} {self.object_label}"
