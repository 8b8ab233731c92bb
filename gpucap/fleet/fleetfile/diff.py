"""Comparing a fleet file with the database (``fleet_file_apply`` runs the result)."""

import json
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import check_password

from gpucap.audit.services import Actor
from gpucap.fleet.fleetfile.diff_nodes import NodesDiff
from gpucap.fleet.fleetfile.diff_pools import PoolsDiff
from gpucap.fleet.fleetfile.diff_sections import SectionsDiff
from gpucap.fleet.fleetfile.spec import (
    ApplyResult,
    Change,
    FleetFile,
    MemberSpec,
    OperatorSpec,
    TenantSpec,
)
from gpucap.fleet.fleetfile.words import compact, fixed_field
from gpucap.fleet.models import CapacitySet, Cluster, Image, Node, Pool
from gpucap.roles import OPERATORS_GROUP
from gpucap.tenancy.models import Membership, Tenant


def _shown(value: object) -> str:
    """An image field's value in a change line: true/false, a port list, text as it is."""
    return compact(value) if not isinstance(value, bool | str) else json.dumps(value)


# The order steps run in. Floors come down before nodes leave sets and go up after nodes join
# them; nodes join a set before others leave it; pools are created before they are re-ranked.
PHASES = (
    "users",
    "tenants",
    "memberships",
    "operators",
    "clusters",
    "capacity_sets",
    "floors_down",
    "nodes",
    "joins",
    "leaves",
    "moves",
    "pools",
    "ranks",
    "floors_up",
    "pool_tenants",
    "dedications",  # after the tenants and the nodes they name
    "images",  # after the nodes: an image's per-node paths name them
    "sections",  # the sets' sections (`sections`): after the sets, their nodes and pools
)


@dataclass(frozen=True)
class Step:
    """One service call of an apply: ``action`` names it (gpucap.fleet.fleetfile.apply runs
    it), ``where`` is the item of the file it comes from."""

    where: str
    action: str
    kwargs: dict


class FleetDiff(NodesDiff, PoolsDiff, SectionsDiff):
    """Compares the file with the database: finds the problems, the changes and the service
    calls that make them, in a safe order. Nodes and pools are compared in `diff_nodes` and
    `diff_pools`, the sets' sections (their schedules) in `diff_sections`."""

    def __init__(self, fleet_file: FleetFile, *, actor: Actor) -> None:
        self.file = fleet_file
        self.actor = actor
        self.problems: list[str] = []
        self.changes: list[Change] = []
        self.unchanged = 0
        self.steps: dict[str, list[Step]] = {p: [] for p in PHASES}
        self.sections_left_as_is: list[tuple[str, list[str]]] = []
        self._load()

    def _load(self) -> None:
        users = get_user_model().objects
        usernames = {m.username for t in self.file.tenants for m in t.members}
        usernames |= {o.username for o in self.file.operators}
        self.users = {u.username: u for u in users.filter(username__in=usernames)}
        self.operators = set(
            users.filter(is_staff=True, groups__name=OPERATORS_GROUP).values_list(
                "username", flat=True
            )
        )
        self.tenants = {t.slug: t for t in Tenant.objects.all()}
        self.memberships = {
            (m.tenant.slug, m.user.username): m
            for m in Membership.objects.select_related("tenant", "user")
        }
        self.clusters = {c.name: c for c in Cluster.objects.all()}
        self.sets = {s.name: s for s in CapacitySet.objects.select_related("cluster")}
        self.nodes = {
            (n.cluster.name, n.hostname): n
            for n in Node.objects.select_related(
                "cluster", "capacity_set", "dedicated_tenant"
            ).prefetch_related("gpus")
        }
        self.pools = {
            p.name: p
            for p in Pool.objects.select_related("cluster", "capacity_set").prefetch_related(
                "tenants"
            )
        }
        self.images = {(i.cluster.name, i.name): i for i in Image.objects.select_related("cluster")}

    # bookkeeping

    def _problem(self, where: str, text: str) -> None:
        self.problems.append(f"{where}: {text}")

    def _change(self, verb: str, noun: str, label: str, details: list[str] | str) -> None:
        detail = details if isinstance(details, str) else "; ".join(details)
        self.changes.append(Change(verb=verb, noun=noun, label=label, detail=detail))

    def _step(self, phase: str, where: str, action: str, **kwargs: object) -> None:
        """Schedule ``action(**kwargs, actor=...)`` to run in ``phase``."""
        self.steps[phase].append(Step(where=where, action=action, kwargs=kwargs))

    def plan(self) -> None:
        self._plan_people()
        self._plan_clusters()
        self._plan_capacity_sets()
        self._plan_nodes()
        self._plan_pools()
        self._check_floors()
        self._plan_images()
        self._plan_sections()

    def result(self, *, dry_run: bool) -> ApplyResult:
        return ApplyResult(
            changes=tuple(self.changes),
            unchanged=self.unchanged,
            left_as_is=tuple(
                (noun, tuple(labels)) for noun, labels in self._left_as_is() if labels
            ),
            dry_run=dry_run,
        )

    # people

    def _plan_people(self) -> None:
        declared: dict[str, MemberSpec | OperatorSpec] = {}
        passwords: dict[str, str] = {}
        for person in [m for t in self.file.tenants for m in t.members] + list(self.file.operators):
            first = declared.setdefault(person.username, person)
            if first.email is None and person.email is not None:
                declared[person.username] = person
            if person.password is not None:
                passwords.setdefault(person.username, person.password)
        for username, person in declared.items():
            self._plan_user(person, passwords.get(username))
        for tenant in self.file.tenants:
            self._plan_tenant(tenant)
        for operator in self.file.operators:
            if operator.username in self.operators:
                self.unchanged += 1
                continue
            self._change("create", "operator", operator.username, "staff in group operators")
            self._step("operators", operator.where, "operator_grant", username=operator.username)

    def _plan_user(self, person: MemberSpec | OperatorSpec, password: str | None) -> None:
        user = self.users.get(person.username)
        if user is None:
            self._change("create", "user", person.username, person.email or "no email")
            self._step(
                "users",
                person.where,
                "user_create",
                username=person.username,
                email=person.email or "",
                password=password,
            )
            return
        details = []
        email = None
        if person.email is not None and person.email != user.email:
            details.append(f"email {user.email or '(none)'} -> {person.email}")
            email = person.email
        if password is not None and not check_password(password, user.password):
            details.append("password set from the file")
        else:
            password = None
        if not details:
            self.unchanged += 1
            return
        self._change("update", "user", person.username, details)
        self._step("users", person.where, "user_update", user=user, email=email, password=password)

    def _plan_tenant(self, spec: TenantSpec) -> None:
        tenant = self.tenants.get(spec.slug)
        if tenant is None:
            self._change("create", "tenant", spec.slug, spec.name)
            self._step("tenants", spec.where, "tenant_create", name=spec.name, slug=spec.slug)
        elif tenant.name != spec.name:
            self._change("update", "tenant", spec.slug, f"name {tenant.name} -> {spec.name}")
            self._step("tenants", spec.where, "tenant_rename", tenant=tenant, name=spec.name)
        else:
            self.unchanged += 1
        for member in spec.members:
            label = f"{spec.slug}/{member.username}"
            membership = self.memberships.get((spec.slug, member.username))
            if membership is not None and membership.role == member.role:
                self.unchanged += 1
                continue
            if membership is None:
                self._change("create", "membership", label, member.role)
            else:
                self._change(
                    "update", "membership", label, f"role {membership.role} -> {member.role}"
                )
            self._step(
                "memberships",
                member.where,
                "membership_set",
                username=member.username,
                slug=spec.slug,
                role=member.role,
            )

    # clusters and capacity sets

    def _plan_clusters(self) -> None:
        for spec in self.file.clusters:
            cluster = self.clusters.get(spec.name)
            if cluster is None:
                self._change("create", "cluster", spec.name, f"driver {spec.driver}")
                self._step(
                    "clusters",
                    spec.where,
                    "cluster_create",
                    name=spec.name,
                    driver=spec.driver,
                    driver_settings=spec.driver_settings,
                )
                continue
            details = []
            if cluster.driver != spec.driver:
                details.append(f"driver {cluster.driver} -> {spec.driver}")
            if cluster.driver_settings != spec.driver_settings:
                details.append(
                    f"driver_settings {compact(cluster.driver_settings)} -> "
                    f"{compact(spec.driver_settings)}"
                )
            if not details:
                self.unchanged += 1
                continue
            self._change("update", "cluster", spec.name, details)
            self._step(
                "clusters",
                spec.where,
                "cluster_update",
                cluster=cluster,
                driver=spec.driver,
                driver_settings=spec.driver_settings,
            )

    def _cluster_known(self, name: str) -> bool:
        return name in self.clusters or any(c.name == name for c in self.file.clusters)

    def _set_facts(self, name: str) -> tuple[str, str, str] | None:
        """(cluster, GPU model, fabric) of a set, as it will be once the file is applied."""
        for spec in self.file.capacity_sets:
            if spec.name == name:
                return spec.cluster, spec.gpu_model, spec.fabric
        capacity_set = self.sets.get(name)
        if capacity_set is None:
            return None
        return capacity_set.cluster.name, capacity_set.gpu_model, capacity_set.fabric

    def _plan_capacity_sets(self) -> None:
        for spec in self.file.capacity_sets:
            if not self._cluster_known(spec.cluster):
                self._problem(
                    spec.where,
                    f"cluster: no cluster named {spec.cluster} in the file or the database",
                )
            capacity_set = self.sets.get(spec.name)
            if capacity_set is None:
                self._change(
                    "create",
                    "capacity set",
                    spec.name,
                    f"{spec.gpu_model} {spec.fabric} in {spec.cluster}, notice "
                    f"{spec.notice_seconds} s, starts in dry_run",
                )
                self._step("capacity_sets", spec.where, "capacity_set_create", spec=spec)
                continue
            now = {
                "cluster": capacity_set.cluster.name,
                "gpu_model": capacity_set.gpu_model,
                "fabric": capacity_set.fabric,
            }
            for field, value in now.items():
                wanted = getattr(spec, field)
                if wanted != value:
                    self._problem(spec.where, fixed_field(field, spec.name, value, wanted, "set"))
            if capacity_set.notice_seconds == spec.notice_seconds:
                self.unchanged += 1
                continue
            self._change(
                "update",
                "capacity set",
                spec.name,
                f"notice_seconds {capacity_set.notice_seconds} -> {spec.notice_seconds}",
            )
            self._step(
                "capacity_sets",
                spec.where,
                "capacity_set_update",
                capacity_set=capacity_set,
                notice_seconds=spec.notice_seconds,
            )

    # the image catalogue

    def _plan_images(self) -> None:
        for spec in self.file.images:
            label = f"{spec.cluster}/{spec.name}"
            if not self._cluster_known(spec.cluster):
                self._problem(
                    spec.where,
                    f"cluster: no cluster named {spec.cluster} in the file or the database",
                )
                continue
            hosts = {h for c, h in self.nodes if c == spec.cluster}
            hosts |= {n.hostname for n in self.file.nodes if n.cluster == spec.cluster}
            for host in sorted(set(spec.node_paths) - hosts):
                self._problem(
                    spec.where,
                    f"node_paths: {host} is not a node of cluster {spec.cluster} in the file or "
                    "the database",
                )
            image = self.images.get((spec.cluster, spec.name))
            wanted = spec.fields()
            if image is None:
                self._change("create", "image", label, f"base {spec.base_image}")
                self._step("images", spec.where, "image_create", spec=spec)
                continue
            details = [
                f"{field} {_shown(getattr(image, field))} -> {_shown(value)}"
                for field, value in wanted.items()
                if getattr(image, field) != value
            ]
            if not details:
                self.unchanged += 1
                continue
            self._change("update", "image", label, details)
            self._step("images", spec.where, "image_update", image=image, **wanted)

    # what the database holds beyond the file

    def _left_as_is(self) -> list[tuple[str, list[str]]]:
        f = self.file
        member_keys = {(t.slug, m.username) for t in f.tenants for m in t.members}
        node_keys = {(n.cluster, n.hostname) for n in f.nodes}
        return [
            ("tenant", sorted(set(self.tenants) - {t.slug for t in f.tenants})),
            ("membership", sorted(f"{s}/{u}" for s, u in set(self.memberships) - member_keys)),
            ("operator", sorted(self.operators - {o.username for o in f.operators})),
            ("cluster", sorted(set(self.clusters) - {c.name for c in f.clusters})),
            ("capacity set", sorted(set(self.sets) - {s.name for s in f.capacity_sets})),
            ("node", sorted(f"{c}/{h}" for c, h in set(self.nodes) - node_keys)),
            ("pool", sorted(set(self.pools) - {p.name for p in f.pools})),
            (
                "image",
                sorted(
                    f"{c}/{n}"
                    for c, n in set(self.images) - {(i.cluster, i.name) for i in f.images}
                ),
            ),
            *self.sections_left_as_is,
        ]
