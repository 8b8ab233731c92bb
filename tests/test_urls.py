"""Pages and the raw ASGI apps in front of Django never share a prefix: a page under the
router's /inference/ would answer every browser with the router's JSON 401."""

from gpucap.drivers import model_simulator
from gpucap.inference import router
from gpucap.notices.metadata import PREFIXES
from tests.routes import routes


def test_no_page_sits_under_a_prefix_the_asgi_apps_answer_in_front_of_django():
    taken = [router.PREFIX, model_simulator.PREFIX, *PREFIXES]
    pages = [regex.replace("\\", "") for regex, _ in routes()]

    assert "deployments/" in pages
    clashes = [route for route in pages for prefix in taken if ("/" + route).startswith(prefix)]
    assert clashes == []
