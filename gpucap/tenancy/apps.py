from django.apps import AppConfig


class TenancyConfig(AppConfig):
    name = "gpucap.tenancy"
    verbose_name = "Tenancy"
