from django.apps import AppConfig


class RentalsConfig(AppConfig):
    name = "gpucap.rentals"
    verbose_name = "Rentals"

    def ready(self) -> None:
        from gpucap.fleet.signals import node_went_down
        from gpucap.rentals import receivers

        node_went_down.connect(
            receivers.vms_follow_node_down, dispatch_uid="rentals.vms_follow_node_down"
        )
