"""Talking to one BMC over Redfish with sushy (docs/bmc.md, "How gpucap speaks Redfish").

Plain Python, like the arbiter: no Django, no database, no app (an import contract holds it).
A ``BmcTarget`` in, frozen dataclasses (``gpucap.bmc.inventory``) out, or a ``BmcError`` whose
message names the node and says what went wrong, and whose ``kind`` tells a caller whether
trying again can help. Nothing here changes anything on the BMC.
"""

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import requests
import sushy
from sushy import auth as sushy_auth
from sushy import exceptions as sushy_errors
from sushy.connector import Connector

from gpucap.bmc.inventory import (
    FAILED,
    OK,
    CpuInventory,
    GpuInventory,
    NicInventory,
    SystemInventory,
)

# What went wrong (``BmcError.kind``).
CREDENTIALS = "credentials"  # the BMC refused the user name or password
UNREACHABLE = "unreachable"  # no answer: refused, unresolvable, timed out (transient)
TLS = "tls"  # its certificate does not verify
NOT_REDFISH = "not_redfish"  # something answers HTTP there, but not Redfish
REFUSED = "refused"  # the BMC answered a request with an error
INVENTORY = "inventory"  # a Redfish service without what gpucap needs

ROOT = "/redfish/v1/"
# GPUs whose BMC says this are failed: a card that is broken, offline or gone.
_FAILED_HEALTH = {"Critical"}
_FAILED_STATE = {"UnavailableOffline", "Absent"}
_BDF = re.compile(r"([0-9a-fA-F]{4}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")


class BmcError(Exception):
    """A BMC call that did not work; the message is shown to operators as it is."""

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind

    @property
    def transient(self) -> bool:
        """Whether the same call may work later (a task retries it with backoff)."""
        return self.kind == UNREACHABLE


@dataclass(frozen=True)
class BmcTarget:
    """One BMC and how to reach it. ``name`` is what messages call it: "node h100-001", or
    for a machine not registered yet, its address."""

    name: str
    address: str
    username: str
    password: str = field(repr=False)
    verify_tls: bool = True
    ca_bundle: str = ""  # a CA file or directory instead of the system's store
    system_id: str = ""  # "": the BMC's only ComputerSystem
    connect_timeout: float = 5
    read_timeout: float = 30

    @property
    def url(self) -> str:
        """The BMC's base URL: HTTPS unless the address names its scheme."""
        address = self.address.strip().rstrip("/")
        return address if "://" in address else f"https://{address}"

    @property
    def verify(self) -> bool | str:
        """What requests verifies the certificate with: the CA bundle, the system's, or not."""
        if not self.verify_tls:
            return False
        return self.ca_bundle or True


def inventory_read(target: BmcTarget) -> SystemInventory:
    """The machine behind ``target``: system, CPUs, memory, NICs and GPUs."""
    with bmc_session(target) as root:
        system = bmc_call(target, lambda: system_of(root, target))
        return bmc_call(target, lambda: _inventory(root, system))


# --- the session and its errors ------------------------------------------------------------------


class _TimedConnector(Connector):
    """sushy's connector with our timeouts on every request (sushy's default is 60 s per
    request, connect and read alike)."""

    def __init__(self, url: str, *, verify: bool | str, timeouts: tuple[float, float]) -> None:
        # Two quick retries of a GET the BMC answered 5xx: BMCs are flaky, but a task must not
        # sit for sushy's default of ten retries three seconds apart.
        super().__init__(url, verify=verify, server_side_retries=2, server_side_retries_delay=1)
        self._timeouts = timeouts

    def _op(self, method, path="", data=None, headers=None, blocking=False, timeout=60, **kw):
        if not blocking:
            timeout = self._timeouts
        return super()._op(method, path, data, headers, blocking=blocking, timeout=timeout, **kw)


@contextmanager
def bmc_session(target: BmcTarget) -> Iterator[sushy.Sushy]:
    """The BMC's service root, read with Basic auth (a Redfish session would cost a round
    trip and hold one of the BMC's few session slots)."""
    connector = _TimedConnector(
        target.url,
        verify=target.verify,
        timeouts=(target.connect_timeout, target.read_timeout),
    )
    # From the first request on: sushy reads the service root before its auth is set up, and
    # some BMCs refuse even the root to a client without credentials.
    connector.set_http_basic_auth(target.username, target.password)
    try:
        root = bmc_call(target, lambda: _root(target, connector), reading_root=True)
        yield root
    finally:
        connector.close()


def _root(target: BmcTarget, connector: Connector) -> sushy.Sushy:
    root = sushy.Sushy(
        target.url,
        auth=sushy_auth.BasicAuth(username=target.username, password=target.password),
        connector=connector,
    )
    if not root.json.get("RedfishVersion"):
        raise BmcError(
            f"{target.name}: {target.url} answers HTTP but is not a Redfish service "
            f"(GET {ROOT} names no RedfishVersion)",
            kind=NOT_REDFISH,
        )
    return root


def bmc_call(target: BmcTarget, read, *, reading_root: bool = False, action: str = ""):
    """Run ``read`` and turn whatever sushy or requests raise into a ``BmcError`` that says
    what happened in an operator's words. ``action`` names the Redfish action ``read`` asks
    for (``ComputerSystem.Reset``), so that a refusal says which, with the BMC's own words."""
    where = f"{target.name}: the BMC at {target.url}"
    try:
        return read()
    except BmcError:
        raise
    except sushy_errors.AccessError as error:
        raise BmcError(
            f"{where} refused the user name or password (HTTP {error.status_code})",
            kind=CREDENTIALS,
        ) from None
    except sushy_errors.ConnectionError as error:
        raise _unreachable(target, where, error.__context__) from None
    except sushy_errors.ResourceNotFoundError as error:
        if reading_root:
            raise BmcError(
                f"{target.name}: {target.url} answers HTTP but is not a Redfish service "
                f"(GET {ROOT} gave HTTP 404)",
                kind=NOT_REDFISH,
            ) from None
        raise BmcError(f"{where} has no {error.url} (HTTP 404)", kind=INVENTORY) from None
    except sushy_errors.HTTPError as error:
        if action:
            raise BmcError(
                f"{where} refused {action} (HTTP {error.status_code}: {_said(error)})",
                kind=REFUSED,
            ) from None
        raise BmcError(
            f"{where} answered {error.method} {error.url} with HTTP {error.status_code}: "
            f"{_said(error)}",
            kind=REFUSED,
        ) from None
    except sushy_errors.MissingActionError as error:
        raise BmcError(
            f"{where} does not offer {action or 'that action'} ({error})", kind=REFUSED
        ) from None
    except sushy_errors.InvalidParameterValueError as error:
        raise BmcError(f"{where} does not offer that: {error}", kind=REFUSED) from None
    except sushy_errors.UnknownDefaultError:
        raise BmcError(
            f"{where} manages more than one system; name the one to use (its system id)",
            kind=INVENTORY,
        ) from None
    except sushy_errors.MissingAttributeError as error:
        kind = NOT_REDFISH if reading_root else INVENTORY
        raise BmcError(f"{where} gave an incomplete answer: {error}", kind=kind) from None
    except ValueError as error:  # a body that is not JSON (requests' JSONDecodeError)
        if reading_root:
            raise BmcError(
                f"{target.name}: {target.url} answers HTTP but is not a Redfish service "
                f"(GET {ROOT} is not JSON)",
                kind=NOT_REDFISH,
            ) from None
        raise BmcError(
            f"{where} answered with something that is not JSON: {error}", kind=INVENTORY
        ) from None


def _unreachable(target: BmcTarget, where: str, cause: BaseException | None) -> BmcError:
    if isinstance(cause, requests.exceptions.SSLError):
        return BmcError(
            f"{where}: its TLS certificate does not verify ({_errno_text(cause)}); fix the "
            "certificate, give its CA, or turn TLS verification off for this BMC",
            kind=TLS,
        )
    if isinstance(cause, requests.exceptions.ConnectTimeout):
        why = f"no connection within {target.connect_timeout:g} s"
    elif isinstance(cause, requests.exceptions.Timeout):
        why = f"no answer within {target.read_timeout:g} s"
    else:
        why = _errno_text(cause)
    return BmcError(
        f"{target.name}: no answer from the BMC at {target.url} ({why})", kind=UNREACHABLE
    )


def _errno_text(cause: BaseException | None) -> str:
    """ "connection refused", "name or service not known", ...: the OS's words for why, out of
    requests' long chained message."""
    text = str(cause or "")
    match = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if match:
        return match.group(1).strip().lower()
    return text.splitlines()[0][:200] if text else "no reason given"


def _said(error: sushy_errors.HTTPError) -> str:
    return (getattr(error, "detail", None) or str(error))[:300]


# --- reading the inventory ------------------------------------------------------------------------


def system_of(root: sushy.Sushy, target: BmcTarget):
    """The ComputerSystem ``target`` names, or the BMC's only one."""
    if target.system_id:
        systems = root.get_system_collection()
        path = f"{systems.path.rstrip('/')}/{target.system_id}"
        return root.get_system(path)
    return root.get_system()


def _inventory(root: sushy.Sushy, system) -> SystemInventory:
    doc = system.json
    cpus, gpus = [], []
    for processor in _members(system.json, "Processors", root):
        kind = processor.get("ProcessorType")
        if kind == "CPU":
            cpus.append(_cpu(processor))
        elif kind == "GPU":
            gpus.append(processor)
    memory = (doc.get("MemorySummary") or {}).get("TotalSystemMemoryGiB")
    return SystemInventory(
        redfish_id=str(doc.get("Id", "")),
        manufacturer=_text(doc.get("Manufacturer")),
        model=_text(doc.get("Model")),
        serial_number=_text(doc.get("SerialNumber")),
        uuid=_text(doc.get("UUID")).lower(),
        host_name=_text(doc.get("HostName")),
        power_state=_text(doc.get("PowerState")).lower(),
        cpus=tuple(cpus),
        memory_gib=float(memory) if isinstance(memory, int | float) else None,
        nics=tuple(_nic(nic) for nic in _members(doc, "EthernetInterfaces", root)),
        gpus=_gpus(root, gpus),
    )


def _members(doc: dict, collection: str, root: sushy.Sushy) -> list[dict]:
    """The JSON of each member of the collection ``doc`` links to ([] when it links none)."""
    path = (doc.get(collection) or {}).get("@odata.id")
    if not path:
        return []
    listed = _get(root, path).get("Members") or []
    return [_get(root, member["@odata.id"]) for member in listed if "@odata.id" in member]


def _get(root: sushy.Sushy, path: str) -> dict:
    return root._conn.get(path=path).json()


def _cpu(doc: dict) -> CpuInventory:
    return CpuInventory(
        redfish_id=str(doc.get("Id", "")),
        model=_text(doc.get("Model")),
        cores=_int(doc.get("TotalCores")),
        threads=_int(doc.get("TotalThreads")),
    )


def _nic(doc: dict) -> NicInventory:
    link = doc.get("LinkStatus")
    return NicInventory(
        redfish_id=str(doc.get("Id", "")),
        mac_address=_text(doc.get("MACAddress") or doc.get("PermanentMACAddress")).lower(),
        speed_mbps=_int(doc.get("SpeedMbps")),
        link_up=None if link is None else link == "LinkUp",
    )


def _gpus(root: sushy.Sushy, docs: list[dict]) -> tuple[GpuInventory, ...]:
    """The GPUs in the host's order: by PCI address (nvidia-smi's default), those without one
    last, by their Redfish id."""
    read = [(doc, _pci_address(root, doc)) for doc in docs]
    read.sort(key=lambda pair: (pair[1] is None, pair[1] or "", str(pair[0].get("Id", ""))))
    return tuple(_gpu(index, doc, address) for index, (doc, address) in enumerate(read))


def _gpu(index: int, doc: dict, pci_address: str | None) -> GpuInventory:
    status = doc.get("Status") or {}
    health, state = status.get("Health"), status.get("State")
    failed = health in _FAILED_HEALTH or state in _FAILED_STATE
    uuid = _text(doc.get("UUID")).lower()
    if uuid and not uuid.startswith("gpu-"):
        uuid = f"GPU-{uuid}"
    elif uuid:
        uuid = f"GPU-{uuid[4:]}"
    location = (doc.get("Location") or {}).get("PartLocation") or {}
    return GpuInventory(
        index=index,
        redfish_id=str(doc.get("Id", "")),
        model=_text(doc.get("Model")),
        manufacturer=_text(doc.get("Manufacturer")),
        serial_number=_text(doc.get("SerialNumber")),
        uuid=uuid,
        pci_address=pci_address,
        health=FAILED if failed else OK,
        bmc_health=_text(state if state in _FAILED_STATE else health),
        slot=_int(location.get("LocationOrdinalValue")),
    )


def _pci_address(root: sushy.Sushy, gpu: dict) -> str | None:
    """The GPU's PCI address from its PCIe function: the bus numbers PCIeFunction v1.6 gives,
    else a ``dddd:bb:dd.f`` in the function's or device's id; None when neither says."""
    links = gpu.get("Links") or {}
    functions = [f["@odata.id"] for f in links.get("PCIeFunctions") or [] if "@odata.id" in f]
    device_path = (links.get("PCIeDevice") or {}).get("@odata.id")
    device = _get(root, device_path) if device_path else None
    if not functions and device is not None:
        functions = [
            member["@odata.id"]
            for member in _get_members_of(root, device.get("PCIeFunctions"))
            if "@odata.id" in member
        ]
    for path in functions[:1]:
        function = _get(root, path)
        address = _bus_numbers(function) or _bdf_in(function.get("Id"))
        if address:
            return address
    return _bdf_in(device.get("Id")) if device is not None else None


def _get_members_of(root: sushy.Sushy, link: dict | None) -> list[dict]:
    path = (link or {}).get("@odata.id")
    return (_get(root, path).get("Members") or []) if path else []


def _bus_numbers(function: dict) -> str | None:
    parts = [function.get(key) for key in ("SegmentNumber", "BusNumber", "DeviceNumber")]
    number = function.get("FunctionNumber")
    if any(part is None for part in parts) or number is None:
        return None
    try:
        segment, bus, device = (int(str(part), 16) for part in parts)
        func = int(str(number), 16)
    except ValueError:
        return None
    if segment > 0xFFFF or bus > 0xFF or device > 0x1F or func > 7:
        return None
    return f"{segment:04x}:{bus:02x}:{device:02x}.{func}"


def _bdf_in(text: object) -> str | None:
    match = _BDF.search(str(text or ""))
    if match is None:
        return None
    segment, bus, device, func = match.groups()
    return f"{segment.lower()}:{bus.lower()}:{device.lower()}.{func}"


def _text(value: object) -> str:
    return "" if value is None else str(value).strip()


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
