"""What gpucap keeps to speak to a node's BMC (docs/bmc.md, Models).

The BMC's address is the node's ``bmc_address`` (the fleet file and the API carry it); this app
adds how to log in, sealed, and whether to verify its certificate.
"""

from django.db import models
from django.db.models import Q

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


# Recovery's models live in a module of their own; Django finds them through this import.
from gpucap.bmc.recovery_models import (  # noqa: E402, F401
    HypervisorProbe,
    NodeRecovery,
    RecoveryAttempt,
    RecoveryPolicy,
)
