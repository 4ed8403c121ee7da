"""The door for agents written in code, through the blocking client, against the real
gateway and worker: asking, waiting, the three decisions, idempotency, cancelling, and the
receipt a released call carries."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from countersign import (
    Approve,
    BadRequest,
    Call,
    Cancelled,
    Client,
    CountersignError,
    Executes,
    Forbidden,
    NotFound,
    RefusalCode,
    Refused,
    Rejected,
    Status,
    StillPending,
    Unauthorized,
    Unprocessable,
)
from countersign.receipts import InputChanged, MemoryJtis, OtherCall, Verifier, input_digest

from .conftest import Gateway
from .support import AGENT, WITHIN_SECS, held_email, until_sorted


def email_verifier(gateway: Gateway) -> Verifier:
    """What a `send_email` tool would check receipts with."""
    return Verifier(gateway.jwks_url, "send_email", gateway.url, MemoryJtis())


def body_of(call: Call) -> bytes:
    """The body the agent sends its own tool: the input the call may run with."""
    return json.dumps(call.input).encode()


def held_for(reviewer: Client, call: Call) -> list[tuple[str, str, object]]:
    """The calls of `call`'s run the reviewer is asked to decide."""
    page = reviewer.pending(limit=500)
    return [(p.call_id, p.digest, p.input) for p in page.approvals if p.run_id == call.run_id]


def test_a_call_the_policy_lets_through_is_answered_at_once_with_its_result(
    client: Client, key: Callable[[], str]
) -> None:
    call = client.ask(
        AGENT, "issue_refund", {"order_id": "A-1002", "amount": 15.5}, idempotency_key=key()
    )

    assert call.status is Status.ALLOWED
    assert call.executes is Executes.COUNTERSIGN
    assert call.may_run and call.outcome_reached
    assert call.raise_for_outcome() is call
    assert call.result is not None and not call.result.is_error
    refund = json.loads(call.result.content)
    assert (refund["order_id"], refund["amount"], refund["status"]) == ("A-1002", 15.5, "refunded")
    assert call.decision is None and call.receipt is None


def test_a_held_call_approved_by_a_person_is_released_with_a_receipt_its_tool_accepts(
    gateway: Gateway, client: Client, reviewer: Client, key: Callable[[], str]
) -> None:
    # Text and numbers whose canonical form (RFC 8785) is easy to get wrong: the digest the
    # gateway signed (in Rust) must be the one computed here.
    input = {
        "to": "ana@example.com",
        "body": 'Grüße ☃ 😀 \u2028 "quoted" \\ done',
        "meta": {"z": [1.5, 1e21, 0.1, 100, -0.0, 1e-7], "a": {"é": True, "e": None}},
    }
    asked = client.ask(AGENT, "send_email", input, idempotency_key=key(), wait_secs=0)
    held = until_sorted(client, asked)
    assert held.status is Status.PENDING
    assert held.held is not None and held.held.reason == "Email leaves the company"
    assert held.digest is not None and held.digest.startswith("sha256:")
    assert held.receipt is None and not held.may_run
    with pytest.raises(StillPending):
        held.raise_for_outcome()
    assert held_for(reviewer, held) == [(held.call_id, held.digest, input)]

    decided = reviewer.approve(held, note="fine to send")
    assert decided.resumes
    assert [(d.call_id, d.status) for d in decided.decisions] == [(held.call_id, "recorded")]

    call = client.wait(held, timeout=WITHIN_SECS)
    assert call.status is Status.APPROVED and call.may_run
    assert call.executes is Executes.AGENT
    assert call.input == input
    assert call.decision is not None and call.decision.decided_by == "you"
    assert call.receipt is not None

    verifier = email_verifier(gateway)
    headers = call.receipt_headers()
    assert headers["Idempotency-Key"] == f"{call.run_id}:1:{call.call_id}"
    checked = verifier.check(
        headers["Countersign-Receipt"],
        tool="send_email",
        idempotency_key=headers["Idempotency-Key"],
        body=body_of(call),
    )
    claims = checked.claims
    assert not checked.again
    assert (claims.run_id, claims.call_id, claims.tool) == (call.run_id, call.call_id, "send_email")
    assert (claims.action, claims.decided_by, claims.iss) == ("approve", ("you",), gateway.url)
    assert claims.input_digest == input_digest(input)

    # The same request again is recognised (answer it as before, run nothing again).
    again = verifier.check(
        headers["Countersign-Receipt"],
        tool="send_email",
        idempotency_key=headers["Idempotency-Key"],
        body=body_of(call),
    )
    assert again.again
    with pytest.raises(OtherCall):
        verifier.check(
            call.receipt, tool="send_email", idempotency_key="another-request", body=body_of(call)
        )


def test_an_edit_releases_the_reviewers_input_and_its_receipt_binds_that_input(
    gateway: Gateway, client: Client, reviewer: Client, key: Callable[[], str]
) -> None:
    held = held_email(client, key(), body="Your refund is on its way.")
    edited = {"to": "ana@example.com", "body": "Your refund of $40 is on its way."}

    reviewer.edit(held, edited, note="say how much")
    call = client.wait(held, timeout=WITHIN_SECS)

    assert call.status is Status.EDITED and call.may_run
    assert call.input == edited
    assert call.decision is not None
    assert (call.decision.action, call.decision.note) == ("edit", "say how much")
    verifier = email_verifier(gateway)
    headers = call.receipt_headers()
    with pytest.raises(InputChanged):
        verifier.check(
            call.receipt,
            tool="send_email",
            idempotency_key=headers["Idempotency-Key"],
            body=body_of(held),
        )
    checked = verifier.check(
        call.receipt,
        tool="send_email",
        idempotency_key=headers["Idempotency-Key"],
        body=body_of(call),
    )
    assert checked.claims.action == "edit"


def test_a_rejection_raises_with_the_reviewers_reason(
    client: Client, reviewer: Client, key: Callable[[], str]
) -> None:
    held = held_email(client, key())

    reviewer.reject(held, "We do not email customers about refunds.")
    call = client.wait(held, timeout=WITHIN_SECS)

    assert call.status is Status.REJECTED
    assert call.outcome_reached and not call.may_run
    assert call.receipt is None
    with pytest.raises(Rejected) as rejected:
        call.raise_for_outcome()
    assert rejected.value.reason == "We do not email customers about refunds."
    assert rejected.value.call is call


def test_the_same_idempotency_key_is_the_same_call_and_never_asked_twice(
    client: Client, reviewer: Client, key: Callable[[], str]
) -> None:
    same = key()
    first = held_email(client, same)

    second = held_email(client, same)

    assert (second.run_id, second.call_id, second.digest) == (
        first.run_id,
        first.call_id,
        first.digest,
    )
    assert len(held_for(reviewer, first)) == 1
    reviewer.approve(first)
    third = client.ask(
        AGENT,
        "send_email",
        first.input,
        idempotency_key=same,
        message="The customer asked to be told.",
    )
    assert (third.run_id, third.status) == (first.run_id, Status.APPROVED)
    with pytest.raises(Unprocessable) as reused:
        client.ask(
            AGENT, "send_email", {"to": "bo@example.com", "body": "hi"}, idempotency_key=same
        )
    assert reused.value.code == "idempotency_key_reused"


def test_a_timeout_returns_the_call_still_pending_and_raise_for_outcome_refuses_it(
    client: Client, key: Callable[[], str]
) -> None:
    held = held_email(client, key())

    call = client.wait(held, timeout=1)

    assert call.status is Status.PENDING and not call.outcome_reached
    with pytest.raises(StillPending):
        call.raise_for_outcome()


def test_a_cancelled_run_cancels_its_held_call(
    client: Client, reviewer: Client, key: Callable[[], str]
) -> None:
    held = held_email(client, key())

    state = client.cancel_run(held.run_id, reason="the customer called back")
    call = client.wait(held, timeout=WITHIN_SECS)

    assert (state.run_id, state.status) == (held.run_id, "cancelling")
    assert call.status is Status.CANCELLED
    with pytest.raises(Cancelled):
        call.raise_for_outcome()
    with pytest.raises(Refused) as refused:
        reviewer.approve(held)
    assert refused.value.refusal is RefusalCode.RUN_CANCELLED
    run = client.get_run(held.run_id)
    assert (run.agent, run.status, run.requested_by, run.ended) == (
        AGENT,
        "cancelled",
        "support-desk",
        True,
    )


def test_errors_carry_the_gateways_status_code_and_refusal(
    gateway: Gateway, client: Client, reviewer: Client, key: Callable[[], str]
) -> None:
    with pytest.raises(NotFound) as unknown:
        client.ask("nobody", "send_email", {"to": "a", "body": "b"}, idempotency_key=key())
    assert (unknown.value.status, unknown.value.code) == (404, "not_found")

    with gateway.client("not-a-key") as stranger, pytest.raises(Unauthorized) as unauthorized:
        stranger.pending()
    assert unauthorized.value.status == 401

    with pytest.raises(Unprocessable) as unfit:
        client.ask(AGENT, "send_email", {"to": 7}, idempotency_key=key())
    assert unfit.value.status == 422 and "send_email" in unfit.value.message

    with pytest.raises(BadRequest) as too_long:
        client.ask(
            AGENT,
            "note_customer",
            {"customer": "a", "note": "b"},
            idempotency_key=key(),
            wait_secs=3600,
        )
    assert too_long.value.code == "bad_request"

    held = held_email(client, key())
    with pytest.raises(Forbidden) as requester:
        client.approve(held)  # a requester's key does not decide, before any call is looked at
    assert (requester.value.code, requester.value.refusal) == ("forbidden", None)

    with pytest.raises(Refused) as stale:
        reviewer.decide(held.run_id, [Approve(held.call_id, "sha256:" + "0" * 64)])
    assert (stale.value.status, stale.value.code) == (409, "stale_digest")
    assert stale.value.refusal is RefusalCode.STALE_DIGEST
    assert isinstance(stale.value, CountersignError)

    reviewer.reject(held, "not now")
    with pytest.raises(Refused) as decided:
        reviewer.approve(held)
    assert decided.value.refusal in (RefusalCode.DECIDED, RefusalCode.NOT_WAITING)
