from django.apps import AppConfig


class UsageConfig(AppConfig):
    name = "gpucap.usage"
    verbose_name = "Usage"

    def ready(self) -> None:
        from gpucap.rentals.signals import vm_transitioned
        from gpucap.usage import receivers

        vm_transitioned.connect(receivers.usage_follow_vm, dispatch_uid="usage.usage_follow_vm")
