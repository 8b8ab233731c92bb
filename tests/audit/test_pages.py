"""The operator's audit log page."""

from django.urls import reverse

from gpucap.audit.models import AuditEvent
from gpucap.fleet import services as fleet

HTMX = {"HX-Request": "true"}
ROW = '<td class="nowrap"'  # one per event row


def add_events(count: int, *, verb: str = "node.update", object_type: str = "node") -> None:
    AuditEvent.objects.bulk_create(
        AuditEvent(
            actor_label="system",
            verb=verb,
            object_type=object_type,
            object_id=str(n),
            object_label=f"bulk-{n:04d}",
            before={"labels": {}},
            after={"labels": {"n": str(n)}},
        )
        for n in range(count)
    )


def test_anonymous_visitor_is_sent_to_login(client, db):
    response = client.get(reverse("audit:log"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_tenant_member_is_refused(client, member):
    client.force_login(member)
    assert client.get(reverse("audit:log")).status_code == 403


def test_log_shows_newest_first_with_actor_and_change(operator_client, operator, fleet_east):
    node = fleet_east["nodes"]["h100-001"]
    fleet.node_cordon(node=node, actor=operator)
    fleet.node_uncordon(node=node, actor=operator)

    page = operator_client.get(reverse("audit:log")).content.decode()
    assert page.index("<code>node.uncordon</code>") < page.index("<code>node.cordon</code>")
    assert page.index("<code>node.cordon</code>") < page.index("<code>node.create</code>")
    assert "olivia" in page
    assert '<span class="before">ready</span> → <span class="after">cordoned</span>' in page


def test_filter_by_verb_shows_only_that_verb(operator_client, operator, fleet_east):
    node = fleet_east["nodes"]["h100-001"]
    fleet.node_cordon(node=node, actor=operator)
    fleet.node_uncordon(node=node, actor=operator)

    response = operator_client.get(reverse("audit:log"), {"verb": "node.cordon"}, headers=HTMX)
    page = response.content.decode()
    assert page.count(ROW) == 1
    assert "<code>node.cordon</code>" in page
    assert "<code>node.uncordon</code>" not in page


def test_filter_by_object_type_shows_only_that_type(operator_client, fleet_east):
    response = operator_client.get(reverse("audit:log"), {"object_type": "pool"}, headers=HTMX)
    verbs = {event.verb for event in response.context["page"]}
    assert verbs == {"pool.create", "pool.set_tenants"}
    assert response.content.decode().count(ROW) == 5 + 2  # five pools, two granted to tenants


def test_filter_naming_an_unknown_verb_says_so(operator_client, fleet_east):
    page = operator_client.get(reverse("audit:log"), {"verb": "node.explode"}).content.decode()
    assert "Ignored a filter" in page


def test_filter_form_swaps_the_table_and_keeps_the_url(operator_client, db):
    page = operator_client.get(reverse("audit:log")).content.decode()
    assert 'hx-target="#audit-table"' in page
    assert 'hx-push-url="true"' in page


def test_htmx_request_returns_only_the_table_fragment(operator_client, fleet_east):
    page = operator_client.get(reverse("audit:log"), headers=HTMX).content.decode()
    assert page.lstrip().startswith('<div id="audit-table">')
    assert "<html" not in page
    assert "Capacity sets</a>" not in page


def test_log_is_paginated_fifty_per_page_keeping_the_filter(operator_client, db):
    add_events(60)
    add_events(3, verb="node.cordon")

    first = operator_client.get(reverse("audit:log"), {"verb": "node.update"})
    assert first.content.decode().count(ROW) == 50
    assert "verb=node.update&amp;page=2" in first.content.decode()

    second = operator_client.get(reverse("audit:log"), {"verb": "node.update", "page": 2})
    assert second.content.decode().count(ROW) == 10
    assert "<code>node.cordon</code>" not in second.content.decode().split("<tbody>")[1]


def test_page_number_past_the_end_shows_the_last_page(operator_client, db):
    add_events(60)
    response = operator_client.get(reverse("audit:log"), {"page": 99})
    assert response.context["page"].number == 2


def test_log_query_count_does_not_grow_with_events(operator_client, db, django_assert_num_queries):
    add_events(5)
    # session, user, operator group; verbs; object types; count; one page of events.
    with django_assert_num_queries(7):
        operator_client.get(reverse("audit:log"))
    add_events(200, verb="pool.create", object_type="pool")
    with django_assert_num_queries(7):
        response = operator_client.get(reverse("audit:log"))
    assert len(response.context["page"].object_list) == 50
