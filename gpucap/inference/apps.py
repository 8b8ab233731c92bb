from django.apps import AppConfig


class InferenceConfig(AppConfig):
    name = "gpucap.inference"
    verbose_name = "Inference deployments"
