"""Notices sent by a plan say so: operators follow them back to the plan."""

from gpucap.plans import services


def test_the_notices_page_links_an_arbiter_notice_to_its_plan(
    client, h100, full_set, on_demand_request, operator
):
    on_demand_request()
    plan = services.capacity_set_tick(capacity_set_id=h100.pk).plan
    services.plan_approve(plan=plan, actor=operator)
    client.force_login(operator)

    page = client.get("/notices/").content.decode()

    assert f'href="/fleet/sets/h100-east/plans/{plan.pk}/">plan {plan.pk}</a>' in page
