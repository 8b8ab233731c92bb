"""The arbiter's pages of one capacity set, under ``/fleet/sets/<name>/`` (see gpucap/urls.py)."""

from django.urls import path

from gpucap.plans import simulation_views, views

app_name = "plans"

urlpatterns = [
    path("plans/<int:plan_id>/", views.plan_detail, name="detail"),
    path("plans/<int:plan_id>/approve/", views.plan_approve, name="approve"),
    path("mode/", views.capacity_set_mode, name="mode"),
    path("what-if/", views.what_if, name="what-if"),
    path("simulations/", simulation_views.simulations, name="simulations"),
    path(
        "simulations/section/",
        simulation_views.simulations_section,
        name="simulations-section",
    ),
    path("simulations/<int:run_id>/", simulation_views.simulation, name="simulation"),
]
