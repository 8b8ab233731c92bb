from django.apps import AppConfig


class UsageConfig(AppConfig):
    name = "gpucap.usage"
    verbose_name = "Usage"

    def ready(self) -> None:
        from django.db.models.signals import post_delete

        from gpucap.allocation.models import Reservation
        from gpucap.bmc.signals import bare_metal_rental_changed
        from gpucap.fleet.signals import node_dedication_changed
        from gpucap.rentals.signals import vm_transitioned
        from gpucap.usage import receivers

        vm_transitioned.connect(receivers.usage_follow_vm, dispatch_uid="usage.usage_follow_vm")
        node_dedication_changed.connect(
            receivers.usage_follow_dedication, dispatch_uid="usage.usage_follow_dedication"
        )
        bare_metal_rental_changed.connect(
            receivers.usage_follow_bare_metal, dispatch_uid="usage.usage_follow_bare_metal"
        )
        post_delete.connect(
            receivers.usage_follow_reservation_deleted,
            sender=Reservation,
            dispatch_uid="usage.usage_follow_reservation_deleted",
        )
