from django.apps import AppConfig


class PlansConfig(AppConfig):
    name = "gpucap.plans"
    verbose_name = "Capacity plans"
