from django.apps import AppConfig


class InferenceConfig(AppConfig):
    name = "gpucap.inference"
    verbose_name = "Inference deployments"

    def ready(self) -> None:
        from gpucap.inference import receivers
        from gpucap.rentals.signals import vm_transitioned

        vm_transitioned.connect(
            receivers.inference_follow_vm, dispatch_uid="inference.inference_follow_vm"
        )
