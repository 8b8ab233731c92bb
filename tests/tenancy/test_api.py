"""Tenants over the REST API, and the two ways to authenticate: an API token and a session."""

import pytest
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from gpucap.fleet import services as fleet
from gpucap.tenancy.models import Membership, Tenant
from tests.conftest import PASSWORD
from tests.redis_server import free_port


def slugs(response) -> list[str]:
    return [row["slug"] for row in response.data["results"]]


# --- tenants ------------------------------------------------------------------------------------


def test_operator_lists_every_tenant_with_the_pools_it_may_use(operator_api, fleet_east):
    response = operator_api.get("/api/tenants/")
    assert response.status_code == 200
    assert [(t["slug"], t["name"], t["pools"]) for t in response.data["results"]] == [
        ("acme", "Acme AI", ["h100-spot"]),
        ("globex", "Globex Research", ["l40s-ondemand"]),
    ]


def test_member_lists_only_their_own_tenant(member_api, fleet_east):
    assert slugs(member_api.get("/api/tenants/")) == ["acme"]


def test_member_of_two_tenants_lists_both(member, member_api, other_tenant):
    Membership.objects.create(user=member, tenant=other_tenant)
    assert slugs(member_api.get("/api/tenants/")) == ["acme", "globex"]


def test_another_tenants_id_answers_404_not_403(member_api, other_tenant, tenant):
    response = member_api.get(f"/api/tenants/{other_tenant.pk}/")
    assert response.status_code == 404
    assert response.data == {"error": {"code": "not_found", "message": "Not found.", "fields": {}}}
    assert member_api.get(f"/api/tenants/{tenant.pk}/").data["slug"] == "acme"


def test_another_tenants_slug_filter_finds_nothing(member_api, other_tenant):
    response = member_api.get("/api/tenants/?slug=globex")
    assert response.status_code == 200
    assert response.data["results"] == []


def test_anonymous_cannot_list_tenants(anonymous_api, tenant):
    assert anonymous_api.get("/api/tenants/").status_code == 401


def test_tenants_are_read_only_over_the_api(operator_api, tenant):
    response = operator_api.post("/api/tenants/", {"name": "Initech", "slug": "initech"})
    assert response.status_code == 405
    assert response.data["error"]["code"] == "method_not_allowed"
    assert operator_api.delete(f"/api/tenants/{tenant.pk}/").status_code == 405
    assert list(Tenant.objects.values_list("slug", flat=True)) == ["acme"]


def _warm_client(user) -> APIClient:
    """A client for a freshly loaded user, after one request has cached the user's role and
    tenants, as the first permission check of every real request does."""
    client = APIClient()
    client.force_authenticate(User.objects.get(pk=user.pk))
    client.get("/api/tenants/")
    return client


@pytest.mark.parametrize("who", ["operator", "member"])
def test_tenant_list_runs_a_fixed_number_of_queries(
    request, who, fleet_east, member, django_assert_num_queries
):
    user = request.getfixturevalue(who)
    client = _warm_client(user)
    with django_assert_num_queries(3):
        small = len(client.get("/api/tenants/").data["results"])
    for number in range(4):
        extra = Tenant.objects.create(name=f"Extra {number}", slug=f"extra-{number}")
        Membership.objects.create(user=member, tenant=extra)
        fleet.pool_set_tenants(pool=fleet_east["pools"]["h100-spot"], tenants=[extra])
    client = _warm_client(user)
    with django_assert_num_queries(3):
        large = len(client.get("/api/tenants/").data["results"])
    assert large == small + 4


# --- tokens and sessions ------------------------------------------------------------------------


def test_a_token_from_username_and_password_authenticates_api_calls(member, fleet_east):
    client = APIClient()
    response = client.post(
        "/api/token/", {"username": "mallory", "password": PASSWORD}, format="json"
    )
    assert response.status_code == 200
    token = response.data["token"]
    assert token == Token.objects.get(user=member).key

    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    pools = client.get("/api/pools/")
    assert pools.status_code == 200
    assert [p["name"] for p in pools.data["results"]] == ["h100-spot"]
    assert client.get("/api/nodes/").status_code == 403


def test_asking_twice_returns_the_same_token(member):
    client = APIClient()
    body = {"username": "mallory", "password": PASSWORD}
    first = client.post("/api/token/", body, format="json").data["token"]
    assert client.post("/api/token/", body, format="json").data["token"] == first


def test_a_wrong_password_gets_no_token(member):
    response = APIClient().post(
        "/api/token/", {"username": "mallory", "password": "guess"}, format="json"
    )
    assert response.status_code == 400
    assert response.data["error"]["code"] == "invalid"
    assert response.data["error"]["message"] == "Unable to log in with provided credentials."
    assert not Token.objects.exists()


def test_a_token_request_without_a_password_names_the_field(member):
    response = APIClient().post("/api/token/", {"username": "mallory"}, format="json")
    assert response.status_code == 400
    assert response.data["error"]["fields"] == {"password": ["This field is required."]}


def test_a_token_for_an_operator_allows_writes(operator, fleet_east):
    client = APIClient()
    token = client.post(
        "/api/token/", {"username": "olivia", "password": PASSWORD}, format="json"
    ).data["token"]
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    node = fleet_east["nodes"]["h100-001"]
    response = client.post(f"/api/nodes/{node.pk}/cordon/")
    assert response.status_code == 200
    assert response.data["state"] == "cordoned"


def test_an_unknown_token_is_refused_with_401(db):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token 0000000000000000000000000000000000000000")
    response = client.get("/api/pools/")
    assert response.status_code == 401
    assert response.data["error"] == {
        "code": "authentication_failed",
        "message": "Invalid token.",
        "fields": {},
    }


def test_a_browser_session_reads_the_api_but_must_send_a_csrf_token_to_write(operator, fleet_east):
    client = APIClient(enforce_csrf_checks=True)
    assert client.login(username="olivia", password=PASSWORD)
    assert client.get("/api/nodes/").status_code == 200
    node = fleet_east["nodes"]["h100-001"]
    response = client.post(f"/api/nodes/{node.pk}/cordon/")
    assert response.status_code == 403
    assert "CSRF" in response.data["error"]["message"]
    node.refresh_from_db()
    assert node.state == "ready"


def test_token_guesses_from_one_address_are_throttled_with_retry_after(member, monkeypatch):
    from django.core.cache import cache
    from rest_framework.throttling import ScopedRateThrottle

    monkeypatch.setattr(ScopedRateThrottle, "THROTTLE_RATES", {"token": "3/minute"})
    key = "throttle_token_127.0.0.1"
    cache.delete(key)
    client = APIClient()
    guesses = [
        client.post(
            "/api/token/",
            {"username": "mallory", "password": f"guess-{n}"},
            format="json",
            headers={"X-Forwarded-For": f"198.51.100.{n}"},  # a fresh address each time
        )
        for n in range(4)
    ]
    try:
        right = client.post(
            "/api/token/", {"username": "mallory", "password": PASSWORD}, format="json"
        )
    finally:
        cache.delete(key)

    assert [g.status_code for g in guesses] == [400, 400, 400, 429]
    assert guesses[3].data["error"]["code"] == "throttled"
    assert 0 < int(guesses[3]["Retry-After"]) <= 60
    assert right.status_code == 429, "the right password waits too: no oracle while throttled"
    assert not Token.objects.exists()


def test_while_redis_is_down_the_token_endpoint_answers_503_in_the_error_shape(member, settings):
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{free_port()}/0",  # nothing listens there
        }
    }

    response = APIClient().post(
        "/api/token/", {"username": "mallory", "password": PASSWORD}, format="json"
    )

    assert response.status_code == 503
    assert response["Retry-After"] == "1"
    assert response.json()["error"]["code"] == "unavailable"
    assert "retry" in response.json()["error"]["message"]
    assert not Token.objects.exists()
