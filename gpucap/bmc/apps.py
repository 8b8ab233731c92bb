from django.apps import AppConfig


class BmcConfig(AppConfig):
    name = "gpucap.bmc"
    verbose_name = "Bare metal (BMC)"

    def ready(self) -> None:
        from gpucap.bmc import receivers
        from gpucap.fleet.signals import node_went_down

        node_went_down.connect(
            receivers.recovery_follows_node_down, dispatch_uid="bmc.recovery_follows_node_down"
        )
