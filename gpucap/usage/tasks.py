from celery import shared_task
from django.utils import timezone

from gpucap.usage import services


@shared_task(name="usage.record")
def record() -> int:
    """End intervals whose attribution changed, then make the usage records whose periods or
    intervals have ended (beat, every minute)."""
    now = timezone.now()
    services.usage_reattribute(now=now)
    return services.usage_record(now=now)


@shared_task(name="usage.billing_push")
def billing_push() -> list[str]:
    """Push the records the receiver has not accepted yet, batch after batch (beat)."""
    return [result.outcome for result in services.billing_push_backlog()]
