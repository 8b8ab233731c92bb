"""The load simulator's form on a capacity set (issue 21): where the load comes from (an uploaded
JSON profile or one CSV curve, pasted JSON, or the router's own counters of the last days) and
what an edited configuration changes (ranks, floors, replica ranges, which schedule entries
stay). `simulation_runs.simulation_request` says what is allowed; its errors land next to the
field they name (`SimulationForm.add_service_errors`).
"""

from __future__ import annotations

import json

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError

from gpucap.fleet.models import CapacitySet, Pool
from gpucap.inference.models import InferenceDeployment
from gpucap.schedules import calendar, spec
from gpucap.simulation import ProfileError, curve_from_csv
from gpucap.web.forms import ServiceErrorsMixin

PROFILE_BYTES = 2 * 1024 * 1024
SOURCES = (
    ("file", "Upload a file"),
    ("text", "Paste JSON"),
    ("recorded", "The router's counters"),
)


class SimulationForm(ServiceErrorsMixin, forms.Form):
    """A simulation to start: its load, its length, and the configuration to compare with
    today's. Per pool a rank and a floor, per deployment a replica range, prefilled with the
    values in force; a value left as it is changes nothing, and with nothing changed the run
    shows today's policy alone."""

    name = forms.CharField(
        label="Name",
        required=False,
        max_length=120,
        help_text="To find it again, e.g. “chat doubles at 09:00”.",
    )
    source = forms.ChoiceField(
        label="Load from", choices=SOURCES, initial="file", widget=forms.RadioSelect
    )
    profile_file = forms.FileField(
        label="Profile file",
        required=False,
        help_text="A JSON profile, or a CSV curve seconds_from_start,requests_per_second for one "
        "deployment (chosen below).",
    )
    profile_text = forms.CharField(
        label="Profile (JSON)",
        required=False,
        help_text='For example {"deployments": {"chat": {"points": [[0, 40], [32400, 80]], '
        '"shape": "step", "service_seconds": 0.5}}}: requests per second from seconds after '
        "the start (docs/simulation.md).",
        widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false", "class": "mono"}),
    )
    csv_deployment = forms.ChoiceField(label="CSV curve for", required=False)
    csv_service_seconds = forms.FloatField(
        label="Seconds a request", required=False, initial=0.5, min_value=0.001
    )
    recorded_days = forms.IntegerField(
        label="Last days",
        required=False,
        initial=7,
        min_value=1,
        max_value=settings.LOAD_HISTORY_DAYS,
        help_text=f"The router's counters are kept {settings.LOAD_HISTORY_DAYS} days.",
    )
    recorded_fold = forms.ChoiceField(
        label="As",
        required=False,
        choices=[("day", "one typical day"), ("replay", "the days as they were")],
        initial="day",
    )
    hours = forms.IntegerField(label="Hours", initial=24, min_value=1, max_value=168)
    step_seconds = forms.IntegerField(label="Step (s)", initial=60, min_value=10, max_value=3600)
    wait_threshold_seconds = forms.FloatField(
        label="Late after (s)",
        initial=1.0,
        min_value=0.001,
        help_text="A request waiting longer counts as late.",
    )

    def __init__(
        self,
        data=None,
        files=None,
        *,
        capacity_set: CapacitySet,
        pools: list[Pool],
        deployments: list[InferenceDeployment],
        entries: tuple[calendar.Entry, ...],
        initial: dict | None = None,
    ) -> None:
        super().__init__(data, files, initial=initial)
        self.capacity_set = capacity_set
        self.pools, self.deployments, self.entries = pools, deployments, entries
        self.fields["csv_deployment"].choices = [(d.slug, d.slug) for d in deployments]
        for pool in pools:
            self.fields[f"rank__{pool.name}"] = forms.IntegerField(
                label=f"{pool.name} rank", initial=pool.rank, min_value=1
            )
            self.fields[f"floor__{pool.name}"] = forms.IntegerField(
                label=f"{pool.name} floor (GPUs)", initial=pool.floor_gpus, min_value=0
            )
        for deployment in deployments:
            self.fields[f"min__{deployment.slug}"] = forms.IntegerField(
                label=f"{deployment.slug} min replicas",
                initial=deployment.min_replicas,
                min_value=0,
            )
            self.fields[f"max__{deployment.slug}"] = forms.IntegerField(
                label=f"{deployment.slug} max replicas",
                initial=deployment.max_replicas,
                min_value=0,
            )
        self.fields["keep_entries"] = forms.MultipleChoiceField(
            label="Schedule entries kept",
            required=False,
            choices=[(entry.name, entry.name) for entry in entries],
            initial=[entry.name for entry in entries],
            widget=forms.CheckboxSelectMultiple,
        )
        # Fields a service error names, by the service's key.
        self.error_fields = {
            **{f"changes.pools.{p.name}.rank": f"rank__{p.name}" for p in pools},
            **{f"changes.pools.{p.name}.floor_gpus": f"floor__{p.name}" for p in pools},
            **{f"changes.deployments.{d.slug}.min_replicas": f"min__{d.slug}" for d in deployments},
            **{f"changes.deployments.{d.slug}.max_replicas": f"max__{d.slug}" for d in deployments},
        }

    # --- how the page lays the fields out --------------------------------------------------------

    def load_fields(self):
        return [self[name] for name in ("name", "source")]

    def sources(self) -> list:
        """Each place the load may come from: its radio button and its fields."""
        names = {
            "file": ("profile_file", "csv_deployment", "csv_service_seconds"),
            "text": ("profile_text",),
            "recorded": ("recorded_days", "recorded_fold"),
        }
        return [
            (radio, [self[name] for name in names[radio.data["value"]]]) for radio in self["source"]
        ]

    def length_fields(self):
        return [self[name] for name in ("hours", "step_seconds", "wait_threshold_seconds")]

    def pool_rows(self):
        return [
            (pool, self[f"rank__{pool.name}"], self[f"floor__{pool.name}"]) for pool in self.pools
        ]

    def deployment_rows(self):
        return [(d, self[f"min__{d.slug}"], self[f"max__{d.slug}"]) for d in self.deployments]

    # --- reading it -------------------------------------------------------------------------------

    def clean(self) -> dict:
        data = super().clean()
        source = data.get("source")
        if source == "file":
            data["profile"] = self._profile_from_file(data.get("profile_file"))
        elif source == "text":
            data["profile"] = self._profile_from_text(data.get("profile_text") or "")
        elif source == "recorded" and data.get("recorded_days") is None:
            self.add_error("recorded_days", "say how many days of the router's counters")
        return data

    def _profile_from_file(self, upload) -> dict | None:
        if upload is None:
            self.add_error("profile_file", "choose a profile file")
            return None
        if upload.size > PROFILE_BYTES:
            self.add_error("profile_file", f"is over {PROFILE_BYTES // (1024 * 1024)} MiB")
            return None
        try:
            text = upload.read().decode("utf-8")
        except UnicodeDecodeError:
            self.add_error("profile_file", "must be UTF-8 text (JSON or CSV)")
            return None
        if not upload.name.lower().endswith(".csv"):
            return self._json(text, "profile_file")
        slug = self.cleaned_data.get("csv_deployment")
        if not slug:
            self.add_error("csv_deployment", "choose the deployment the CSV curve is for")
            return None
        try:
            curve = curve_from_csv(text, where="rows")
        except ProfileError as error:
            for where, why in error.problems.items():
                self.add_error("profile_file", f"{where}: {why}")
            return None
        service = self.cleaned_data.get("csv_service_seconds") or 0.5
        return {"deployments": {slug: {**curve.to_dict(), "service_seconds": service}}}

    def _profile_from_text(self, text: str) -> dict | None:
        if not text.strip():
            self.add_error("profile_text", "paste a profile in JSON")
            return None
        return self._json(text, "profile_text")

    def _json(self, text: str, field: str) -> dict | None:
        try:
            profile = json.loads(text)
        except ValueError as error:
            self.add_error(field, f"is not JSON: {error}")
            return None
        if not isinstance(profile, dict):
            self.add_error(field, "must be a JSON object with deployments and pools")
            return None
        return profile

    def changes(self) -> dict:
        """What the edited configuration changes, in the service's form ({} for nothing)."""
        data, changes = self.cleaned_data, {}
        pools = self._edited(
            {p.name: {"rank": p.rank, "floor_gpus": p.floor_gpus} for p in self.pools},
            {"rank": "rank__", "floor_gpus": "floor__"},
        )
        deployments = self._edited(
            {
                d.slug: {"min_replicas": d.min_replicas, "max_replicas": d.max_replicas}
                for d in self.deployments
            },
            {"min_replicas": "min__", "max_replicas": "max__"},
        )
        if pools:
            changes["pools"] = pools
        if deployments:
            changes["deployments"] = deployments
        kept = set(data.get("keep_entries") or ())
        if kept != {entry.name for entry in self.entries}:
            changes["schedule"] = [written_entry(e) for e in self.entries if e.name in kept]
        return changes

    def _edited(self, today: dict[str, dict], fields: dict[str, str]) -> dict:
        """Per name, the settings whose field differs from today's value."""
        edited = {}
        for name, values in today.items():
            changed = {
                setting: self.cleaned_data[f"{prefix}{name}"]
                for setting, prefix in fields.items()
                if self.cleaned_data[f"{prefix}{name}"] != values[setting]
            }
            if changed:
                edited[name] = changed
        return edited

    def add_service_errors(self, error: ValidationError) -> None:
        """A profile's problems go to the field the profile came from."""
        source = {"file": "profile_file", "text": "profile_text", "recorded": "recorded_days"}[
            self.cleaned_data["source"]
        ]
        if hasattr(error, "error_dict"):
            moved: dict[str, list] = {}
            for name, errors in error.error_dict.items():
                if name == "profile" or name.startswith("profile."):
                    where = name.removeprefix("profile").lstrip(".")
                    messages = [m for e in errors for m in e.messages]
                    moved.setdefault(source, []).extend(
                        f"{where}: {m}" if where else m for m in messages
                    )
                else:
                    moved.setdefault(name, []).extend(errors)
            error = ValidationError(moved)
        super().add_service_errors(error)


def written_entry(entry: calendar.Entry) -> dict:
    """A schedule entry in the form the schedule API takes (and `changes.schedule` too)."""
    window = entry.window
    return {
        "name": entry.name,
        "days": sorted(window.days),
        "start": f"{window.start:%H:%M}",
        "end": f"{window.end:%H:%M}",
        "time_zone": window.zone,
        **spec.written(list(entry.changes)),
    }
