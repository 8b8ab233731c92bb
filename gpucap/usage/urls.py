from django.urls import path, re_path

from gpucap.usage import views

app_name = "usage"

# Included at the site root: the operator's usage under /usage/, a tenant's under its own page.
urlpatterns = [
    # usage: totals, charts and exports
    path("usage/", views.usage_overview, name="overview"),
    path("usage/mine/", views.my_usage, name="mine"),
    re_path(r"^usage/export\.(?P<fmt>csv|json)$", views.usage_export, name="export"),
    path("usage/sets/<slug:name>/allocation/", views.set_allocation, name="set-allocation"),
    path("tenants/<slug:slug>/usage/", views.tenant_usage, name="tenant-usage"),
    re_path(
        r"^tenants/(?P<slug>[-\w]+)/usage/export\.(?P<fmt>csv|json)$",
        views.tenant_usage_export,
        name="tenant-usage-export",
    ),
    # billing webhook
    path("usage/billing/", views.billing, name="billing"),
    path("usage/billing/send/", views.billing_send, name="billing-send"),
]
