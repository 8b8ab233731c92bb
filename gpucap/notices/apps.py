from django.apps import AppConfig


class NoticesConfig(AppConfig):
    name = "gpucap.notices"
    verbose_name = "Interruption notices"
