"""Filters every list endpoint shares.

Foreign keys filter by id with plain number filters: a tenant member filtering pools by a
cluster must not learn from a "no such cluster" error which cluster ids exist.
"""

import django_filters
from django import forms
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field


@extend_schema_field(OpenApiTypes.INT)
class IdFilter(django_filters.NumberFilter):
    """A foreign key by id: a whole number, or a 400 naming the parameter."""

    field_class = forms.IntegerField
