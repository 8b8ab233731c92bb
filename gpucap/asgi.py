import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucap.settings")
django_application = get_asgi_application()

# Imported once Django is set up. The hot paths answer before Django's middleware, each from
# Redis alone: the instance metadata endpoint every guest polls (gpucap/notices/metadata.py),
# the inference router (gpucap/inference/router.py) and the model simulator the simulated
# driver's inference replicas serve (gpucap/drivers/model_simulator.py).
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
    elif scope["type"] == "lifespan":
        receive = _closing_clients_at_shutdown(receive)
    await _metadata_or_django(scope, receive, send)


def _closing_clients_at_shutdown(receive):
    """The metadata front answers the lifespan; the router's and the simulator's clients of
    this event loop close before it says the shutdown is complete."""

    async def wrapped():
        message = await receive()
        if message["type"] == "lifespan.shutdown":
            await router.clients_close()
            await model_simulator.clients_close()
        return message

    return wrapped
