"""The billing webhook against a real HTTP receiver on 127.0.0.1: every delivery is signed, a
failed one is retried after its backoff with the same batch id and records, the receiver ends
with every record exactly once, and two pushers at once send each batch once."""

import json
import socket
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import connection

from gpucap.rentals import services as rentals
from gpucap.usage import export, selectors, services
from gpucap.usage.models import BillingDelivery, BillingWebhook, UsageRecord
from gpucap.usage.services import PushOutcome
from gpucap.usage.webhook import signature_header, verify_signature

SECRET = "whsec-test-0123456789abcdef"


def at(hour: int, minute: int = 0, day: int = 2) -> datetime:
    return datetime(2026, 11, day, hour, minute, tzinfo=UTC)


class Receiver:
    """A billing system's endpoint: checks each delivery's signature, answers the statuses it
    is told to (then 200), sleeps ``delay`` seconds first, and keeps what it accepted."""

    def __init__(self) -> None:
        self.answers: list[int] = []
        self.delay = 0.0
        self.deliveries: list[dict] = []  # every request, accepted or not
        self.accepted: dict[str, dict] = {}  # record id -> record, de-duplicated like a ledger
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    receiver.in_flight += 1
                    receiver.max_in_flight = max(receiver.max_in_flight, receiver.in_flight)
                    status = receiver.answers.pop(0) if receiver.answers else 200
                try:
                    time.sleep(receiver.delay)
                    signed = verify_signature(SECRET, self.headers["Gpucap-Signature"], body, 300)
                    status = status if signed else 401
                    with receiver.lock:
                        payload = json.loads(body)
                        receiver.deliveries.append(
                            {
                                "status": status,
                                "signed": signed,
                                "headers": dict(self.headers),
                                "payload": payload,
                            }
                        )
                        if status == 200:
                            for record in payload["records"]:
                                receiver.accepted[record["x_RecordId"]] = record
                    self.send_response(status)
                    self.end_headers()
                    self.wfile.write(b"ok" if status == 200 else b"ledger unavailable")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the pusher gave up waiting: what a real receiver would see
                finally:
                    with receiver.lock:
                        receiver.in_flight -= 1

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/billing/usage"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def batches(self) -> list[str]:
        return [d["headers"]["Gpucap-Batch"] for d in self.deliveries]


@pytest.fixture
def receiver():
    the_receiver = Receiver()
    the_receiver.thread.start()
    yield the_receiver
    the_receiver.server.shutdown()
    the_receiver.server.server_close()


@pytest.fixture
def records(clock, pools, run_vm, tenant, other_tenant) -> list[UsageRecord]:
    """Five final records: acme's spot VM over three hours, globex's on-demand VM over two."""
    clock.set(at(9, 30))
    trainer = run_vm(tenant, "h100-spot", "h100-001", [0, 1], name="trainer")
    notebook = run_vm(other_tenant, "l40s-ondemand", "l40s-001", [0], name="notebook")
    clock.set(at(10, 45))
    rentals.vm_mark_stopped(vm=rentals.vm_stop(vm=notebook))
    clock.set(at(11, 15))
    rentals.vm_mark_stopped(vm=rentals.vm_stop(vm=trainer))
    clock.set(at(12, 5))
    services.usage_record()
    made = list(UsageRecord.objects.order_by("id"))
    assert len(made) == 5
    return made


def configure(url: str, *, batch_size: int = 3, enabled: bool = True) -> BillingWebhook:
    return services.billing_webhook_configure(
        url=url, secret=SECRET, enabled=enabled, batch_size=batch_size, actor=None
    )


def hook() -> BillingWebhook:
    return BillingWebhook.objects.get()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- signatures ---------------------------------------------------------------------------------


def test_a_signature_verifies_only_with_the_secret_the_body_and_a_fresh_timestamp():
    body = b'{"batch": {"id": "1-3"}}'
    header = signature_header(SECRET, body, timestamp=1_764_460_800)

    assert verify_signature(SECRET, header, body, 300, now=1_764_460_900)
    assert not verify_signature("another-secret-0123456789", header, body, 300, now=1_764_460_900)
    assert not verify_signature(SECRET, header, body + b" ", 300, now=1_764_460_900)
    assert not verify_signature(SECRET, header, body, 300, now=1_764_460_800 + 301)
    assert not verify_signature(
        SECRET, header.replace("t=1764460800", "t=1764460801"), body, 300, now=1_764_460_900
    )
    assert not verify_signature(SECRET, None, body)
    assert not verify_signature(SECRET, "v1=deadbeef", body)


# --- deliveries ---------------------------------------------------------------------------------


def test_a_batch_refused_with_500_is_retried_after_backoff_and_every_record_arrives_once(
    clock, records, receiver
):
    configure(receiver.url, batch_size=3)
    receiver.answers = [500]

    first = services.billing_push()

    assert first.outcome == PushOutcome.FAILED and first.delivery.status_code == 500
    state = hook()
    assert state.cursor == 0 and state.consecutive_failures == 1
    assert "HTTP 500: ledger unavailable" in state.last_error
    backoff = state.next_attempt_at - clock.now
    assert timedelta(seconds=24) <= backoff <= timedelta(seconds=30)

    # Before the backoff is over nothing is sent.
    assert services.billing_push(now=clock.now + backoff / 2).outcome == PushOutcome.WAITING
    assert len(receiver.deliveries) == 1

    clock.advance(seconds=31)
    retried = services.billing_push()
    assert retried.outcome == PushOutcome.ACCEPTED and retried.delivery.attempt == 2
    assert hook().cursor == records[2].pk  # advanced once, past exactly the first batch
    assert services.billing_push().outcome == PushOutcome.ACCEPTED
    assert services.billing_push().outcome == PushOutcome.IDLE

    failed, retry, second = receiver.deliveries
    assert all(d["signed"] for d in receiver.deliveries)
    # The retry is the same batch: same id, same records, nothing else.
    batch_id = f"{records[0].pk}-{records[2].pk}"
    assert failed["headers"]["Gpucap-Batch"] == retry["headers"]["Gpucap-Batch"] == batch_id
    assert retry["headers"]["Idempotency-Key"] == f"gpucap-batch-{batch_id}"
    assert [h["headers"]["Gpucap-Attempt"] for h in (failed, retry, second)] == ["1", "2", "1"]
    assert failed["payload"]["records"] == retry["payload"]["records"]
    assert retry["payload"]["batch"] == {
        "id": batch_id,
        "first_record": records[0].pk,
        "last_record": records[2].pk,
        "count": 3,
    }
    accepted_ids = [r["x_RecordId"] for d in (retry, second) for r in d["payload"]["records"]]
    assert accepted_ids == [r.record_id for r in records]  # each once, in record order
    state = hook()
    assert state.cursor == records[-1].pk and state.consecutive_failures == 0
    assert state.last_success_at == clock.now and state.last_error == ""
    assert list(BillingDelivery.objects.order_by("id").values_list("accepted", "status_code")) == [
        (False, 500),
        (True, 200),
        (True, 200),
    ]


def test_deliveries_carry_the_same_focus_columns_as_the_exports(clock, records, receiver):
    configure(receiver.url, batch_size=100)

    services.billing_push()

    exported = [
        export.focus_row(row)
        for row in selectors.usage_rows(since=at(0), until=at(0, day=3), now=clock.now)
    ]
    delivered = receiver.deliveries[0]["payload"]["records"]
    assert sorted(delivered, key=lambda r: r["x_RecordId"]) == sorted(
        exported, key=lambda r: r["x_RecordId"]
    )
    assert set(delivered[0]) == set(export.COLUMNS)


def test_backoff_doubles_per_failure_up_to_an_hour(clock, records):
    configure(f"http://127.0.0.1:{closed_port()}/", batch_size=5)
    waits = []
    for _ in range(9):
        assert services.billing_push().outcome == PushOutcome.FAILED
        waits.append((hook().next_attempt_at - clock.now).total_seconds())
        clock.set(hook().next_attempt_at)

    ceilings = [30, 60, 120, 240, 480, 960, 1920, 3600, 3600]
    assert all(0.8 * c <= w <= c for w, c in zip(waits, ceilings, strict=True))
    assert hook().consecutive_failures == 9 and hook().cursor == 0


def test_a_refused_connection_is_recorded_and_nothing_advances(clock, records):
    configure(f"http://127.0.0.1:{closed_port()}/billing", batch_size=5)

    result = services.billing_push()

    assert result.outcome == PushOutcome.FAILED
    assert result.delivery.status_code is None
    assert "could not connect" in result.delivery.error and "refused" in result.delivery.error
    assert hook().cursor == 0 and hook().last_error == result.delivery.error


def test_a_receiver_that_answers_too_late_is_a_failure_and_the_retry_repeats_the_batch_id(
    clock, records, receiver, settings
):
    """The receiver may have booked a batch it answered too late: the retry carries the same
    batch id and record ids, so it can tell."""
    settings.BILLING_WEBHOOK_TIMEOUT_SECONDS = 1
    configure(receiver.url, batch_size=5)
    receiver.delay = 1.5

    result = services.billing_push()

    assert result.outcome == PushOutcome.FAILED
    assert result.delivery.error == "timed out: no answer within 1 s"
    assert hook().cursor == 0
    receiver.delay = 0
    clock.set(hook().next_attempt_at)
    assert services.billing_push().outcome == PushOutcome.ACCEPTED
    time.sleep(0.6)  # the slow handler finishes booking its copy
    assert len(set(receiver.batches())) == 1
    assert sorted(receiver.accepted) == sorted(r.record_id for r in records)


def test_redirects_are_not_followed(clock, records, receiver):
    configure(receiver.url, batch_size=5)
    receiver.answers = [301]

    result = services.billing_push()

    assert result.outcome == PushOutcome.FAILED
    assert "redirects are not followed" in result.delivery.error


def test_nothing_is_sent_while_the_webhook_is_off_or_missing(clock, records, receiver):
    assert services.billing_push().outcome == PushOutcome.NOT_CONFIGURED
    configure(receiver.url, enabled=False)
    assert services.billing_push().outcome == PushOutcome.DISABLED
    assert receiver.deliveries == [] and not BillingDelivery.objects.exists()


def test_send_now_ignores_the_backoff(clock, records, receiver):
    configure(receiver.url, batch_size=5)
    receiver.answers = [503]
    services.billing_push()

    assert services.billing_push().outcome == PushOutcome.WAITING
    assert services.billing_push(force=True).outcome == PushOutcome.ACCEPTED
    assert hook().cursor == records[-1].pk


def test_the_beat_task_drains_the_backlog_batch_after_batch(clock, records, receiver):
    from gpucap.usage import tasks

    configure(receiver.url, batch_size=2)

    assert tasks.billing_push() == ["accepted", "accepted", "accepted", "idle"]
    assert sorted(receiver.accepted) == sorted(r.record_id for r in records)


def test_a_pusher_that_died_mid_post_blocks_others_until_its_lease_ends_then_the_batch_repeats(
    clock, records, receiver
):
    """A pusher took the batch and died before it could record the answer (the receiver may
    or may not have booked it): nobody sends until its lease ends, then the same batch id."""
    configure(receiver.url, batch_size=2)
    dead = services._billing_claim(now=clock.now, force=False)  # the dead pusher's first step
    dead_batch = dead[0].batch_id

    assert services.billing_push().outcome == PushOutcome.BUSY
    clock.advance(seconds=services.billing_lease().total_seconds() + 1)
    assert services.billing_push().outcome == PushOutcome.ACCEPTED

    assert receiver.batches() == [dead_batch]
    assert hook().cursor == records[1].pk


# --- concurrency --------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_pushers_at_once_send_each_batch_once(clock, records, receiver):
    configure(receiver.url, batch_size=2)
    receiver.delay = 0.3  # long enough that the racers overlap
    outcomes: list[str] = []

    def pusher(barrier: threading.Barrier) -> None:
        try:
            barrier.wait(timeout=10)
            outcomes.append(services.billing_push().outcome)
        finally:
            connection.close()

    for _ in range(4):
        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=pusher, args=(barrier,)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)

    assert receiver.max_in_flight == 1
    batches = receiver.batches()
    assert len(batches) == len(set(batches)) == 3  # 5 records in batches of 2
    assert sorted(receiver.accepted) == sorted(r.record_id for r in records)
    assert outcomes.count("accepted") == 3
    assert set(outcomes) <= {"accepted", "busy", "idle"}
    assert hook().cursor == records[-1].pk
