"""People meet the site's own 404 and 500 pages, in its layout, under make run's DEBUG too: never
Django's technical pages listing every URL or a traceback."""

import pytest
from django.test import Client

from gpucap.portal import views as portal_views

pytestmark = pytest.mark.django_db


@pytest.fixture
def as_make_run(settings):
    settings.DEBUG = True


@pytest.mark.parametrize("debug", [True, False])
def test_a_missing_page_is_the_sites_own_404(settings, operator_client, debug):
    settings.DEBUG = debug

    response = operator_client.get("/no-such-page/")
    page = response.content.decode()

    assert response.status_code == 404
    assert "<h1>Not found</h1>" in page
    assert 'aria-label="Main"' in page  # the site's menu
    assert "URLconf" not in page


def test_a_crash_is_the_sites_own_500_page(as_make_run, operator, monkeypatch):
    def broken():
        raise RuntimeError("the disk is on fire")

    monkeypatch.setattr(portal_views.selectors, "tenant_list", broken)
    client = Client(raise_request_exception=False)
    client.force_login(operator)

    response = client.get("/tenants/")
    page = response.content.decode()

    assert response.status_code == 500
    assert 'aria-label="Main"' in page
    assert "Something went wrong" in page
    assert "the disk is on fire" not in page
    assert "Traceback" not in page


def test_the_api_keeps_its_json_404(as_make_run, operator_api):
    response = operator_api.get("/api/no-such-endpoint/")

    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")
