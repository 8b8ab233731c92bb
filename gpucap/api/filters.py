"""Filters every list endpoint shares.

Foreign keys filter by id with plain number filters: a tenant member filtering pools by a
cluster must not learn from a "no such cluster" error which cluster ids exist. A value a
filter cannot read is a 400 naming the parameter, never a filter silently left out.
"""

import django_filters
from django import forms
from drf_spectacular.utils import extend_schema_field

# Ids are PostgreSQL bigints: a larger number is a 400 naming the parameter, not a query that
# fails with "bigint out of range".
MAX_ID = 2**63 - 1


class _IdGiven(forms.IntegerField):
    """An id given in the query must be a whole number: ``?pool=`` (given, empty) is refused.
    django-filter read an empty value as "no filter", so a client that sent one got every row
    and believed it had filtered (the API fuzz found ``/api/deployments/?pool=`` answered 200)."""

    def clean(self, value):
        if value == "":
            raise forms.ValidationError(
                "must be a whole number; leave the parameter out not to filter"
            )
        return super().clean(value)


@extend_schema_field({"type": "integer", "minimum": 1, "maximum": MAX_ID})
class IdFilter(django_filters.NumberFilter):
    """A foreign key by id: a whole number from 1 to the largest bigint, or a 400 naming the
    parameter."""

    field_class = _IdGiven

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", MAX_ID)
        super().__init__(*args, **kwargs)


class _TrueOrFalse(forms.Field):
    """``true`` or ``false``, as the schema's booleans are written in a query; absent is no
    filter. Django's NullBooleanField read anything else (``null``, ``yes``, a typo) as
    "unknown" and the filter was silently dropped: the client got every row and believed it
    had filtered."""

    widget = forms.TextInput

    def to_python(self, value):
        if value is None:
            return None
        if value in ("true", "false"):
            return value == "true"
        # The value travels as a parameter: django-filter formats the message with ``%``, and a
        # value holding a ``%`` written into the message itself was a 500.
        raise forms.ValidationError(
            "%(value)s is not true or false", params={"value": repr(str(value)[:40])}
        )


class BooleanFilter(django_filters.BooleanFilter):
    """A yes/no filter: ``true`` or ``false``, or a 400 naming the parameter."""

    field_class = _TrueOrFalse


class _ChoiceGiven(django_filters.fields.ChoiceField):
    """A choice given in the query must be one of the choices: ``?state=`` (given, empty) is
    refused. django-filter read an empty value as "no filter", so a client that sent one got
    every row and believed it had filtered."""

    def clean(self, value):
        if value == "":
            raise forms.ValidationError(
                "must be one of the choices; leave the parameter out not to filter"
            )
        return super().clean(value)


class ChoiceFilter(django_filters.ChoiceFilter):
    field_class = _ChoiceGiven


class FilterSet(django_filters.FilterSet):
    """The API's FilterSet: a field with choices filters with the strict `ChoiceFilter`."""

    @classmethod
    def filter_for_lookup(cls, field, lookup_type):
        filter_class, params = super().filter_for_lookup(field, lookup_type)
        if filter_class is django_filters.ChoiceFilter:
            return ChoiceFilter, params
        return filter_class, params
