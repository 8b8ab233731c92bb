from celery import shared_task

from gpucap.usage import services


@shared_task(name="usage.record")
def record() -> int:
    """Make the usage records whose periods or intervals have ended (beat, every minute)."""
    return services.usage_record()
