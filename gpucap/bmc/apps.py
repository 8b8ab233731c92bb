from django.apps import AppConfig


class BmcConfig(AppConfig):
    name = "gpucap.bmc"
    verbose_name = "Bare metal (BMC)"
