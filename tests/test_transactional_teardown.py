"""A transactional test's teardown (tests/conftest.py, ``_empty_the_tables``) leaves the next one
what Django's flush would: no row of any table the test wrote, the content types and
permissions still there. The two tests run in this order (pytest keeps a file's order)."""

import pytest
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.db import connection

from gpucap.fleet import services as fleet
from gpucap.fleet.models import Cluster

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_transactional_test_writes_rows_of_several_apps(operator, tenant, fleet_east):
    fleet.cluster_create(name="west", driver=Cluster.Driver.SIMULATED)
    assert User.objects.exists()
    assert Cluster.objects.filter(name="west").exists()


def test_the_next_one_starts_from_empty_tables_with_content_types_kept():
    kept = {"django_content_type", "auth_permission", "django_migrations"}
    with connection.cursor() as cursor:
        holding = []
        for table in connection.introspection.django_table_names(only_existing=True):
            if table in kept:
                continue
            cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {connection.ops.quote_name(table)})")
            if cursor.fetchone()[0]:
                holding.append(table)
    assert holding == []
    assert ContentType.objects.get_for_model(Cluster).model_class() is Cluster
    assert Permission.objects.filter(codename="add_cluster").exists()
