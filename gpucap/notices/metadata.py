"""The instance metadata endpoint: guests read their own interruption notice over HTTP, in the
wire formats of EC2 (IMDSv2), GCP and Azure, plus a native one (DESIGN.md section 5), and,
ahead of it, whether a proposed plan would reclaim them ("at risk": EC2's rebalance
recommendation, a GCP attribute, a native path).

Every guest polls it every few seconds, so it is a raw ASGI app mounted in front of Django
(``metadata_front`` in gpucap/asgi.py): one Redis GET per request (the document
gpucap.notices.cache keeps per VM address), no session, CSRF, template or ORM. Only the rare
acknowledgement goes to the database, in a thread.

The VM is the request's source address; behind a trusted per-node proxy
(``METADATA_TRUSTED_PROXIES``), the last address that proxy added to ``X-Forwarded-For``. A
request carrying ``X-Forwarded-For`` from anyone else is refused: a guest could otherwise claim
another VM's address. IMDSv2 tokens need no storage: ``<expiry>.<HMAC(address, expiry)>``.

While its Redis cannot be reached, or holds no full resync (it restarted empty: no
``SYNCED_KEY``), the endpoint answers 503 with ``Retry-After`` in each flavour's own format,
never a false "no VM at this address"; an empty store is rebuilt at once (gpucap/edge/resync.py).
"""

import asyncio
import base64
import hashlib
import hmac
import ipaddress
import json
import time
import uuid
from datetime import UTC, datetime
from email.utils import format_datetime
from functools import lru_cache
from urllib.parse import parse_qs

import redis.asyncio as aioredis
import redis.exceptions
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections

from gpucap import inputs
from gpucap.edge.http import (
    BodyTooLarge,
    ClientGone,
    answer_or_500,
    read_body,
    send_json,
    send_text,
)
from gpucap.edge.loops import PerLoop, lifespan
from gpucap.edge.resync import CLAIM_SECONDS, RETRY_AFTER_SECONDS, StoreUnsynced, resync_start
from gpucap.errors import Conflict
from gpucap.metrics import METADATA_LATENCY, METADATA_REQUESTS
from gpucap.notices import cache
from gpucap.notices.cache import metadata_key, metadata_resync
from gpucap.notices.services import notice_acknowledge
from gpucap.redis_clients import async_redis
from gpucap.rentals.models import VirtualMachine

PREFIXES = ("/latest/", "/computeMetadata/", "/metadata/")
TOKEN_TTL_MAX = 21600
WAIT_FOR_CHANGE_MAX_SECONDS = 60
# How often a GCP long-poll re-reads the key: a new notice reaches a waiting guest this fast.
WAIT_POLL_SECONDS = 0.25
BODY_LIMIT = 64 * 1024


def metadata_front(django_app):
    """The deployed ASGI application: metadata paths to the endpoint, the rest to Django."""

    async def application(scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith(PREFIXES):
            await metadata_app(scope, receive, send)
        elif scope["type"] == "lifespan":
            # Its shutdown closes every app's clients of the loop (gpucap.edge.loops).
            await lifespan(receive, send)
        else:
            await django_app(scope, receive, send)

    return application


async def metadata_app(scope, receive, send) -> None:
    """Answer one request, counted in gpucap_metadata_requests_total and timed in
    gpucap_metadata_request_duration_seconds (a GCP long-poll is counted, not timed: its wait
    is the guest's choice)."""
    started = time.perf_counter()
    status = 500  # unless a response starts

    async def send_counted(message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        await send(message)

    try:
        await answer_or_500(_answer, scope, receive, send_counted, body=_server_error_body)
    finally:
        flavour = _flavour(scope["path"])
        _requests_counter(flavour, status).inc()
        if b"wait_for_change" not in scope["query_string"]:
            _latency_histogram(flavour).observe(time.perf_counter() - started)


def _server_error_body(request_id: str) -> dict:
    return {"error": f"the metadata service failed to answer (request id {request_id})"}


async def _answer(scope, receive, send) -> None:
    request = _Request(scope, receive)
    address = guest_address(scope.get("client"), request.headers.get("x-forwarded-for"))
    if address is None:
        await _text(send, 403, "X-Forwarded-For is accepted only from a trusted proxy")
        return
    methods = _ROUTES.get(scope["path"])
    if methods is None:
        await _text(send, 404, "not found")
        return
    handler = methods.get(scope["method"])
    if handler is None:
        allow = ", ".join(methods)
        await _text(send, 405, "method not allowed", headers=[(b"allow", allow.encode())])
        return
    try:
        await handler(request, address, send)
    except StoreUnsynced:
        await _unavailable(scope["path"], send, "the metadata service is catching up")
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        await _unavailable(scope["path"], send, "the metadata service cannot reach its store")


async def _unavailable(path: str, send, reason: str) -> None:
    """503 with Retry-After, in the asking flavour's own format. Handlers read the store before
    they answer, so nothing has been sent yet."""
    message = f"{reason}; retry in {RETRY_AFTER_SECONDS} s"
    headers = [(b"retry-after", str(RETRY_AFTER_SECONDS).encode())]
    flavour = _flavour(path)
    if flavour == "gcp":
        await _text(send, 503, message, headers=[*headers, (b"metadata-flavor", b"Google")])
    elif flavour == "ec2":
        await _text(send, 503, message, headers=headers)
    else:
        await _json(send, 503, {"error": message}, headers=headers)


def _flavour(path: str) -> str:
    if path.startswith("/latest/"):
        return "ec2"
    if path.startswith("/computeMetadata/"):
        return "gcp"
    if path.startswith("/metadata/scheduledevents"):
        return "azure"
    return "native"


# The metrics' children, looked up once: labels() takes a lock on every call.
@lru_cache(maxsize=256)
def _requests_counter(flavour: str, status: int):
    return METADATA_REQUESTS.labels(flavour, str(status))


@lru_cache(maxsize=8)
def _latency_histogram(flavour: str):
    return METADATA_LATENCY.labels(flavour)


# --- who is asking ------------------------------------------------------------------------------


def guest_address(client: tuple[str, int] | None, forwarded: str | None) -> str | None:
    """The VM address a request speaks for, or None when it must be refused."""
    peer = client[0] if client else ""
    if forwarded is None:
        return peer
    if peer not in settings.METADATA_TRUSTED_PROXIES:
        return None
    # The proxy appends the address it saw; anything before it came from the guest.
    last = forwarded.rsplit(",", 1)[-1].strip()
    try:
        return str(ipaddress.ip_address(last))
    except ValueError:
        return None


# --- IMDSv2 session tokens ---------------------------------------------------------------------


def token_mint(*, address: str, ttl: int, now: float | None = None) -> str:
    expires = int(time.time() if now is None else now) + ttl
    return f"{expires}.{_token_signature(address, expires)}"


def token_valid(token: str, *, address: str, now: float | None = None) -> bool:
    """Whether ``token`` was minted for ``address`` and has not expired (constant-time)."""
    expires_text, _, signature = token.partition(".")
    if not (expires_text.isascii() and expires_text.isdigit()):
        return False
    expires = int(expires_text)
    expected = _token_signature(address, expires)
    matches = hmac.compare_digest(signature.encode(), expected.encode())
    return matches and expires > (time.time() if now is None else now)


def _token_signature(address: str, expires: int) -> str:
    digest = hmac.new(
        _token_key(settings.SECRET_KEY), f"{address}|{expires}".encode(), hashlib.sha256
    ).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


@lru_cache(maxsize=4)
def _token_key(secret_key: str) -> bytes:
    return hashlib.sha256(f"gpucap.notices.metadata.token|{secret_key}".encode()).digest()


# --- EC2 -----------------------------------------------------------------------------------------


async def ec2_token(request, address, send) -> None:
    raw = request.headers.get("x-aws-ec2-metadata-token-ttl-seconds", "")
    ttl = int(raw) if raw.isascii() and raw.isdigit() else 0
    if not 1 <= ttl <= TOKEN_TTL_MAX:
        await _text(send, 400, f"X-aws-ec2-metadata-token-ttl-seconds must be 1..{TOKEN_TTL_MAX}")
        return
    if await _document(address) is None:
        await _text(send, 404, "no VM at this address")
        return
    headers = [(b"x-aws-ec2-metadata-token-ttl-seconds", str(ttl).encode())]
    await _text(send, 200, token_mint(address=address, ttl=ttl), headers=headers)


def _ec2(render):
    """An IMDSv2 GET: a valid token for this address, then the VM's document."""

    async def handler(request, address, send) -> None:
        token = request.headers.get("x-aws-ec2-metadata-token")
        if token is None or not token_valid(token, address=address):
            await _text(send, 401, "a valid X-aws-ec2-metadata-token is required")
            return
        document = await _document(address)
        body = None if document is None else render(document)
        if body is None:
            await _text(send, 404, "not found")
            return
        await _text(send, 200, body)

    return handler


# The VM's address and SSH key, as EC2 serves them, for images that read the metadata service
# rather than their NoCloud seed. One key, under index 0; EC2 names it after its key pair, and a
# VM's key here has no other name than "gpucap". A document published before these fields
# existed answers 404 until the next resync.
_EC2_KEY_NAME = "gpucap"


def _public_key(document) -> str | None:
    key = document.get("key")
    return f"{key}\n" if key else None


def _user_data(document) -> str | None:
    """The tenant's own user-data, as given; EC2 and GCP answer 404 for a VM without any."""
    return document.get("user_data") or None


def _instance_action(document) -> str | None:
    notice = document["notice"]
    if notice is None:
        return None
    return json.dumps({"action": "stop", "time": notice["deadline"]}, separators=(",", ":"))


def _termination_time(document) -> str | None:
    notice = document["notice"]
    return None if notice is None else notice["deadline"]


def _rebalance(document) -> str | None:
    """EC2's rebalance recommendation: present (``{"noticeTime": ...}``) while a proposed plan
    would reclaim the VM, 404 otherwise, as before AWS emits one. The interruption notice stays
    where it was (``spot/instance-action``)."""
    since = document.get("at_risk_since")
    return None if since is None else json.dumps({"noticeTime": since}, separators=(",", ":"))


# --- GCP -----------------------------------------------------------------------------------------


async def gcp_preempted(request, address, send) -> None:
    flavor = [(b"metadata-flavor", b"Google")]
    if request.headers.get("metadata-flavor") != "Google":
        await _text(send, 403, "Missing Metadata-Flavor:Google header.", headers=flavor)
        return
    query = request.query()
    document = await _document(address)
    if document is None:
        await _text(send, 404, "no VM at this address", headers=flavor)
        return
    value = _preempted(document)
    if query.get("wait_for_change", "").lower() == "true":
        raw = query.get("timeout_sec", str(WAIT_FOR_CHANGE_MAX_SECONDS))
        if not (raw.isascii() and raw.isdigit() and 1 <= int(raw) <= WAIT_FOR_CHANGE_MAX_SECONDS):
            await _text(send, 400, f"timeout_sec must be 1..{WAIT_FOR_CHANGE_MAX_SECONDS}")
            return
        last_etag = query.get("last_etag")
        if last_etag is None or last_etag == _etag(value):
            document = await _wait_for_change(address, value, timeout=int(raw))
            if document is None:
                await _text(send, 404, "no VM at this address", headers=flavor)
                return
            value = _preempted(document)
    headers = [*flavor, (b"etag", _etag(value).encode())]
    await _text(send, 200, value, headers=headers)


async def _wait_for_change(address: str, value: str, *, timeout: int) -> dict | None:
    """The document once ``preempted`` differs from ``value`` (or is gone), else at timeout."""
    deadline = time.monotonic() + timeout
    document = None
    while time.monotonic() < deadline:
        await asyncio.sleep(min(WAIT_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
        document = await _document(address)
        if document is None or _preempted(document) != value:
            return document
    return document


def _gcp(render):
    """A GCP GET: the ``Metadata-Flavor: Google`` header, then the VM's document; answers
    carry the header back, as GCP's do."""
    flavor = [(b"metadata-flavor", b"Google")]

    async def handler(request, address, send) -> None:
        if request.headers.get("metadata-flavor") != "Google":
            await _text(send, 403, "Missing Metadata-Flavor:Google header.", headers=flavor)
            return
        document = await _document(address)
        body = None if document is None else render(document)
        if body is None:
            await _text(send, 404, "not found", headers=flavor)
            return
        await _text(send, 200, body, headers=flavor)

    return handler


def _gcp_ssh_keys(document) -> str | None:
    """GCP's ``ssh-keys`` attribute: ``<user>:<public key>`` per line, read by the guest
    agent and by OS Login-less images."""
    key, user = document.get("key"), document.get("user")
    return f"{user}:{key}\n" if key and user else None


def _gcp_at_risk(document) -> str | None:
    """The ``gpucap-at-risk`` attribute: when a proposed plan first named the VM as a victim;
    absent (404, as GCP answers for an attribute that is not set) while none names it."""
    return document.get("at_risk_since")


def _preempted(document) -> str:
    return "FALSE" if document["notice"] is None else "TRUE"


def _etag(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


# --- Azure ---------------------------------------------------------------------------------------


async def azure_events(request, address, send) -> None:
    if request.headers.get("metadata") != "true":
        await _json(send, 400, {"error": "Bad request. Required metadata header not specified"})
        return
    document = await _document(address)
    if document is None:
        await _json(send, 404, {"error": "no VM at this address"})
        return
    await _json(send, 200, scheduled_events(document))


async def azure_start(request, address, send) -> None:
    if request.headers.get("metadata") != "true":
        await _json(send, 400, {"error": "Bad request. Required metadata header not specified"})
        return
    body = await request.body()
    event_ids, problem = _start_requests(body)
    if problem:
        await _json(send, 400, {"error": problem})
        return
    document = await _document(address)
    if document is None:
        await _json(send, 404, {"error": "no VM at this address"})
        return
    current = {event["EventId"] for event in scheduled_events(document)["Events"]}
    unknown = [event_id for event_id in event_ids if event_id not in current]
    if unknown:
        await _json(
            send, 400, {"error": f"StartRequests: no scheduled event {unknown[0]!r} for this VM"}
        )
        return
    if not await _acknowledge(address, document["vm"]):
        await _json(send, 404, {"error": "no open notice for this VM"})
        return
    await _json(send, 200, {})


def scheduled_events(document) -> dict:
    notice = document["notice"]
    if notice is None:
        return {"DocumentIncarnation": 0, "Events": []}
    issued_at = _parse_z(notice["issued_at"])
    return {
        # Changes whenever the event does, as Azure's counter does.
        "DocumentIncarnation": int(issued_at.timestamp()),
        "Events": [
            {
                "EventId": event_id(document["vm"], notice["issued_at"]),
                "EventType": "Preempt",
                "ResourceType": "VirtualMachine",
                "Resources": [document["vm"]],
                "EventStatus": "Scheduled",
                "NotBefore": format_datetime(_parse_z(notice["deadline"]), usegmt=True),
                "Description": f"Virtual machine is being preempted ({notice['reason']}).",
                "EventSource": "Platform",
                "DurationInSeconds": -1,
            }
        ],
    }


def event_id(vm: str, issued_at: str) -> str:
    """Stable for one notice, different for the next."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpucap:notice:{vm}:{issued_at}")).upper()


def _start_requests(body: bytes) -> tuple[list[str], str]:
    try:
        payload = inputs.json_loads(body)
    except inputs.JsonTooDeep as error:
        return [], f"the body is {error}"
    except (ValueError, UnicodeDecodeError):
        return [], 'the body must be JSON: {"StartRequests": [{"EventId": ...}]}'
    requests = payload.get("StartRequests") if isinstance(payload, dict) else None
    if not isinstance(requests, list) or not requests:
        return [], 'StartRequests: must be a non-empty list of {"EventId": ...}'
    event_ids = []
    for n, item in enumerate(requests):
        value = item.get("EventId") if isinstance(item, dict) else None
        if not isinstance(value, str) or not value:
            return [], f"StartRequests[{n}].EventId: must be a non-empty string"
        event_ids.append(value)
    return event_ids, ""


# --- native --------------------------------------------------------------------------------------


async def native_interruption(request, address, send) -> None:
    document = await _document(address)
    if document is None:
        await _json(send, 404, {"error": "no VM at this address"})
        return
    notice = document["notice"]
    if notice is None:
        await _json(send, 404, {"error": "no interruption notice"})
        return
    seconds_left = max(0, int(_parse_z(notice["deadline"]).timestamp() - time.time()))
    await _json(send, 200, {**notice, "seconds_left": seconds_left})


async def native_at_risk(request, address, send) -> None:
    """``{"at_risk": bool, "since": time or null}``: whether a proposed plan would reclaim the
    VM, ahead of any notice."""
    document = await _document(address)
    if document is None:
        await _json(send, 404, {"error": "no VM at this address"})
        return
    since = document.get("at_risk_since")
    await _json(send, 200, {"at_risk": since is not None, "since": since})


async def native_ack(request, address, send) -> None:
    await request.body()
    document = await _document(address)
    if document is None:
        await _json(send, 404, {"error": "no VM at this address"})
        return
    if document["notice"] is None or not await _acknowledge(address, document["vm"]):
        await _json(send, 404, {"error": "no interruption notice"})
        return
    await _json(send, 200, {"acknowledged": True, "vm": document["vm"]})


# --- acknowledgement (the rare write path: database, in a thread) -------------------------------


async def _acknowledge(address: str, instance_id: str) -> bool:
    return await sync_to_async(_acknowledge_in_database)(address, instance_id)


def _acknowledge_in_database(address: str, instance_id: str) -> bool:
    """Stop the VM now if the database agrees it is at ``address`` with an open notice."""
    pk = instance_id.removeprefix("vm-")
    try:
        vm = VirtualMachine.objects.filter(pk=int(pk), ip_address=address).first()
        if vm is None:
            return False
        notice_acknowledge(vm=vm)
        return True
    except (Conflict, ValueError):
        return False
    finally:
        # Rare enough not to keep a connection open in this thread between acknowledgements.
        connections.close_all()


# --- plumbing ------------------------------------------------------------------------------------


class _Request:
    def __init__(self, scope, receive) -> None:
        self.scope = scope
        self.receive = receive
        self.headers: dict[str, str] = {}
        for name, value in scope["headers"]:
            key = name.decode("latin-1")
            text = value.decode("latin-1")
            self.headers[key] = f"{self.headers[key]},{text}" if key in self.headers else text

    def query(self) -> dict[str, str]:
        parsed = parse_qs(self.scope["query_string"].decode("latin-1"))
        return {name: values[-1] for name, values in parsed.items()}

    async def body(self) -> bytes:
        """The body, cut at BODY_LIMIT (a longer one then fails to parse as JSON); empty when
        the guest went away."""
        try:
            return await read_body(self.receive, limit=BODY_LIMIT)
        except ClientGone:
            return b""
        except BodyTooLarge as error:
            return error.received[:BODY_LIMIT]


async def _document(address: str) -> dict | None:
    """The VM's document, None when there is no VM at ``address``; raises StoreUnsynced when
    the store cannot tell (no full resync in it), having had it rebuilt."""
    client = _redis.get()
    raw, synced = await client.mget(metadata_key(address), cache.SYNCED_KEY)
    if raw is not None:
        return json.loads(raw)
    if synced is None:
        if await client.set(cache.RESYNC_CLAIM_KEY, b"1", nx=True, ex=CLAIM_SECONDS):
            resync_start("metadata", metadata_resync)
        raise StoreUnsynced
    return None


_redis: PerLoop[aioredis.Redis] = PerLoop(lambda: async_redis(settings.METADATA_REDIS_URL))

# Every answer is the guest's own and of this moment: no cache on the way may keep it.
_NO_STORE = ((b"cache-control", b"no-store"),)


async def _text(send, status: int, body: str, *, headers=()) -> None:
    await send_text(send, status, body, headers=(*_NO_STORE, *headers))


async def _json(send, status: int, payload: dict, *, headers=()) -> None:
    await send_json(send, status, payload, headers=(*_NO_STORE, *headers))


def _parse_z(moment: str) -> datetime:
    return datetime.strptime(moment, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


_ROUTES = {
    "/latest/api/token": {"PUT": ec2_token},
    "/latest/meta-data/instance-id": {"GET": _ec2(lambda document: document["vm"])},
    "/latest/meta-data/local-ipv4": {"GET": _ec2(lambda document: document.get("ip"))},
    "/latest/meta-data/public-keys/": {
        "GET": _ec2(lambda document: f"0={_EC2_KEY_NAME}" if document.get("key") else None)
    },
    "/latest/meta-data/public-keys/0/": {
        "GET": _ec2(lambda document: "openssh-key" if document.get("key") else None)
    },
    "/latest/meta-data/public-keys/0/openssh-key": {"GET": _ec2(_public_key)},
    "/latest/meta-data/spot/instance-action": {"GET": _ec2(_instance_action)},
    "/latest/meta-data/spot/termination-time": {"GET": _ec2(_termination_time)},
    "/latest/meta-data/events/recommendations/rebalance": {"GET": _ec2(_rebalance)},
    "/latest/user-data": {"GET": _ec2(_user_data)},
    "/computeMetadata/v1/instance/preempted": {"GET": gcp_preempted},
    "/computeMetadata/v1/instance/attributes/user-data": {"GET": _gcp(_user_data)},
    "/computeMetadata/v1/instance/attributes/ssh-keys": {"GET": _gcp(_gcp_ssh_keys)},
    "/computeMetadata/v1/instance/attributes/gpucap-at-risk": {"GET": _gcp(_gcp_at_risk)},
    "/metadata/scheduledevents": {"GET": azure_events, "POST": azure_start},
    "/metadata/v1/interruption": {"GET": native_interruption},
    "/metadata/v1/interruption/ack": {"POST": native_ack},
    "/metadata/v1/at-risk": {"GET": native_at_risk},
}
