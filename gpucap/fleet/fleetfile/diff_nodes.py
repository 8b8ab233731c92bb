"""Comparing a fleet file's nodes with the database: part of `FleetDiff`."""

from gpucap.fleet import rules
from gpucap.fleet.fleetfile.spec import NodeSpec
from gpucap.fleet.fleetfile.words import compact, fixed_field, table_text
from gpucap.fleet.models import Node


class NodesDiff:
    """Nodes, their GPUs and the capacity sets they join and leave. A part of `FleetDiff`,
    which holds the file, the database's rows and the bookkeeping used here."""

    def _plan_nodes(self) -> None:
        # Nodes the file does not declare keep their subnets; the file's own are checked
        # against each other already (`checks`).
        declared = {(spec.cluster, spec.hostname) for spec in self.file.nodes}
        kept_subnets = [
            node for key, node in self.nodes.items() if key not in declared and node.guest_subnet
        ]
        tenant_slugs = set(self.tenants) | {t.slug for t in self.file.tenants}
        for spec in self.file.nodes:
            self._check_node_subnet(spec, kept_subnets)
            self._check_node_set(spec)
            if spec.dedicated_to is not None and spec.dedicated_to not in tenant_slugs:
                self._problem(
                    spec.where,
                    f"dedicated_to: no tenant {spec.dedicated_to} in the file or the database",
                )
            node = self.nodes.get((spec.cluster, spec.hostname))
            if node is None:
                self._plan_new_node(spec)
            else:
                self._plan_existing_node(spec, node)

    def _check_node_subnet(self, spec: NodeSpec, kept_subnets: list[Node]) -> None:
        if not spec.guest_subnet:
            return
        for node in kept_subnets:
            if rules.guest_subnets_overlap(spec.guest_subnet, node.guest_subnet):
                self._problem(
                    spec.where,
                    f"guest_subnet: {spec.guest_subnet} overlaps {node.guest_subnet} of node "
                    f"{node.hostname} (cluster {node.cluster.name}, not in the file); guests "
                    "are told apart by address across the fleet",
                )
                return

    def _check_node_set(self, spec: NodeSpec) -> None:
        if spec.capacity_set is None:
            return
        facts = self._set_facts(spec.capacity_set)
        if facts is None:
            self._problem(
                spec.where,
                f"capacity_set: no capacity set named {spec.capacity_set} "
                "in the file or the database",
            )
            return
        cluster, gpu_model, fabric = facts
        problem = rules.node_join_problem(
            hostname=spec.hostname,
            cluster=spec.cluster,
            gpu_model=spec.gpu_model,
            fabric=spec.fabric,
            set_name=spec.capacity_set,
            set_cluster=cluster,
            set_gpu_model=gpu_model,
            set_fabric=fabric,
        )
        if problem:
            self._problem(spec.where, f"capacity_set: {problem}")

    def _plan_new_node(self, spec: NodeSpec) -> None:
        what = f"{spec.gpu_count} x {spec.gpu_model} {spec.fabric}"
        where_to = f"set {spec.capacity_set}" if spec.capacity_set else "standalone"
        extra = [f"state {spec.state}"] if spec.state not in (None, Node.State.READY) else []
        if spec.dedicated_to:
            extra.append(f"dedicated to {spec.dedicated_to}")
        self._change("create", "node", _node_label(spec), ", ".join([what, where_to, *extra]))
        self._step("nodes", spec.where, "node_create", spec=spec)
        self._plan_dedication(spec, None)
        if spec.capacity_set:
            self._step(
                "joins",
                spec.where,
                "node_join_set",
                cluster=spec.cluster,
                hostname=spec.hostname,
                capacity_set=spec.capacity_set,
            )

    def _plan_existing_node(self, spec: NodeSpec, node: Node) -> None:
        for field, value, wanted in (
            ("gpu_model", node.gpu_model, spec.gpu_model),
            ("fabric", node.fabric, spec.fabric),
            ("gpus", node.gpu_count, spec.gpu_count),
        ):
            if value != wanted:
                self._problem(spec.where, fixed_field(field, node.hostname, value, wanted, "node"))
        details = []
        described = self._plan_node_update(spec, node)
        details.extend(described)
        if spec.state is not None and spec.state != node.state:
            details.append(f"state {node.state} -> {spec.state}")
            self._step("nodes", spec.where, "node_set_state", node=node, state=spec.state)
        details.extend(self._plan_gpus(spec, node))
        details.extend(self._plan_dedication(spec, node))
        current_set = node.capacity_set.name if node.capacity_set else None
        if current_set != spec.capacity_set:
            details.append(
                f"capacity set {current_set or 'none (standalone)'} -> "
                f"{spec.capacity_set or 'none (standalone)'}"
            )
            if current_set is not None:
                self._step("leaves", spec.where, "node_leave_set", node=node)
            if spec.capacity_set is not None:
                self._step(
                    "joins" if current_set is None else "moves",
                    spec.where,
                    "node_join_set",
                    cluster=spec.cluster,
                    hostname=spec.hostname,
                    capacity_set=spec.capacity_set,
                )
        if details:
            self._change("update", "node", _node_label(spec), details)
        else:
            self.unchanged += 1

    def _plan_node_update(self, spec: NodeSpec, node: Node) -> list[str]:
        details = []
        changes: dict = {}
        if (node.partitions or None) != (spec.partitions or None):
            details.append(
                f"partitions {table_text(node.partitions)} -> {table_text(spec.partitions)}"
            )
            changes["partitions"] = spec.partitions
        if node.bmc_address != spec.bmc_address:
            details.append(
                f"bmc_address {node.bmc_address or '(none)'} -> {spec.bmc_address or '(none)'}"
            )
            changes["bmc_address"] = spec.bmc_address
        if node.labels != spec.labels:
            details.append(f"labels {compact(node.labels)} -> {compact(spec.labels)}")
            changes["labels"] = spec.labels
        for field in ("guest_bridge", "guest_subnet"):
            value, wanted = getattr(node, field), getattr(spec, field)
            if value != wanted:
                details.append(f"{field} {value or '(none)'} -> {wanted or '(none)'}")
                changes[field] = wanted
        if changes:
            self._step("nodes", spec.where, "node_update", node=node, **changes)
        return details

    def _plan_dedication(self, spec: NodeSpec, node: Node | None) -> list[str]:
        """Dedicate the node to the file's tenant, or share it again (no ``dedicated_to``)."""
        now = node.dedicated_tenant.slug if node is not None and node.dedicated_tenant else None
        if now == spec.dedicated_to:
            return []
        self._step(
            "dedications",
            spec.where,
            "node_set_dedicated_tenant",
            cluster=spec.cluster,
            hostname=spec.hostname,
            slug=spec.dedicated_to,
        )
        return [f"dedicated_to {now or '(shared)'} -> {spec.dedicated_to or '(shared)'}"]

    def _plan_gpus(self, spec: NodeSpec, node: Node) -> list[str]:
        details = []
        cards = {gpu.index: gpu for gpu in node.gpus.all()}
        module_ids = {}
        for listed in spec.gpus:
            gpu = cards.get(listed.index)
            if gpu is None:
                continue  # the GPU count mismatch is reported already
            for field in ("uuid", "pci_address"):
                wanted = getattr(listed, field)
                if wanted is not None and wanted != getattr(gpu, field):
                    self._problem(
                        spec.where,
                        f"gpu_list: GPU {listed.index} {field} cannot change in place (registered "
                        f"{getattr(gpu, field)}, the file says {wanted})",
                    )
            if listed.health is not None and listed.health != gpu.health:
                details.append(f"GPU {listed.index} health {gpu.health} -> {listed.health}")
                self._step("nodes", spec.where, "gpu_set_health", gpu=gpu, health=listed.health)
            if listed.module_id is not None and listed.module_id != gpu.module_id:
                was = "none" if gpu.module_id is None else gpu.module_id
                details.append(f"GPU {listed.index} module_id {was} -> {listed.module_id}")
                module_ids[listed.index] = listed.module_id
        if module_ids:
            # One step for the node: cards may swap module ids.
            self._step("nodes", spec.where, "node_set_module_ids", node=node, module_ids=module_ids)
        return details


def _node_label(spec: NodeSpec) -> str:
    return f"{spec.cluster}/{spec.hostname}"
