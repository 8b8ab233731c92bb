from django.urls import path

from gpucap.rentals import views

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
