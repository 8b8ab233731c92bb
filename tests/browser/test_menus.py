"""Every link of the menu opens a page its reader may use (issue 15): an operator, a tenant
admin and a tenant member each follow every link of their menu and land on HTML 200 in the
site's layout — never the router's JSON, Django admin's "no permission" or an error page."""

import pytest

from gpucap.tenancy.models import Membership
from tests.browser.conftest import log_in

pytestmark = pytest.mark.django_db(transaction=True)


def menu_links(page) -> list[tuple[str, str]]:
    links = page.get_by_role("navigation", name="Main").get_by_role("link")
    return [(link.inner_text(), link.get_attribute("href")) for link in links.all()]


def every_link_opens_a_page(page) -> list[str]:
    seen = []
    for label, href in menu_links(page):
        response = page.goto(href)
        assert response.status == 200, f"{label} ({href}) answered {response.status}"
        assert response.headers["content-type"].startswith("text/html"), (label, href)
        if href != "/api/docs/":  # Swagger UI is a page of its own
            assert page.get_by_role("navigation", name="Main").count() == 1, (label, href)
        seen.append(label)
    return seen


def test_every_menu_link_opens_a_page_for_each_role(
    page, operator, member, other_member, tenant, fleet_east
):
    Membership.objects.filter(user=member).update(role=Membership.Role.ADMIN)
    Membership.objects.create(user=other_member, tenant=tenant, role=Membership.Role.MEMBER)
    for user, expected in (
        (operator, {"Fleet", "Capacity sets", "Tenants", "Quotas", "VMs", "Inference", "Notices"}),
        (member, {"My tenant", "My VMs", "Inference", "Notices", "My usage"}),
        (other_member, {"My VMs", "Inference", "Notices", "My usage"}),
    ):
        page.context.clear_cookies()
        log_in(page, user.username)
        seen = every_link_opens_a_page(page)
        assert expected <= set(seen), (user.username, seen)
        assert "Admin" not in seen  # not a superuser: Django admin would say "no permission"
