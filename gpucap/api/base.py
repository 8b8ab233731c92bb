"""The base pieces every app's `api.py` builds on: input serializers that refuse what they do
not know, viewsets whose writes go through services, and the shape of an operator command."""

import json
from collections.abc import Mapping

from django.core.validators import MaxValueValidator, MinValueValidator
from django.http import QueryDict
from rest_framework import serializers
from rest_framework.views import APIView

from gpucap.api.permissions import IsOperator
from gpucap.api.schema import AutoSchema


class InputSerializer(serializers.Serializer):
    """Checks a request's shape. Fields a request may not set are refused by name rather than
    silently ignored, so a client never believes it changed something it did not. In a JSON
    body every value has the JSON type the schema documents: DRF would read ``"name": 0`` as
    "0" and ``"gpu_count": "2"`` as 2, so a client's mistake would pass as something else."""

    hints: dict[str, str] = {}
    # Read by gpucap.api.schema: the request shape is documented closed.
    refuses_unknown_fields = True

    def get_fields(self):
        fields = super().get_fields()
        for field in fields.values():
            integers_bounded(field)
        return fields

    def to_internal_value(self, data):
        if isinstance(data, Mapping):
            unknown = [key for key in data if key not in self.fields]
            if unknown:
                raise serializers.ValidationError(
                    {key: [self.hints.get(key, "cannot be set by this request")] for key in unknown}
                )
            # A form or a query (a QueryDict) carries only text; JSON carries types.
            if not isinstance(data, QueryDict):
                wrong = {}
                for key, value in data.items():
                    if problem := json_type_problem(self.fields[key], value):
                        at, reason = problem
                        wrong[f"{key}{at}"] = [reason]
                if wrong:
                    raise serializers.ValidationError(wrong)
        return super().to_internal_value(data)


# The widest whole number a request may carry where its field sets no tighter bound: PostgreSQL's
# integer, what floors, counts, sizes and seconds are stored in. A larger one would reach the
# database and fail there (a 500); here it is a 400 naming the field, and the schema says so.
INTEGER_MAX = 2**31 - 1


def integers_bounded(field: serializers.Field) -> None:
    """Give an integer field (or the integers inside a list or object field) the bounds of
    PostgreSQL's integer unless it has its own."""
    if isinstance(field, (serializers.ListField, serializers.DictField)):
        integers_bounded(field.child)
    if not isinstance(field, serializers.IntegerField) or field.read_only:
        return
    if field.max_value is None:
        field.max_value = INTEGER_MAX
        message = field.error_messages["max_value"].format(max_value=INTEGER_MAX)
        field.validators.append(MaxValueValidator(INTEGER_MAX, message=message))
    if field.min_value is None:
        field.min_value = -INTEGER_MAX - 1
        message = field.error_messages["min_value"].format(min_value=-INTEGER_MAX - 1)
        field.validators.append(MinValueValidator(-INTEGER_MAX - 1, message=message))


# The JSON types a field takes in a JSON body, most specific first (a BooleanField is no
# IntegerField, but Python's True is an int).
_JSON_TYPES = (
    (serializers.BooleanField, (bool,), "true or false"),
    (serializers.IntegerField, (int,), "a whole number"),
    (serializers.PrimaryKeyRelatedField, (int,), "an id (a whole number)"),
    (serializers.FloatField, (int, float), "a number"),
    (serializers.CharField, (str,), "text"),
)


def json_type_problem(field: serializers.Field, value) -> tuple[str, str] | None:
    """Where (``""``, ``[2]``, ``.rack``) and why ``value``, not of the JSON type ``field``
    documents, would still be taken by DRF, converted (looking into lists and objects of
    them), or None. ``null`` is the field's own business (``allow_null``)."""
    if value is None:
        return None
    if isinstance(field, (serializers.ListField, serializers.DictField)):
        items = enumerate(value) if isinstance(value, list) else None
        if isinstance(value, dict) and isinstance(field, serializers.DictField):
            items = ((f".{key}", item) for key, item in value.items())
        for at, item in items or ():
            if problem := json_type_problem(field.child, item):
                where = f"[{at}]" if isinstance(at, int) else at
                return f"{where}{problem[0]}", problem[1]
        return None
    for kind, types, words in _JSON_TYPES:
        if isinstance(field, kind):
            if isinstance(value, types) and not (isinstance(value, bool) and bool not in types):
                return None
            try:
                field.to_internal_value(value)
            except serializers.ValidationError:
                return None  # refused anyway, in DRF's words
            return "", f"must be {words}, not {json.dumps(value)[:40]}"
    return None


def choice_field(choices, **kwargs) -> serializers.ChoiceField:
    names = ", ".join(value for value, _label in choices)
    return serializers.ChoiceField(
        choices=choices,
        error_messages={"invalid_choice": f"{{input!r}} is not one of: {names}"},
        **kwargs,
    )


class ServiceWrites:
    """What every fleet viewset shares: input checked by an input serializer, state changed
    by a service, and the answer rendered by the read serializer from ``get_queryset()`` so it
    carries the same annotations as a list row."""

    schema = AutoSchema()

    def validated(self, serializer_class, data, **kwargs) -> dict:
        serializer = serializer_class(data=data, context=self.get_serializer_context(), **kwargs)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data

    def read(self, instance) -> dict:
        return self.get_serializer(self.get_queryset().get(pk=instance.pk)).data


class OperatorCommand(APIView):
    """A command on one object (drain a node, reclaim a VM, switch a set's mode): one small
    view that calls one service, for operators only."""

    schema = AutoSchema()
    permission_classes = [IsOperator]
