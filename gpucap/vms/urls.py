from django.urls import path

from gpucap.vms import views

# The namespace stays "rentals": these are the rentals' pages (rentals:vm-detail, ...), whoever
# builds them, and templates across the site link to them by these names.
app_name = "rentals"

# Included at the site root: a tenant's VMs live under its own page, one VM under /vms/.
urlpatterns = [
    path("vms/", views.vm_list, name="vm-list"),
    path("vms/<int:pk>/", views.vm_detail, name="vm-detail"),
    path("vms/<int:pk>/stop/", views.vm_stop, name="vm-stop"),
    path("vms/<int:pk>/start/", views.vm_start, name="vm-start"),
    path("vms/<int:pk>/terminate/", views.vm_terminate, name="vm-terminate"),
    path("vms/<int:pk>/reclaim/", views.vm_reclaim, name="vm-reclaim"),
    path("tenants/<slug:slug>/vms/", views.tenant_vms, name="tenant-vms"),
]
