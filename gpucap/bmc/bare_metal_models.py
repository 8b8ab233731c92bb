"""Whole machines rented to tenants (docs/bmc.md, "Whole machines for tenants"): a cluster's
bare-metal catalogue, the rentals, and the tenants' power actions. Models of the BMC app
(``gpucap.bmc.models`` imports them)."""

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from gpucap.fleet.models import IMAGE_NAME_PATTERN, Cluster, Node
from gpucap.tenancy.models import Tenant


class BareMetalImage(models.Model):
    """An installer or OS image of a cluster's bare-metal catalogue: what a tenant renting a
    whole machine of the cluster may re-image it with, by virtual media (``image_url``, an ISO
    the BMC fetches over HTTP(S))."""

    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="bare_metal_images")
    name = models.CharField(
        max_length=64,
        help_text="What tenants choose, e.g. ubuntu-24.04-server: lowercase letters, digits, "
        "'.', '_' and '-', starting and ending with a letter or digit.",
    )
    image_url = models.URLField(
        max_length=500, help_text="The installer or OS image (an ISO) the BMC boots from."
    )
    description = models.TextField(blank=True)
    enabled = models.BooleanField(
        default=True,
        help_text="Offered to tenants; a disabled image stays on the rentals it is on.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cluster__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="baremetalimage_name_unique"),
            models.CheckConstraint(
                condition=Q(name__regex=IMAGE_NAME_PATTERN), name="baremetalimage_name_format"
            ),
            models.CheckConstraint(
                condition=Q(image_url__regex=r"^https?://[^\s]+$"),
                name="baremetalimage_image_url_http",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class BareMetalRental(models.Model):
    """A whole node rented to the tenant it is dedicated to, from ``started_at`` until
    ``ended_at`` (open while null): the node takes no VM placements meanwhile (it is cordoned),
    the tenant switches its power and re-images it through gpucap, and usage counts all its GPUs
    as held. The BMC's address and credentials stay the operators'."""

    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="bare_metal_rentals")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="bare_metal_rentals")
    image = models.ForeignKey(
        BareMetalImage,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="rentals",
        help_text="The catalogue image last installed through gpucap; empty: as handed over.",
    )
    started_at = models.DateTimeField()
    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    ended_at = models.DateTimeField(null=True, blank=True)
    ended_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    power_state = models.CharField(
        max_length=16,
        blank=True,
        help_text="The machine's power as its BMC last said (on, off, poweringon, poweringoff); "
        "empty: not read yet.",
    )
    power_read_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["node"],
                condition=Q(ended_at__isnull=True),
                name="baremetalrental_one_open_per_node",
            ),
            models.CheckConstraint(
                condition=Q(ended_at__isnull=True) | Q(ended_at__gte=F("started_at")),
                name="baremetalrental_ends_after_start",
            ),
        ]

    def __str__(self) -> str:
        return f"bare-metal rental {self.pk} ({self.node.hostname})"

    @property
    def active(self) -> bool:
        return self.ended_at is None


class BareMetalPowerAction(models.Model):
    """A tenant's power on, off or reset of a rented machine, carried out by a Celery task
    (``bmc.bare_metal_power``) through the BMC: ``queued`` -> ``sending`` (the task is asking
    the BMC) -> ``sent`` (the BMC accepted it; waiting for the machine's power to follow) ->
    ``done``, or ``failed`` at any step with what happened in ``message``. One at a time per
    rental (a database constraint)."""

    class Action(models.TextChoices):
        ON = "on", "Power on"
        OFF = "off", "Power off"
        RESET = "reset", "Reset"

    class State(models.TextChoices):
        QUEUED = "queued", "Queued"
        SENDING = "sending", "Sending"
        SENT = "sent", "Sent"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    UNDER_WAY = (State.QUEUED, State.SENDING, State.SENT)

    rental = models.ForeignKey(
        BareMetalRental, on_delete=models.CASCADE, related_name="power_actions"
    )
    action = models.CharField(max_length=8, choices=Action.choices)
    state = models.CharField(max_length=8, choices=State.choices, default=State.QUEUED)
    message = models.TextField(
        blank=True, help_text="What happened, in the tenant's words: never the BMC's address."
    )
    bmc_error = models.TextField(
        blank=True, help_text="The BMC's own error, for operators (it names the BMC's address)."
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    requested_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-requested_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["rental"],
                condition=Q(state__in=["queued", "sending", "sent"]),
                name="baremetalpoweraction_one_under_way",
            ),
            models.CheckConstraint(
                condition=Q(action__in=["on", "off", "reset"]),
                name="baremetalpoweraction_action_valid",
            ),
            models.CheckConstraint(
                condition=Q(state__in=["queued", "sending", "sent", "done", "failed"]),
                name="baremetalpoweraction_state_valid",
            ),
            models.CheckConstraint(
                condition=Q(finished_at__isnull=True) | Q(state__in=["done", "failed"]),
                name="baremetalpoweraction_finished_when_over",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_action_display()} of {self.rental}"

    @property
    def under_way(self) -> bool:
        return self.state in self.UNDER_WAY
