"""Inference deployments (one model served by replica VMs behind the router) and their API keys.

A replica is a `VirtualMachine` with role ``inference_replica`` and ``deployment`` set; it goes
through the same lifecycle as any VM. An API key is stored as a visible prefix plus a salted
SHA-256 of its secret (the secret is shown once, at creation, and never stored).
"""

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from gpucap.fleet.models import Pool
from gpucap.tenancy.models import Tenant

MAX_REPLICAS = 64


class InferenceDeployment(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="deployments")
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="deployments")
    name = models.CharField(max_length=63)
    slug = models.SlugField(
        max_length=63, unique=True, help_text="In the router's path: /inference/<slug>/v1/."
    )
    model_name = models.CharField(
        max_length=200, help_text="The model id clients ask for, e.g. meta-llama/Llama-3.1-8B."
    )
    gpus_per_replica = models.PositiveSmallIntegerField()
    min_replicas = models.PositiveSmallIntegerField(default=1)
    max_replicas = models.PositiveSmallIntegerField(default=1)
    target_in_flight = models.PositiveSmallIntegerField(
        default=4, help_text="Requests in flight per replica the autoscaler aims at."
    )
    replica_concurrency = models.PositiveSmallIntegerField(
        default=8, help_text="Requests one replica is sent at once; more wait in the queue."
    )
    queue_limit = models.PositiveIntegerField(
        default=64, help_text="Requests that may wait for a replica; beyond it the router says 429."
    )
    scale_down_cooldown_seconds = models.PositiveIntegerField(default=300)
    # The autoscaler's memory: since when fewer replicas would do (None: not so now).
    scale_down_since = models.DateTimeField(null=True, blank=True)
    last_scaled_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant__slug", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="deployment_name_per_tenant"),
            models.CheckConstraint(
                condition=Q(min_replicas__lte=F("max_replicas")),
                name="deployment_min_at_most_max",
            ),
            models.CheckConstraint(
                condition=Q(max_replicas__gte=1) & Q(max_replicas__lte=MAX_REPLICAS),
                name="deployment_max_replicas_range",
            ),
            models.CheckConstraint(
                condition=Q(gpus_per_replica__gte=1) & Q(gpus_per_replica__lte=8),
                name="deployment_gpus_per_replica_range",
            ),
            models.CheckConstraint(
                condition=Q(target_in_flight__gte=1)
                & Q(replica_concurrency__gte=F("target_in_flight")),
                name="deployment_concurrency_at_least_target",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.slug} ({self.model_name})"


class ApiKey(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    deployment = models.ForeignKey(
        InferenceDeployment,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="api_keys",
        help_text="The one deployment the key opens; empty: every deployment of its tenant.",
    )
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True, help_text="Shown; finds the key.")
    salt = models.CharField(max_length=32)
    digest = models.CharField(max_length=64, help_text="SHA-256 of salt and secret, hex.")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"
