from django.apps import AppConfig


class PlansConfig(AppConfig):
    name = "gpucap.plans"
    verbose_name = "Capacity plans"

    def ready(self) -> None:
        from gpucap.plans import receivers
        from gpucap.rentals.signals import vm_transitioned

        vm_transitioned.connect(receivers.plans_follow_vm, dispatch_uid="plans.plans_follow_vm")
