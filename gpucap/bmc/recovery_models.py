"""What recovery keeps (docs/bmc.md, Recovery): what each node's hypervisor last answered
(``HypervisorProbe``, written by the hypervisor watch). Imported by ``gpucap.bmc.models``, the
app's models module."""

from django.db import models
from django.db.models import F, Q

from gpucap.fleet.models import Node


class HypervisorProbe(models.Model):
    """The hypervisor watch's record of one node (``gpucap.bmc.hypervisor_watch``): when it last
    asked, when the hypervisor last answered, and since when it has not (null while it
    answers). A node whose hypervisor stays silent for ``NODE_DOWN_AFTER_SECONDS`` is marked
    down."""

    node = models.OneToOneField(Node, on_delete=models.CASCADE, related_name="hypervisor_probe")
    probed_at = models.DateTimeField(help_text="When the last probe recorded was sent.")
    answered_at = models.DateTimeField(
        null=True, blank=True, help_text="When a probe last got an answer."
    )
    silent_since = models.DateTimeField(
        null=True,
        blank=True,
        help_text="The first probe without an answer since the last answer; empty while the "
        "hypervisor answers, and while the node is down (recovery asks it then).",
    )

    class Meta:
        ordering = ["node_id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(silent_since__isnull=True) | Q(silent_since__lte=F("probed_at")),
                name="hypervisorprobe_silent_since_probed",
            ),
        ]

    def __str__(self) -> str:
        return f"hypervisor probe of {self.node.hostname}"
