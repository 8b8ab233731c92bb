"""Signing in and out, where people land, and the tenant landing page."""

from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from gpucap.fleet import services as fleet
from gpucap.fleet.models import Gpu
from gpucap.tenancy.models import Membership
from tests.conftest import PASSWORD

HTMX = {"HX-Request": "true"}


def tenant_url(slug: str) -> str:
    return reverse("tenant-detail", kwargs={"slug": slug})


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


# --- signing in and out -----------------------------------------------------------------------


def test_login_page_renders_a_form(client, db):
    response = client.get(reverse("login"))
    page = response.content.decode()
    assert response.status_code == 200
    assert 'name="username"' in page and 'name="password"' in page
    assert "csrfmiddlewaretoken" in page
    assert "Capacity sets</a>" not in page  # no navigation before signing in


def test_operator_signs_in_and_lands_on_what_needs_attention(client, operator):
    response = client.post(
        reverse("login"), {"username": "olivia", "password": PASSWORD}, follow=True
    )
    assert response.redirect_chain == [(reverse("home"), 302)]
    assert response.status_code == 200
    assert "Needs attention" in response.content.decode()


def test_member_signs_in_and_lands_on_their_tenant(client, member):
    response = client.post(
        reverse("login"), {"username": "mallory", "password": PASSWORD}, follow=True
    )
    assert response.redirect_chain[-1] == (tenant_url("acme"), 302)
    assert "<h1>Acme AI</h1>" in response.content.decode()


def test_wrong_password_is_refused_with_a_message(client, member):
    response = client.post(reverse("login"), {"username": "mallory", "password": "nope"})
    assert response.status_code == 200
    assert "Please enter a correct username and password" in response.content.decode()
    assert "_auth_user_id" not in client.session


def test_logout_is_a_post_form_in_the_nav_and_signs_out(member):
    client = logged_in(member)
    page = client.get(tenant_url("acme")).content.decode()
    assert f'<form method="post" action="{reverse("logout")}">' in page

    response = client.post(reverse("logout"))
    assert response.status_code == 302
    assert response["Location"] == reverse("login")
    assert client.get(tenant_url("acme")).status_code == 302


# --- home -------------------------------------------------------------------------------------


def test_anonymous_home_goes_to_login(client, db):
    response = client.get(reverse("home"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_user_without_tenant_is_told_to_ask_their_operator(db):
    loner = User.objects.create_user("lonely", password=PASSWORD)
    response = logged_in(loner).get(reverse("home"))
    page = response.content.decode()
    assert response.status_code == 200
    assert "No tenant yet" in page
    assert "Ask your operator" in page


def test_member_of_two_tenants_picks_one(member, other_tenant):
    Membership.objects.create(user=member, tenant=other_tenant)
    page = logged_in(member).get(reverse("home")).content.decode()
    assert f'href="{tenant_url("acme")}"' in page
    assert f'href="{tenant_url("globex")}"' in page


def test_tenant_nav_offers_my_tenant_and_no_operator_sections(member):
    page = logged_in(member).get(tenant_url("acme")).content.decode()
    assert ">My tenant</a>" in page
    assert ">tenant</span>" in page
    assert "mallory" in page
    assert reverse("fleet:overview") not in page
    assert reverse("audit:log") not in page


# --- tenant landing page ----------------------------------------------------------------------


def test_member_sees_their_tenant_role_and_pools(member, fleet_east):
    response = logged_in(member).get(tenant_url("acme"))
    page = response.content.decode()
    assert response.status_code == 200
    assert "<h1>Acme AI</h1>" in page
    assert "Your role:" in page and "Admin" in page
    assert "h100-spot" in page
    assert "l40s-ondemand" not in page  # globex's pool
    (access,) = response.context["portal"].pools
    assert (access.pool.name, access.usable_gpus) == ("h100-spot", 16)
    assert '<td>H100-SXM5-80GB<div class="small muted">NVSwitch</div></td>' in page


def test_usable_gpus_leave_out_failed_cards_and_nodes_not_ready(member, fleet_east):
    nodes = fleet_east["nodes"]
    fleet.node_cordon(node=nodes["h100-001"])
    fleet.gpu_set_health(gpu=nodes["h100-002"].gpus.get(index=4), health=Gpu.Health.FAILED)
    (access,) = logged_in(member).get(tenant_url("acme")).context["portal"].pools
    assert access.usable_gpus == 7


def test_standalone_pool_shows_the_gpus_it_rents_and_only_those_nodes(member, tenant, fleet_east):
    # Another standalone node of the cluster, of another model: it backs no A100 pool.
    fleet.node_create(
        cluster=fleet_east["cluster"], hostname="l4-001", gpu_model="L4", fabric="pcie", gpu_count=2
    )
    fleet.pool_set_tenants(pool=fleet_east["pools"]["a100-standalone"], tenants=[tenant])
    response = logged_in(member).get(tenant_url("acme"))
    page = response.content.decode()
    access = {a.pool.name: a for a in response.context["portal"].pools}["a100-standalone"]
    assert access.usable_gpus == 8
    row = page[page.index("<strong>a100-standalone</strong>") :]
    row = row[: row.index("</tr>")]
    assert '<td>A100-SXM4-80GB<div class="small muted">NVSwitch</div></td>' in row
    assert "L4" not in row and "PCIe" not in row
    assert "standalone (east)" in row


def test_member_of_another_tenant_gets_404(other_member, fleet_east):
    response = logged_in(other_member).get(tenant_url("acme"))
    assert response.status_code == 404
    assert "h100-spot" not in response.content.decode()


def test_unknown_tenant_is_404_like_a_hidden_one(member):
    assert logged_in(member).get(tenant_url("initech")).status_code == 404


def test_operator_views_any_tenant_read_only(operator, fleet_east):
    response = logged_in(operator).get(tenant_url("globex"))
    page = response.content.decode()
    assert response.status_code == 200
    assert "<h1>Globex Research</h1>" in page
    assert "Viewing Globex Research as operator (read-only)." in page
    assert "<form" not in page.replace('<form method="post" action="/logout/">', "")
    assert "l40s-ondemand" in page
    assert "oscar" not in page  # globex has no members in this test


def test_tenant_page_without_pools_says_how_to_get_them(member):
    page = logged_in(member).get(tenant_url("acme")).content.decode()
    assert "No pools yet" in page


def test_forbidden_page_links_home(member, fleet_east):
    response = logged_in(member).get(reverse("fleet:overview"))
    assert response.status_code == 403
    assert f'href="{reverse("home")}"' in response.content.decode()
