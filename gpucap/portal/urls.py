from django.urls import path

from gpucap.portal import machines, views

# No namespace: "home" is where LOGIN_REDIRECT_URL sends everyone after signing in.
urlpatterns = [
    path("", views.home, name="home"),
    path("tenants/", views.tenant_list, name="tenant-list"),
    path("tenants/<slug:slug>/", views.tenant_detail, name="tenant-detail"),
    path("tenants/<slug:slug>/machines/", machines.machines, name="tenant-machines"),
    path(
        "tenants/<slug:slug>/machines/<int:pk>/power/",
        machines.machine_power,
        name="tenant-machine-power",
    ),
    path(
        "tenants/<slug:slug>/machines/<int:pk>/reimage/",
        machines.machine_reimage,
        name="tenant-machine-reimage",
    ),
    path(
        "tenants/<slug:slug>/machines/<int:pk>/end/",
        machines.machine_end,
        name="tenant-machine-end",
    ),
]
