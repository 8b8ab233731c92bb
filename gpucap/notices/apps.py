from django.apps import AppConfig


class NoticesConfig(AppConfig):
    name = "gpucap.notices"
    verbose_name = "Interruption notices"

    def ready(self) -> None:
        from gpucap.fleet.signals import gpu_failed
        from gpucap.notices import receivers
        from gpucap.rentals.signals import guest_shut_down_early, vm_transitioned

        vm_transitioned.connect(
            receivers.notices_follow_vm, dispatch_uid="notices.notices_follow_vm"
        )
        guest_shut_down_early.connect(
            receivers.notice_ends_as_guest_shutdown,
            dispatch_uid="notices.notice_ends_as_guest_shutdown",
        )
        gpu_failed.connect(
            receivers.notices_follow_failed_gpu, dispatch_uid="notices.notices_follow_failed_gpu"
        )
