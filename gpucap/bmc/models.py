"""What gpucap keeps to speak to a node's BMC (docs/bmc.md, Models).

The BMC's address is the node's ``bmc_address`` (the fleet file and the API carry it); this app
adds how to log in, sealed, and whether to verify its certificate. The whole machines it rents
to tenants are ``gpucap.bmc.bare_metal_models``' (imported at the end, so the app has them).
"""

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from gpucap.fleet.models import Node


class BmcCredential(models.Model):
    """How gpucap logs in to one node's BMC. The password is sealed (``gpucap.bmc.passwords``)
    and never shown back: not by the API, a page, the audit log or ``repr``."""

    node = models.OneToOneField(Node, on_delete=models.CASCADE, related_name="bmc_credential")
    username = models.CharField(max_length=128)
    password_sealed = models.TextField(editable=False)
    verify_tls = models.BooleanField(
        default=True,
        help_text="Verify the BMC's TLS certificate. Off only for a BMC whose certificate cannot "
        "be verified; the node's page says so.",
    )
    system_id = models.CharField(
        max_length=64,
        blank=True,
        help_text="The Redfish ComputerSystem id when the BMC manages several; empty: its only "
        "one.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["node_id"]
        constraints = [
            models.CheckConstraint(condition=~Q(username=""), name="bmccredential_username_given"),
            models.CheckConstraint(
                condition=~Q(password_sealed=""), name="bmccredential_password_given"
            ),
            models.CheckConstraint(
                condition=Q(system_id__regex=r"^[A-Za-z0-9._-]*$"),
                name="bmccredential_system_id_format",
            ),
        ]

    def __str__(self) -> str:
        return f"BMC of {self.node.hostname}"

    def __repr__(self) -> str:
        return f"<BmcCredential node={self.node_id} user={self.username!r} password=(sealed)>"


class NodeInventory(models.Model):
    """What the node's BMC said at the last discovery that changed something: the machine, its
    CPUs, memory, NICs and GPUs (``SystemInventory`` as JSON, without the power state, which is
    live state). The GPUs' UUID, PCI address and health live on the fleet's ``Gpu`` rows, which
    placement reads; the serials, models and the BMC's own health words are kept here."""

    node = models.OneToOneField(Node, on_delete=models.CASCADE, related_name="bmc_inventory")
    facts = models.JSONField()
    read_at = models.DateTimeField()

    class Meta:
        ordering = ["node_id"]
        verbose_name_plural = "node inventories"

    def __str__(self) -> str:
        return f"inventory of {self.node.hostname}"


class DiscoveryRun(models.Model):
    """One discovery asked for through the API or a node's page (docs/bmc.md, "Discovery
    through the API and the node page"): the BMCs read by a worker (``bmc.discover``), the
    changes previewed, then, when an operator applies it, read again and applied only if the
    changes are still the previewed ones (``digest``); otherwise refused, with the fresh
    preview as a run of its own (``fresh_run``). A preview not applied within
    ``BMC_DISCOVERY_PREVIEW_TTL_SECONDS`` expires.

    ``entries`` never hold a password. The passwords given with the entries wait for the apply
    sealed (``gpucap.bmc.passwords``), one token per entry in ``passwords_sealed`` ("" for a
    node's entry, which reads the node's stored credentials each time), and are dropped when
    the run ends."""

    class State(models.TextChoices):
        READING = "reading", "Reading the BMCs"
        PREVIEWED = "previewed", "Previewed"
        APPLYING = "applying", "Applying"
        APPLIED = "applied", "Applied"
        REFUSED = "refused", "Refused: the BMCs changed since the preview"
        FAILED = "failed", "Problems: nothing applied"
        EXPIRED = "expired", "Expired: discover again"

    ACTIVE = (State.READING, State.APPLYING)
    ENDED = (State.APPLIED, State.REFUSED, State.FAILED, State.EXPIRED)

    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    applied_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    node = models.ForeignKey(
        Node,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="discovery_runs",
        help_text="A node's Rediscover: the node, read with its stored credentials.",
    )
    state = models.CharField(max_length=16, choices=State.choices, default=State.READING)
    entries = models.JSONField(default=list, help_text="The entries as given, no password.")
    passwords_sealed = models.JSONField(default=list, blank=True, editable=False)
    changes = models.JSONField(
        default=list, blank=True, help_text="[{verb, noun, label, detail}], as fleet_apply's."
    )
    unchanged = models.PositiveIntegerField(default=0)
    problems = models.JSONField(default=list, blank=True)
    digest = models.CharField(
        max_length=64, blank=True, help_text="SHA-256 of the previewed changes."
    )
    fresh_run = models.OneToOneField(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="stale_run",
        help_text="Refused: the preview of what the BMCs said at the apply.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    read_at = models.DateTimeField(null=True, blank=True)
    apply_requested_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # A run whose worker or message was lost shows no progress: the beat's
    # bmc.discoveries_recover sends it again, or fails it (gpucap.bmc.discovery_upkeep).
    progress_at = models.DateTimeField(
        default=timezone.now,
        help_text="When the run last showed progress: its task sent, or a BMC read.",
    )
    sends = models.PositiveSmallIntegerField(
        default=1, help_text="How often its task was sent for the state it is in."
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["node", "-created_at"])]
        constraints = [
            models.CheckConstraint(
                condition=Q(
                    state__in=[
                        "reading",
                        "previewed",
                        "applying",
                        "applied",
                        "refused",
                        "failed",
                        "expired",
                    ]
                ),
                name="discoveryrun_state_valid",
            ),
            # What can be applied, or was, has the digest of what was previewed.
            models.CheckConstraint(
                condition=~Q(state__in=["previewed", "applying", "applied"]) | ~Q(digest=""),
                name="discoveryrun_previewed_has_digest",
            ),
            models.CheckConstraint(
                condition=Q(fresh_run__isnull=True) | Q(state="refused"),
                name="discoveryrun_fresh_run_only_when_refused",
            ),
            # A run that ended keeps no password, not even sealed.
            models.CheckConstraint(
                condition=~Q(state__in=["applied", "refused", "failed", "expired"])
                | Q(passwords_sealed=[]),
                name="discoveryrun_ended_keeps_no_password",
            ),
        ]

    def __str__(self) -> str:
        return f"discovery {self.pk} ({self.state})"

    def __repr__(self) -> str:
        return f"<DiscoveryRun {self.pk} state={self.state} entries={len(self.entries)}>"


class Provisioning(models.Model):
    """One boot of a node from an installer or OS image by virtual media (docs/bmc.md,
    "Provisioning by virtual media"): the image inserted in the BMC's CD/DVD drive, a one-time
    boot from it, a reset, then a wait for the node's hypervisor to answer, until ``deadline``.
    A node has at most one in progress; the finished ones are its history. Changed by
    ``gpucap.bmc.provisioning`` alone, each step a conditional update on ``state``."""

    class State(models.TextChoices):
        INSERTING = "inserting", "Inserting the image"
        BOOTING = "booting", "Booting from it"
        WAITING = "waiting", "Waiting for the hypervisor"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    ACTIVE = (State.INSERTING, State.BOOTING, State.WAITING)

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="provisionings")
    image_url = models.URLField(max_length=2000)
    state = models.CharField(max_length=16, choices=State.choices, default=State.INSERTING)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    started_at = models.DateTimeField()
    deadline = models.DateTimeField()
    inserted_at = models.DateTimeField(
        null=True, blank=True, help_text="When the BMC accepted the image."
    )
    # Claimed before the reset is asked for, so that a retried step never resets twice.
    reset_at = models.DateTimeField(null=True, blank=True)
    reset_type = models.CharField(max_length=16, blank=True, help_text="ForceRestart or On.")
    answered_at = models.DateTimeField(
        null=True, blank=True, help_text="When the node's hypervisor answered."
    )
    finished_at = models.DateTimeField(null=True, blank=True)
    message = models.TextField(blank=True)
    # A tenant's re-image of a machine rented whole (gpucap.bmc.bare_metal): no hypervisor will
    # answer there, so the image stays in the drive for its installer until the deadline, and
    # the run is done then.
    bare_metal_rental = models.ForeignKey(
        "bmc.BareMetalRental",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="provisionings",
        help_text="The rental whose tenant re-images the machine; empty: an operator's run.",
    )

    class Meta:
        ordering = ["-started_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=["inserting", "booting", "waiting", "done", "failed"]),
                name="provisioning_state_valid",
            ),
            models.UniqueConstraint(
                fields=["node"],
                condition=Q(state__in=["inserting", "booting", "waiting"]),
                name="provisioning_one_in_progress_per_node",
            ),
            models.CheckConstraint(
                condition=Q(state__in=["done", "failed"], finished_at__isnull=False)
                | Q(state__in=["inserting", "booting", "waiting"], finished_at__isnull=True),
                name="provisioning_finished_when_over",
            ),
            models.CheckConstraint(
                condition=Q(deadline__gt=models.F("started_at")),
                name="provisioning_deadline_after_start",
            ),
        ]

    def __str__(self) -> str:
        return f"provisioning of {self.node.hostname} from {self.image_url}"

    @property
    def in_progress(self) -> bool:
        return self.state in self.ACTIVE


# Recovery's models live in a module of their own; Django finds them through this import.
# The models of whole machines rented to tenants live in a module of their own; imported here,
# they are the app's models like the rest.
from gpucap.bmc.bare_metal_models import (  # noqa: E402, F401
    BareMetalImage,
    BareMetalPowerAction,
    BareMetalRental,
)
from gpucap.bmc.recovery_models import (  # noqa: E402, F401
    HypervisorProbe,
    NodeRecovery,
    RecoveryAttempt,
    RecoveryPolicy,
)
