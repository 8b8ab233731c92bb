from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "gpucap.fleet"
    verbose_name = "Fleet"
