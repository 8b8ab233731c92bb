"""The base pieces every app's `api.py` builds on: input serializers that refuse what they do
not know, viewsets whose writes go through services, and the shape of an operator command."""

from collections.abc import Mapping

from rest_framework import serializers
from rest_framework.views import APIView

from gpucap.api.permissions import IsOperator
from gpucap.api.schema import AutoSchema


class InputSerializer(serializers.Serializer):
    """Checks a request's shape. Fields a request may not set are refused by name rather than
    silently ignored, so a client never believes it changed something it did not."""

    hints: dict[str, str] = {}

    def to_internal_value(self, data):
        if isinstance(data, Mapping):
            unknown = [key for key in data if key not in self.fields]
            if unknown:
                raise serializers.ValidationError(
                    {key: [self.hints.get(key, "cannot be set by this request")] for key in unknown}
                )
        return super().to_internal_value(data)


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
