from django.apps import AppConfig


class BmcConfig(AppConfig):
    name = "gpucap.bmc"
    verbose_name = "Bare metal (BMC)"

    def ready(self) -> None:
        from gpucap.bmc import bare_metal, bare_metal_tasks, receivers  # noqa: F401  (tasks register)
        from gpucap.fleet.signals import (
            node_dedication_changing,
            node_state_changing,
            node_went_down,
        )

        node_went_down.connect(
            receivers.recovery_follows_node_down, dispatch_uid="bmc.recovery_follows_node_down"
        )
        node_state_changing.connect(
            bare_metal.node_stays_out_of_service, dispatch_uid="bmc.node_stays_out_of_service"
        )
        node_dedication_changing.connect(
            bare_metal.node_stays_dedicated, dispatch_uid="bmc.node_stays_dedicated"
        )
