"""Filters every list endpoint shares.

Foreign keys filter by id with plain number filters: a tenant member filtering pools by a
cluster must not learn from a "no such cluster" error which cluster ids exist.
"""

import django_filters
from django import forms
from drf_spectacular.utils import extend_schema_field

# Ids are PostgreSQL bigints: a larger number is a 400 naming the parameter, not a query that
# fails with "bigint out of range".
MAX_ID = 2**63 - 1


@extend_schema_field({"type": "integer", "minimum": 1, "maximum": MAX_ID})
class IdFilter(django_filters.NumberFilter):
    """A foreign key by id: a whole number from 1 to the largest bigint, or a 400 naming the
    parameter."""

    field_class = forms.IntegerField

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", MAX_ID)
        super().__init__(*args, **kwargs)
