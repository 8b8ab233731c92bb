from django.apps import AppConfig


class UsageConfig(AppConfig):
    name = "gpucap.usage"
    verbose_name = "Usage"
