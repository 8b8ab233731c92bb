from django.urls import path

from gpucap.inference import views

app_name = "inference"

# Included at the site root: a tenant's deployments live under its own page, like its VMs. The
# router itself (/inference/<slug>/v1/...) is served in front of Django by gpucap/asgi.py.
urlpatterns = [
    # Not under /inference/: that prefix is the router's, in front of Django (gpucap/asgi.py).
    path("deployments/", views.deployment_list, name="deployment-list"),
    path("tenants/<slug:slug>/inference/", views.tenant_deployments, name="tenant-deployments"),
    path(
        "tenants/<slug:slug>/inference/<slug:name>/",
        views.deployment_detail,
        name="deployment-detail",
    ),
    path(
        "tenants/<slug:slug>/inference/<slug:name>/settings/",
        views.deployment_update,
        name="deployment-update",
    ),
    path("tenants/<slug:slug>/inference/<slug:name>/keys/", views.key_create, name="key-create"),
    path(
        "tenants/<slug:slug>/inference/<slug:name>/keys/<int:pk>/revoke/",
        views.key_revoke,
        name="key-revoke",
    ),
]
