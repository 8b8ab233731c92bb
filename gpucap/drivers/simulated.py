"""The simulated fleet (the default driver): GPU VMs that boot, get an address, stop and start
like real ones, with no hypervisor and no GPU, so the whole product runs on a laptop.

The fleet lives in Redis, not in process memory: the web process, every Celery worker and the
beat all see the same VMs, as they would with a real hypervisor. Keys, under
``gpucap:sim:<namespace>:`` (the namespace defaults to the database name, so each installation
and each test database has a fleet of its own):

- ``vm:<node>:<instance_id>`` — one VM as JSON. A VM exists per node, as a libvirt domain does:
  asking another node about it answers ``missing``.
- ``fail:<operation>`` and ``fail:<operation>:<instance_id>`` — an injected failure, a hash with
  ``message``, ``transient`` (``1``: ``DriverUnavailable``, else ``DriverError``), ``after``
  (``1``: the call takes effect, then raises, as when a reply is lost) and ``remaining`` (how
  many more calls fail; absent: until deleted). Tests use ``failure_inject``; an operator's
  chaos drill can use redis-cli, e.g.
  ``HSET gpucap:sim:gpucap:fail:create message "node on fire" transient 1 remaining 3``.
- ``dead:<instance_id>`` — the model server of that inference replica has died
  (``replica_kill``): its connections drop unanswered while its VM runs on.
- ``silent:<node>`` — that node's hypervisor does not answer (``hypervisor_silence``), as a
  node that hung or lost power: its probe says no until the key is gone
  (``hypervisor_restore``). For a demo: ``SET gpucap:sim:gpucap:silent:h100-004 1``.
  A cluster whose settings name a ``probe_tcp_port`` asks its nodes' port instead
  (``gpucap.drivers.tcp_probe``).

A cluster's ``driver_settings`` may also say ``{"fail": {"create": "message"}}`` (or
``{"create": {"message": "...", "transient": true}}``): every such call fails while the
setting stays.

Timing uses the Redis server's clock, so processes with skewed clocks agree on when a VM has
booted. Addresses are data only (10.200.0.0/13, one per instance id); nothing contacts them.
An inference replica's endpoint is the model simulator this app serves
(gpucap/drivers/model_simulator.py) at ``SIMULATOR_BASE_URL/simulated/replicas/<instance_id>``.
"""

import ipaddress
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from hashlib import blake2b
from typing import Any

import redis
from django.conf import settings as django_settings
from django.db import connections

from gpucap import redis_clients
from gpucap.drivers.base import (
    BOOTING,
    MISSING,
    RUNNING,
    STOPPED,
    STOPPING,
    DriverError,
    DriverUnavailable,
    VmSpec,
    VmStatus,
    settings_parse,
)
from gpucap.drivers.tcp_probe import ProbeSettings

KEY_PREFIX = "gpucap:sim:"
OPERATIONS = ("create", "stop", "start", "destroy", "status")
NETWORK = ipaddress.ip_network("10.200.0.0/13")
_HOSTS_PER_24 = 254  # .1 to .254 of each /24: no address ends in .0 or .255


def _failures_problem(failures: dict) -> str:
    for operation, failure in failures.items():
        if operation not in OPERATIONS:
            return f"unknown operation {operation!r} (known: {', '.join(OPERATIONS)})"
        message = failure.get("message") if isinstance(failure, dict) else failure
        if not isinstance(message, str) or not message:
            return f'{operation}: give a message, or {{"message": "...", "transient": true}}'
    return ""


@dataclass(frozen=True)
class SimulatedSettings(ProbeSettings):
    """With the hypervisor probe's (``ProbeSettings``): by default a node answers unless the
    fleet silenced it; with ``probe_tcp_port`` set, the node's port is asked (simulated VMs on
    real machines: a lab's recovery drill)."""

    boot_seconds: float = field(default=3.0, metadata={"minimum": 0})
    stop_seconds: float = field(default=0.0, metadata={"minimum": 0})
    grace_seconds: float = field(default=30.0, metadata={"minimum": 0})
    fail: dict = field(default_factory=dict, metadata={"check": _failures_problem})


class SimulatedDriver:
    """See the module docstring. ``namespace`` and ``redis_client`` are for tests."""

    def __init__(
        self,
        settings: Mapping[str, Any] | None = None,
        *,
        namespace: str | None = None,
        redis_client: redis.Redis | None = None,
    ) -> None:
        self.settings = settings_parse(SimulatedSettings, settings, driver="simulated")
        self.namespace = namespace or connections["default"].settings_dict["NAME"]
        self.redis = redis_client or redis_clients.redis_client(
            django_settings.REDIS_URL, decode_responses=True
        )
        self._prefix = f"{KEY_PREFIX}{self.namespace}:"
        self._consume_failure = self.redis.register_script(_CONSUME_FAILURE)

    # --- the driver interface ------------------------------------------------------------------

    def create(self, spec: VmSpec) -> VmStatus:
        def boot(vm: dict | None, now: float) -> dict:
            if vm is None:
                vm = {"instance_id": spec.instance_id, "node": spec.node, "state": STOPPED}
            if vm["state"] in (BOOTING, RUNNING):
                return vm
            # Defined but off (or on its way off): boot it with what the spec says now, as
            # a hypervisor boots a redefined domain.
            vm.update(
                role=spec.role,
                image=spec.image,
                gpus=[gpu.pci_address for gpu in spec.gpus],
                ip_address=ip_address_for(spec.instance_id),
            )
            return _booting(vm, now, self.settings.boot_seconds)

        return self._call("create", spec.instance_id, spec.node, boot)

    def stop(self, instance_id: str, node: str, *, grace_seconds: float | None = None) -> VmStatus:
        grace = self.settings.grace_seconds if grace_seconds is None else grace_seconds

        def shut_down(vm: dict | None, now: float) -> dict | None:
            if vm is None or vm["state"] in (STOPPING, STOPPED):
                return vm
            forced = self.settings.stop_seconds > grace
            return {
                **vm,
                "state": STOPPING,
                "until": now + min(self.settings.stop_seconds, grace),
                "forced_after": grace if forced else None,
            }

        status = self._call("stop", instance_id, node, shut_down)
        # Like a hypervisor, return once the guest is off.
        while status.state == STOPPING:
            vm, now = self._read(self._vm_key(instance_id, node))
            if vm is not None and vm["state"] == STOPPING:
                time.sleep(min(max(vm["until"] - now, 0.01), 0.2))
            else:
                status = self._status(vm, now)
        return status

    def start(self, instance_id: str, node: str) -> VmStatus:
        def boot(vm: dict | None, now: float) -> dict:
            if vm is None:
                raise DriverError(f"{instance_id} is not defined on {node}; create it first")
            if vm["state"] in (BOOTING, RUNNING):
                return vm
            return _booting(vm, now, self.settings.boot_seconds)

        return self._call("start", instance_id, node, boot)

    def destroy(self, instance_id: str, node: str) -> VmStatus:
        return self._call("destroy", instance_id, node, lambda vm, now: None)

    def status(self, instance_id: str, node: str) -> VmStatus:
        self._fail_if_told("status", instance_id)
        return self._status(*self._read(self._vm_key(instance_id, node)))

    def hypervisor_answers(self, node: str) -> bool:
        if self.settings.probe_by_tcp():
            return self.settings.probe_answers(node)
        try:
            return not self.redis.exists(self._silent_key(node))
        except redis.RedisError:
            return False  # the simulated fleet itself is out of reach

    # --- failure injection ---------------------------------------------------------------------

    def failure_inject(
        self,
        operation: str,
        message: str,
        *,
        times: int | None = 1,
        transient: bool = False,
        after: bool = False,
        instance_id: str | None = None,
    ) -> None:
        """Make the next ``times`` calls of ``operation`` fail with ``message`` (``times=None``:
        until ``failures_clear``), for one VM or for any. ``transient`` raises
        ``DriverUnavailable`` (the task retries), else ``DriverError``. ``after``: the call
        takes effect first, then raises, as when the hypervisor's reply is lost."""
        if operation not in OPERATIONS:
            raise ValueError(f"unknown operation {operation!r}; one of {', '.join(OPERATIONS)}")
        if times is not None and times < 1:
            raise ValueError(f"times must be at least 1 or None, got {times}")
        key = self._failure_key(operation, instance_id)
        failure = {"message": message, "transient": int(transient), "after": int(after)}
        if times is not None:
            failure["remaining"] = times
        with self.redis.pipeline() as pipe:
            pipe.delete(key).hset(key, mapping=failure).execute()

    def hypervisor_silence(self, node: str) -> None:
        """The node's hypervisor stops answering (a hung host, a power loss) until
        ``hypervisor_restore``. Its VMs are left as they are."""
        self.redis.set(self._silent_key(node), 1)

    def hypervisor_restore(self, node: str) -> None:
        self.redis.delete(self._silent_key(node))

    def failures_clear(self) -> None:
        self._delete_matching(f"{self._prefix}fail:*")

    def reset(self) -> None:
        """Forget every VM, injected failure, dead replica and silent hypervisor of this
        namespace."""
        self._delete_matching(f"{self._prefix}*")

    # --- the model servers of inference replicas ----------------------------------------------

    def replica_kill(self, instance_id: str) -> None:
        """The replica's model server dies: every connection to it closes with no answer, as a
        crashed process's would, until ``replica_revive``. The VM itself runs on."""
        self.redis.set(replica_dead_key(self.namespace, instance_id), 1)

    def replica_revive(self, instance_id: str) -> None:
        self.redis.delete(replica_dead_key(self.namespace, instance_id))

    # --- inside ------------------------------------------------------------------------------

    def _call(
        self,
        operation: str,
        instance_id: str,
        node: str,
        change: Callable[[dict | None, float], dict | None],
    ) -> VmStatus:
        failure = self._fail_if_told(operation, instance_id)
        key = self._vm_key(instance_id, node)

        def attempt(pipe: redis.client.Pipeline) -> tuple[dict | None, float]:
            now = _seconds(pipe.time())
            vm = _advanced(change(_advanced(_loads(pipe.get(key)), now), now), now)
            pipe.multi()
            if vm is None:
                pipe.delete(key)
            else:
                pipe.set(key, json.dumps(vm))
            return vm, now

        try:
            vm, now = self.redis.transaction(attempt, key, value_from_callable=True)
        except redis.RedisError as error:
            raise DriverUnavailable(f"simulated fleet unreachable: {error}") from error
        if failure is not None:  # an ``after`` failure: done, but the caller hears an error
            raise failure
        return self._status(vm, now)

    def _fail_if_told(self, operation: str, instance_id: str) -> DriverError | None:
        """Raise an injected failure for this call, or return it to raise after the call."""
        configured = self.settings.fail.get(operation)
        if configured is not None:
            if isinstance(configured, str):
                raise DriverError(configured)
            error = DriverUnavailable if configured.get("transient") else DriverError
            raise error(configured["message"])
        keys = [self._failure_key(operation, instance_id), self._failure_key(operation, None)]
        try:
            injected = self._consume_failure(keys=keys)
        except redis.RedisError as error:
            raise DriverUnavailable(f"simulated fleet unreachable: {error}") from error
        if injected is None:
            return None
        message, transient, after = injected
        failure = (DriverUnavailable if transient == "1" else DriverError)(message)
        if after == "1":
            return failure
        raise failure

    def _read(self, key: str) -> tuple[dict | None, float]:
        try:
            with self.redis.pipeline(transaction=False) as pipe:
                raw, clock = pipe.get(key).time().execute()
        except redis.RedisError as error:
            raise DriverUnavailable(f"simulated fleet unreachable: {error}") from error
        now = _seconds(clock)
        return _advanced(_loads(raw), now), now

    def _status(self, vm: dict | None, now: float) -> VmStatus:
        if vm is None:
            return VmStatus(state=MISSING)
        if vm["state"] != RUNNING:
            message = ""
            if vm["state"] == STOPPED and vm.get("forced_after") is not None:
                message = f"forced off: the guest did not shut down within {vm['forced_after']:g} s"
            return VmStatus(state=vm["state"], message=message)
        return VmStatus(state=RUNNING, ip_address=vm["ip_address"], endpoint_url=_endpoint_url(vm))

    def _vm_key(self, instance_id: str, node: str) -> str:
        return f"{self._prefix}vm:{node}:{instance_id}"

    def _silent_key(self, node: str) -> str:
        return f"{self._prefix}silent:{node}"

    def _failure_key(self, operation: str, instance_id: str | None) -> str:
        suffix = f":{instance_id}" if instance_id else ""
        return f"{self._prefix}fail:{operation}{suffix}"

    def _delete_matching(self, pattern: str) -> None:
        keys = list(self.redis.scan_iter(match=pattern, count=500))
        if keys:
            self.redis.delete(*keys)


def ip_address_for(instance_id: str) -> str:
    """A stable address per instance id: ``vm-1`` is 10.200.0.1, ``vm-255`` is 10.200.1.1.
    Distinct for the first 520,192 numeric ids; other ids hash into the same range."""
    digits = re.search(r"(\d+)$", instance_id)
    if digits:
        number = int(digits.group(1))
    else:
        number = int.from_bytes(blake2b(instance_id.encode(), digest_size=8).digest(), "big")
    subnets = NETWORK.num_addresses // 256
    slot = (number - 1) % (subnets * _HOSTS_PER_24)
    subnet, host = divmod(slot, _HOSTS_PER_24)
    return str(NETWORK.network_address + subnet * 256 + host + 1)


def replica_url(instance_id: str) -> str:
    """Where the model simulator answers for one replica (gpucap/drivers/model_simulator.py)."""
    return f"{django_settings.SIMULATOR_BASE_URL}/simulated/replicas/{instance_id}"


def replica_dead_key(namespace: str, instance_id: str) -> str:
    return f"{KEY_PREFIX}{namespace}:dead:{instance_id}"


def _endpoint_url(vm: dict) -> str | None:
    """Where an inference replica's model server listens: the OpenAI-compatible model
    simulator this app serves (DESIGN.md section 10). Other VMs serve nothing."""
    if vm.get("role") != "inference_replica":
        return None
    return replica_url(vm["instance_id"])


def _booting(vm: dict, now: float, boot_seconds: float) -> dict:
    # A VM on its way off boots once it is off.
    begins = max(now, vm["until"]) if vm["state"] == STOPPING else now
    return {**vm, "state": BOOTING, "until": begins + boot_seconds, "forced_after": None}


def _advanced(vm: dict | None, now: float) -> dict | None:
    """Where the VM is by ``now``: a boot or a shutdown completes at its ``until``."""
    if vm is None or vm["state"] not in (BOOTING, STOPPING) or now < vm["until"]:
        return vm
    return {**vm, "state": RUNNING if vm["state"] == BOOTING else STOPPED}


def _loads(raw: str | None) -> dict | None:
    return None if raw is None else json.loads(raw)


def _seconds(clock: tuple[int, int]) -> float:
    seconds, microseconds = clock
    return seconds + microseconds / 1_000_000


# Take one injected failure, if any: the VM's own first, then the operation's. Atomic, so two
# workers never both consume the last one.
_CONSUME_FAILURE = """
    for _, key in ipairs(KEYS) do
      local failure = redis.call('HMGET', key, 'message', 'transient', 'after', 'remaining')
      if failure[1] then
        local remaining = tonumber(failure[4])
        if remaining ~= nil and remaining <= 1 then
          redis.call('DEL', key)
        elseif remaining ~= nil then
          redis.call('HSET', key, 'remaining', remaining - 1)
        end
        if remaining == nil or remaining >= 1 then
          return {failure[1], failure[2] or '0', failure[3] or '0'}
        end
      end
    end
    return nil
"""
