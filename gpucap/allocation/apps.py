from django.apps import AppConfig


class AllocationConfig(AppConfig):
    name = "gpucap.allocation"
    verbose_name = "Tenant allocation"
