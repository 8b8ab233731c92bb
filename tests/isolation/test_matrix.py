"""The tenant-isolation matrix (#16): every route that takes an object id, found by walking the
URL resolver, pages and API alike, asked by every role for an object of tenant acme's (or of
the operators' fleet), each route, role and method its own test.

- Signed out: a page sends to the sign-in page, the API answers 401 in its error shape, the
  admin sends to its own sign-in page.
- globex's admin (the attacker): never acme's object. A GET is 404 or 403 (405 where the route
  takes no GET), in the project's error shape, for a page and for its HTMX fragment alike, and
  the same answer as for an object that does not exist; no answer carries any of acme's words.
  A POST, PUT, PATCH or DELETE is refused the same way and changes no row of the database.
  Where a route names a tenant and an object inside it, globex's admin asks under its own
  tenant too.
- acme's member and admin: find their own objects (never 404); the operators' routes answer
  them 403 or 404.
- An operator: reads every object, tenants' and fleet's alike (never 404).
- Nobody: a 500.

A route that captures a parameter the matrix has no object for fails here with the name of
what to add (tests/isolation/conftest.py's ``ids``): a new route cannot slip past.

The apps in front of Django take no id from the resolver: the metadata endpoint knows a guest
by its address (tests/notices/test_metadata.py), the router a deployment by its API key, and
another tenant's key is a 401 that reaches no replica (tests/inference/test_router.py).
"""

import re

import pytest
from django.apps import apps
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.test import Client
from rest_framework.test import APIClient

from gpucap.api.permissions import IsOperatorOrReadOnly
from gpucap.rentals.models import VirtualMachine
from tests.isolation.conftest import World
from tests.routes import FORMATS, UnknownCapture, captures, fill, operator_only, routes

ROLES = ("anonymous", "a_member", "a_admin", "b_admin", "operator")
UNSAFE = ("post", "put", "patch", "delete")
REFUSED = (403, 404, 405)
# globex's admin asks for acme's objects by acme's path, and, where a route names a tenant and
# an object inside it, under globex's own tenant (``/tenants/globex/members/<acme's>/remove/``).
ATTACKERS = ("b_admin", "b_admin@globex")


def label(regex: str) -> str:
    """``/vms/<pk>/stop/`` for ``vms/(?P<pk>[0-9]+)/stop/``: a test id a reader can follow."""
    path = fill(regex, {}, default="\0") or regex
    names = iter(captures(regex))
    return re.sub("\0", lambda _: f"<{next(names)}>", path)


# The allow-list: routes that capture a parameter that names no object.
NO_OBJECT = {
    "/admin/<app_label>/": "the admin's index of one app: it names an app (staff only)",
    "/admin/<url>": "the admin's catch-all: any other path under /admin/ (staff only)",
}
# The DRF format-suffix twin of a route (``/api/vms/7.json``) is the same view and the same
# lookup as the route without the suffix, which the matrix asks; a route that captures only a
# format (the API root's ``/api/.json``) names no object.
OBJECT_ROUTES = [
    (regex, view)
    for regex, view in routes()
    if captures(regex) and not set(captures(regex)) & set(FORMATS) and label(regex) not in NO_OBJECT
]
# Links that carry their own secret (an invitation's, a password reset's): whoever holds the
# link may follow it, so they are asked with a forged secret, which must show nobody anything.
LINKS = {"token"}
# Models whose rows the matrix does not compare: signing in writes a session.
UNCOMPARED = {"sessions"}
ADD = "add it to the matrix (world_build in tests/isolation/conftest.py)"


def cases():
    for regex, view in OBJECT_ROUTES:
        for role in ROLES:
            yield pytest.param(regex, view, role, "get", id=f"{role}-GET {label(regex)}")
        for role in ATTACKERS if names_inside_a_tenant(regex) else ATTACKERS[:1]:
            for method in ("get", *UNSAFE) if role != ATTACKERS[0] else UNSAFE:
                yield pytest.param(
                    regex, view, role, method, id=f"{role}-{method.upper()} {label(regex)}"
                )


def names_inside_a_tenant(regex: str) -> bool:
    """Whether the route names an object inside a tenant it names too (a member of
    ``/tenants/<slug>/``, a key of ``/tenants/<slug>/inference/<name>/``): the attacker also
    asks for acme's object under its own tenant, which it may change."""
    names = captures(regex)
    if regex.startswith("api/tenants/"):
        return len(names) > 1
    return bool(names) and names[0] == "slug" and bool(set(names) - {"slug", "name", "fmt"})


@pytest.mark.parametrize(("regex", "view", "role", "method"), list(cases()))
def test_each_role_gets_only_what_is_its_own(world: World, db, regex, view, role, method):
    try:
        path = path_of(regex, world, role)
    except UnknownCapture as missing:
        pytest.fail(f"{missing}: {ADD}")
    client = client_of(world, role, path)
    before = database_rows() if method != "get" else None  # after signing in, which writes
    response = ask(client, method, path)
    problems = judge(regex, view, role, method, response, world)
    if role in ATTACKERS and method == "get" and not path.startswith(("/api/", "/admin/")):
        # A page's live parts are its HTMX fragments, answered by the same route.
        fragment = ask(client, method, path, HTTP_HX_REQUEST="true")
        problems += [f"fragment: {p}" for p in judge(regex, view, role, method, fragment, world)]
    if role in ATTACKERS and not regex.startswith("admin/") and not LINKS & set(captures(regex)):
        # Outsiders must not learn that acme's object exists: it is refused as none would be.
        ghost = ask(client, method, path_of(regex, world, role, ghost=True)).status_code
        if ghost != response.status_code:
            problems.append(f"no such object answers {ghost}: globex learns acme's exists")
    if before is not None and (after := database_rows()) != before:
        changed = sorted(table for table in before if after[table] != before[table])
        problems.append(f"the refused request changed the database: {changed}")
    assert not problems, f"{role} {method.upper()} {path}: {response.status_code}: {problems}"


# Every other route that answers a GET: lists, overviews, exports, the API root and schema.
LISTS = [regex for regex, _ in routes() if not captures(regex) and not regex.startswith("admin/")]


@pytest.mark.parametrize("regex", LISTS, ids=label)
def test_no_list_shows_acme_s_things_to_globex(world: World, db, regex):
    """What the matrix asks of one object, asked of every list, filtered to acme's or not."""
    path = fill(regex, {})
    client = client_of(world, "b_admin", path)
    slug, pk = world.ids["slug"], world.ids[("tenants", "pk")]
    for query in ("", f"?tenant={slug}", f"?tenant={pk}&tenant_id={pk}"):
        for headers in ({}, {"HTTP_HX_REQUEST": "true"}):
            response = ask(client, "get", path + query, **headers)
            shown = [marker for marker in world.markers if marker in text(response)]
            assert response.status_code < 500, f"{path}{query}: a server error"
            assert not shown, f"{path}{query} shows globex acme's things: {shown}"


def test_the_walk_finds_the_routes_of_every_kind():
    """The matrix is no smaller than the routes this issue names, pages, fragments and API."""
    found = {label(regex) for regex, _ in OBJECT_ROUTES}
    expected = {
        "/vms/<pk>/",
        "/tenants/<slug>/inference/<name>/keys/<pk>/revoke/",
        "/fleet/sets/<name>/live/",
        "/fleet/sets/<name>/plans/<plan_id>/",
        "/fleet/sets/<name>/schedule/entries/<entry>/",
        "/fleet/sets/<name>/schedule/entries/<entry>/delete/",
        "/fleet/sets/<name>/schedule/overrides/<override>/clear/",
        "/fleet/sets/<name>/schedule/timeline/",
        "/tenants/<slug>/usage/export.<fmt>",
        "/api/vms/<pk>/stop/",
        "/api/vms/<pk>/terminate-job/",
        "/api/notices/<pk>/",
        "/api/tenants/<pk>/members/<membership_id>/",
        "/api/capacity-sets/<id>/schedule/<name>/",
        "/api/capacity-sets/<id>/overrides/<name>/",
        "/api/capacity-sets/<id>/load-profile/",
        "/api/nodes/<id>/dedicate/",
        "/api/nodes/<id>/release/",
        "/api/tenants/<pk>/dedicated-nodes/",
        "/api/bare-metal/<pk>/",
        "/api/bare-metal/<pk>/power/",
        "/api/bare-metal/<pk>/end/",
        "/api/bare-metal/<pk>/reclaim/",
        "/api/bare-metal/<pk>/reimage/",
        "/tenants/<slug>/machines/<pk>/reimage/",
        "/tenants/<slug>/machines/<pk>/power/",
        "/fleet/nodes/<cluster>/<hostname>/bare-metal/rent/",
        "/fleet/clusters/<name>/bare-metal-images/<pk>/delete/",
        "/api/bare-metal-images/<pk>/",
        "/fleet/nodes/<cluster>/<hostname>/dedicate/",
        "/fleet/nodes/<cluster>/<hostname>/release/",
        "/fleet/nodes/<cluster>/<hostname>/bmc/",
        "/fleet/nodes/<cluster>/<hostname>/bmc/discoveries/<run_id>/apply/",
        "/fleet/nodes/<cluster>/<hostname>/bmc/credentials/",
        "/fleet/nodes/<cluster>/<hostname>/bmc/credentials/delete/",
        "/fleet/clusters/<name>/recovery-policy/",
        "/fleet/clusters/<name>/discover/",
        "/fleet/clusters/<name>/discover/row/",
        "/fleet/clusters/<name>/discoveries/<run_id>/",
        "/fleet/clusters/<name>/discoveries/<run_id>/apply/",
        "/api/nodes/<id>/bmc/",
        "/api/bmc/discoveries/<id>/",
        "/api/bmc/discoveries/<id>/apply/",
        "/api/nodes/<id>/recovery/",
        "/api/nodes/<id>/recovery/clear/",
        "/api/nodes/<id>/power-cycle/",
        "/api/clusters/<id>/recovery-policy/",
        "/fleet/nodes/<cluster>/<hostname>/recovery/",
        "/fleet/nodes/<cluster>/<hostname>/power-cycle/",
        "/fleet/nodes/<cluster>/<hostname>/recovery/clear/",
        "/api/nodes/<id>/provisioning/",
        "/fleet/nodes/<cluster>/<hostname>/provisioning/",
        "/admin/rentals/virtualmachine/<object_id>/change/",
    }
    assert expected <= found, sorted(expected - found)


def test_every_captured_parameter_has_an_object_in_the_matrix(world: World, db):
    unknown = []
    for regex, _ in OBJECT_ROUTES:
        try:
            path_of(regex, world)
        except UnknownCapture as missing:
            unknown.append(str(missing))
    assert not unknown, f"{unknown}: {ADD}"


# --- asking -------------------------------------------------------------------------------------


def path_of(regex: str, world: World, role: str = "", *, ghost: bool = False) -> str:
    """The route's path for acme's object (or the fleet's), under globex's tenant for
    ``b_admin@globex``; with ``ghost``, for objects that do not exist. ``UnknownCapture`` when
    the matrix has none for one of its parameters."""
    ids = {key: ghost_of(value) if ghost else value for key, value in world.ids.items()}
    if regex.startswith("admin/"):
        ids.update(admin_ids(regex))
    if role == ATTACKERS[1]:
        ids.update(world.own_ids)
    return fill(regex, ids, default=None)


def ghost_of(value):
    """An id like ``value`` that names nothing; a format stays a format."""
    if value in ("csv", "json"):
        return value
    return value + 100_000 if isinstance(value, int) else f"{value}-gone"


def admin_ids(regex: str) -> dict:
    """The admin names an object of the model in its path by ``object_id``: the world's first
    (acme's, where the model is a tenant's)."""
    if regex.startswith("admin/r/"):
        return {
            "content_type_id": ContentType.objects.get_for_model(VirtualMachine).pk,
            "object_id": VirtualMachine.objects.order_by("pk").first().pk,
        }
    app_label, model_name = regex.split("/")[1:3]
    row = apps.get_model(app_label, model_name)._default_manager.order_by("pk").first()
    if row is None:
        pytest.fail(f"route /{regex} names a {app_label}.{model_name}: {ADD}")
    return {(model_name, "object_id"): row.pk, (model_name, "id"): row.pk}


def client_of(world: World, role: str, path: str) -> Client:
    """A client signed in as ``role``: a browser session for pages, a request authenticated
    as the user for the API."""
    client = APIClient() if path.startswith("/api/") else Client()
    if role == "anonymous":
        return client
    if path.startswith("/api/"):
        client.force_authenticate(world.users[role])
    else:
        client.force_login(world.users[role])
    return client


def ask(client: Client, method: str, path: str, **headers):
    if path.startswith("/api/"):
        return getattr(client, method)(path, {}, format="json")
    return getattr(client, method)(path, **headers)


def database_rows() -> dict:
    """Every table a refused request must leave as it was, each as a digest of all its rows
    (one query for the whole database: the matrix asks it twice for each of ~500 writes)."""
    tables = [
        model._meta.db_table
        for model in apps.get_models(include_auto_created=True)
        if model._meta.app_label not in UNCOMPARED and not model._meta.proxy
    ]
    digests = " UNION ALL ".join(
        f"SELECT '{table}', md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) "
        f'FROM "{table}" t'
        for table in sorted(set(tables))
    )
    with connection.cursor() as cursor:
        cursor.execute(digests)
        return dict(cursor.fetchall())


# --- judging ------------------------------------------------------------------------------------


def judge(regex: str, view, role: str, method: str, response, world: World) -> list[str]:
    """What is wrong with ``response`` by the rules of the module's docstring."""
    status, problems = response.status_code, []
    if status >= 500:
        return ["a server error"]
    shown = [marker for marker in world.markers if marker in text(response)]
    if shown and role in ("anonymous", *ATTACKERS):
        problems.append(f"the answer shows acme's things: {shown}")
    if regex.startswith("admin/"):
        if role != "operator" and not sends_to(response, "/admin/login/"):
            problems.append("the admin's pages are for staff: expected its sign-in page")
        return problems
    if LINKS & set(captures(regex)):
        return problems  # a forged link: whatever it answers, it shows nothing (above)
    if role == "anonymous" and status != 405:  # a GET of a POST-only route: nothing shown
        signed_out = status == 401 if regex.startswith("api/") else sends_to(response, "/login/")
        if not signed_out:
            problems.append("signed out: expected 401 (API) or the sign-in page")
        elif status == 401:
            problems.extend(error_shape(regex, response))
    elif role in ATTACKERS or (role.startswith("a_") and for_operators(view)):
        if status not in REFUSED:
            problems.append(f"expected one of {REFUSED}")
        elif status != 405:
            problems.extend(error_shape(regex, response))
    elif status == 404:
        problems.append("its own (or, for an operator, any) object was not found")
    return problems


def for_operators(view) -> bool:
    """Operators' routes a tenant may not even read (the fleet's pools and images it may use,
    ``IsOperatorOrReadOnly``, it reads)."""
    if not operator_only(view):
        return False
    cls = getattr(view, "cls", None)
    initkwargs = getattr(view, "initkwargs", {})
    permissions = initkwargs.get("permission_classes", getattr(cls, "permission_classes", []))
    return cls is None or IsOperatorOrReadOnly not in permissions


def sends_to(response, page: str) -> bool:
    return response.status_code == 302 and response["Location"].startswith(f"{page}?next=")


def text(response) -> str:
    if getattr(response, "streaming", False):
        return b"".join(response.streaming_content).decode(errors="replace")
    return response.content.decode(errors="replace")


def error_shape(regex: str, response) -> list[str]:
    """A refusal is the API's one error shape, or a page a person can read."""
    if regex.startswith("api/"):
        error = response.json().get("error", {})
        return [] if error.get("code") and error.get("message") else ["not the API's error shape"]
    if not response["Content-Type"].startswith("text/html"):
        return ["a refused page is not an HTML error page"]
    return []
