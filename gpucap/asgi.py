import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucap.settings")
django_application = get_asgi_application()

# Imported once Django is set up. The hot paths answer before Django's middleware, each from
# Redis alone: the instance metadata endpoint every guest polls (gpucap/notices/metadata.py),
# the inference router (gpucap/inference/router.py) and the model simulator the simulated
# driver's inference replicas serve (gpucap/drivers/model_simulator.py). They share their
# plumbing in gpucap/edge: reading a body, sending an answer, and their clients, one per event
# loop. The metadata front answers the lifespan for all of them: its shutdown closes every
# app's clients of the loop (gpucap.edge.loops) before it says the shutdown is complete.
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
        if path.startswith(model_simulator.PREFIX):
            await model_simulator.model_simulator_app(scope, receive, send)
            return
    await _metadata_or_django(scope, receive, send)
