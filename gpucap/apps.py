from django.apps import AppConfig


class GpucapConfig(AppConfig):
    """The project itself: loads the Celery app so ``shared_task``s bind to it."""

    name = "gpucap"
    verbose_name = "gpucap"

    def ready(self) -> None:
        from gpucap import celery  # noqa: F401
