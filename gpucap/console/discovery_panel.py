"""What the cluster page's "Discover machines" panel shows and takes
(``console/cluster_discovery.html``, docs/bmc.md): rows of BMCs, each as an entry of the
discovery file with its password; the discovery shown (read by a worker while the panel polls,
then its preview and Apply, the refusal with the fresh preview, or the problems); and the
cluster's recent discoveries, the API's and the nodes' Rediscovers too. The rules are the
service's (``gpucap.bmc.discovery_runs.discovery_request``); its answers are
``gpucap.console.cluster_discovery``."""

import re
from dataclasses import dataclass

from django import forms
from django.core.exceptions import ValidationError

from gpucap.bmc.discovery_runs import MAX_ENTRIES, run_result
from gpucap.bmc.models import DiscoveryRun
from gpucap.bmc.selectors import discoveries_of_cluster
from gpucap.fleet.models import Cluster, Fabric
from gpucap.web.forms import ServiceErrorsMixin

PREFIX = "bmc"
_ADDRESS_KEY = re.compile(rf"^{PREFIX}-(\d{{1,6}})-address$")
_ENTRY_KEY = re.compile(r"^entries\[(\d+)\]\.(\w+)$")
# The fields a row holds that an operator types: a row where all are empty is left out.
_TYPED = ("address", "username", "password", "hostname", "gpu_model", "fabric", "system_id")


class DiscoveryRowForm(ServiceErrorsMixin, forms.Form):
    """One BMC to discover: an entry of the discovery file, with its password (sealed in the
    run until it ends, never shown back)."""

    address = forms.CharField(
        label="BMC address",
        max_length=253,
        error_messages={"required": "is required"},
        widget=forms.TextInput(attrs={"placeholder": "https://10.0.0.5", "inputmode": "url"}),
    )
    username = forms.CharField(
        label="User", max_length=128, error_messages={"required": "is required"}
    )
    password = forms.CharField(
        label="Password",
        max_length=256,
        strip=False,
        error_messages={"required": "is required"},
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
    )
    verify_tls = forms.BooleanField(label="Verify TLS", required=False, initial=True)
    hostname = forms.CharField(label="Hostname", required=False, max_length=253)
    gpu_model = forms.CharField(label="GPU model", required=False, max_length=64)
    fabric = forms.ChoiceField(label="Fabric", required=False, choices=[("", "—"), *Fabric.choices])
    system_id = forms.CharField(label="System id", required=False, max_length=64)

    def is_blank(self) -> bool:
        return not any((self.data.get(self.add_prefix(name)) or "").strip() for name in _TYPED)

    def entry(self, cluster: str) -> dict:
        return {"cluster": cluster, **self.cleaned_data}


class DiscoveryRows:
    """The panel's rows as posted (``bmc-<i>-address``, ...), or ``count`` empty ones. Rows left
    empty are left out; when every row is, the first one is checked, so what is missing shows
    next to its fields."""

    def __init__(self, data=None, *, count: int = 1) -> None:
        if data is None:
            indices = list(range(count))
        else:
            found = {int(m[1]) for key in data if (m := _ADDRESS_KEY.match(key))}
            indices = sorted(found) or [0]
        self.forms = [DiscoveryRowForm(data, prefix=f"{PREFIX}-{i}") for i in indices]
        self.next_index = indices[-1] + 1
        self.errors: list[str] = []  # what names no row
        self._filled: list[DiscoveryRowForm] = []

    @property
    def bound(self) -> bool:
        return self.forms[0].is_bound

    @property
    def invalid(self) -> bool:
        return bool(self.errors) or any(form.errors for form in self._filled)

    def entries(self, cluster: str) -> list[dict] | None:
        """The entries to discover, or None when a row (or the count) is wrong: the reasons are
        then next to their fields, or in ``errors``."""
        self._filled = [form for form in self.forms if not form.is_blank()] or self.forms[:1]
        self.forms = self._filled  # shown again without the empty rows
        if len(self._filled) > MAX_ENTRIES:
            self.errors.append(f"at most {MAX_ENTRIES} BMCs at once, got {len(self._filled)}")
            return None
        valid = [form.is_valid() for form in self._filled]  # every row checked
        if not all(valid):
            return None
        return [form.entry(cluster) for form in self._filled]

    def add_service_errors(self, error: ValidationError) -> None:
        """The service names ``entries[i].field``: the i-th row that was sent."""
        for key, messages in error.message_dict.items():
            match = _ENTRY_KEY.match(key)
            if match is None or int(match[1]) >= len(self._filled):
                self.errors.extend(messages)
                continue
            form, field = self._filled[int(match[1])], match[2]
            form.add_error(field if field in form.fields else None, messages)


@dataclass(frozen=True)
class DiscoveryShown:
    """The discovery the panel shows: the run (a refused run's fresh preview in its place,
    with ``stale`` the refused one), its change lines and summary."""

    run: DiscoveryRun | None
    stale: DiscoveryRun | None = None
    lines: tuple[str, ...] = ()
    summary: str = ""

    @property
    def polling(self) -> bool:
        """Being read or applied: the panel asks again shortly."""
        return self.run is not None and self.run.state in DiscoveryRun.ACTIVE


@dataclass(frozen=True)
class DiscoveryListed:
    run: DiscoveryRun
    bmcs: str  # what it read, in a few words


def discovery_context(
    cluster: Cluster, *, run: DiscoveryRun | None = None, rows: DiscoveryRows | None = None
) -> dict:
    """The panel's part of the cluster page: one query (its recent runs). Without ``run``, the
    newest run is shown while it waits for a worker or for an operator to apply it."""
    runs = discoveries_of_cluster(cluster.name)
    if (
        run is None
        and runs
        and runs[0].state in (*DiscoveryRun.ACTIVE, DiscoveryRun.State.PREVIEWED)
    ):
        run = runs[0]
    return {
        "discovery_rows": rows or DiscoveryRows(),
        "discovery": _shown(run),
        "discoveries": [DiscoveryListed(listed, _bmcs(listed)) for listed in runs],
    }


def _shown(run: DiscoveryRun | None) -> DiscoveryShown:
    if run is None:
        return DiscoveryShown(run=None)
    stale = None
    if run.state == DiscoveryRun.State.REFUSED and run.fresh_run is not None:
        stale, run = run, run.fresh_run
    result = run_result(run)
    return DiscoveryShown(run=run, stale=stale, lines=tuple(result.lines()), summary=_summary(run))


def _summary(run: DiscoveryRun) -> str:
    shown = (DiscoveryRun.State.PREVIEWED, DiscoveryRun.State.APPLYING, DiscoveryRun.State.APPLIED)
    return run_result(run).summary() if run.state in shown else ""


def _bmcs(run: DiscoveryRun) -> str:
    """ "node h100-001 (Rediscover)", or the addresses read ("https://10.0.0.5 and 2 more")."""
    if run.node_id is not None and run.entries:
        return f"node {run.entries[0].get('hostname', '')} (Rediscover)"
    addresses = [entry.get("address", "") for entry in run.entries]
    more = len(addresses) - 2
    return ", ".join(addresses[:2]) + (f" and {more} more" if more > 0 else "")
