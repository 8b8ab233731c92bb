from django.apps import AppConfig


class SchedulesConfig(AppConfig):
    name = "gpucap.schedules"
    verbose_name = "Scheduled policies"
