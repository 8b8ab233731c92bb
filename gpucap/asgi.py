import os

from django.conf import settings
from django.core.asgi import get_asgi_application
from django.core.exceptions import ImproperlyConfigured

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucap.settings")
django_application = get_asgi_application()

if settings.DATABASES["default"]["CONN_MAX_AGE"] != 0:
    # Django's documentation: persistent connections leak under ASGI. Each request's sync code
    # runs in a thread of its own, whose connection outlives the request: two web processes
    # held 37-48 of PostgreSQL's 100 connections, and then tasks failed with "too many clients".
    raise ImproperlyConfigured(
        f"DATABASE_CONN_MAX_AGE={settings.DATABASES['default']['CONN_MAX_AGE']}: gpucap's web "
        "process is served by ASGI, where persistent database connections leak; set "
        "DATABASE_CONN_MAX_AGE=0 (the default) and pool with PgBouncer in front of PostgreSQL "
        "if connecting per request costs too much (README: Database connections)"
    )

# Imported once Django is set up. The hot paths answer before Django's middleware, each from
# Redis alone: the instance metadata endpoint every guest polls (gpucap/notices/metadata.py),
# the inference router (gpucap/inference/router.py) and the model simulator the simulated
# driver's inference replicas serve (gpucap/drivers/model_simulator.py). They share their
# plumbing in gpucap/edge: reading a body, sending an answer, and their clients, one per event
# loop. The metadata front answers the lifespan for all of them: its shutdown closes every
# app's clients of the loop (gpucap.edge.loops) before it says the shutdown is complete.
from django.conf import settings  # noqa: E402

from gpucap.drivers import model_simulator  # noqa: E402
from gpucap.inference import router  # noqa: E402
from gpucap.notices.metadata import metadata_front  # noqa: E402

_metadata_or_django = metadata_front(django_application)


async def application(scope, receive, send):
    if scope["type"] == "http":
        path = scope["path"]
        if path.startswith(router.PREFIX):
            await router.router_app(scope, receive, send)
            return
        # The simulator answers anyone, so it is mounted only where SIMULATOR_ENABLED says
        # (development, the demo, the tests that serve replicas); elsewhere Django answers 404.
        if settings.SIMULATOR_ENABLED and path.startswith(model_simulator.PREFIX):
            await model_simulator.model_simulator_app(scope, receive, send)
            return
    await _metadata_or_django(scope, receive, send)
