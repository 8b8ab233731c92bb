"""The Celery app. Broker is Redis (REDIS_URL / CELERY_BROKER_URL); the beat schedule lives in
settings (CELERY_BEAT_SCHEDULE) so it is code, reviewed like code."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucap.settings")

app = Celery("gpucap")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
