from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "gpucap.audit"
    verbose_name = "Audit log"
