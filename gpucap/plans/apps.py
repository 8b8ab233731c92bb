from django.apps import AppConfig


class PlansConfig(AppConfig):
    name = "gpucap.plans"
    verbose_name = "Capacity plans"

    def ready(self) -> None:
        from gpucap.fleet.signals import capacity_set_changed
        from gpucap.plans import receivers, waiting
        from gpucap.rentals import waiting as rentals_waiting
        from gpucap.rentals.signals import vm_transitioned

        capacity_set_changed.connect(
            receivers.plans_follow_set, dispatch_uid="plans.plans_follow_set"
        )
        vm_transitioned.connect(receivers.plans_follow_vm, dispatch_uid="plans.plans_follow_vm")
        rentals_waiting.waiting_source_set(waiting.waiting_dicts)
