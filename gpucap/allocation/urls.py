from django.urls import path

from gpucap.allocation import views

app_name = "allocation"

urlpatterns = [
    path("", views.quota_list, name="quotas"),
    path("set/", views.quota_set, name="quota-set"),
    path("<int:pk>/delete/", views.quota_delete, name="quota-delete"),
]
