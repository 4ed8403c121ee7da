"""Running a call released to the agent under its execution record (`executing`), against
the real gateway."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from countersign import (
    AlreadyExecuted,
    Client,
    Conflict,
    Executes,
    ExecutionInDoubt,
    ExecutionStatus,
)

from .support import AGENT, held_email, released_note


def test_executing_claims_the_call_then_reports_its_result(
    client: Client, key: Callable[[], str]
) -> None:
    call = released_note(client, key())
    assert call.executes is Executes.AGENT and call.execution is None

    with client.executing(call) as attempt:
        during = client.get_call(call.run_id, call.call_id, wait_secs=0).execution
        attempt.result = {"noted": True}

    assert during is not None
    assert (during.status, during.attempt, during.reported_by) == (
        ExecutionStatus.STARTED,
        attempt.id,
        "support-desk",
    )
    after = client.get_call(call.run_id, call.call_id, wait_secs=0).execution
    assert after is not None and after.finished
    assert (after.status, after.attempt, after.result) == (
        ExecutionStatus.SUCCEEDED,
        attempt.id,
        {"noted": True},
    )
    assert after.finished_at is not None and after.started_at is not None
    assert attempt.call.execution == after


def test_an_exception_is_reported_failed_with_its_text_and_raised(
    client: Client, key: Callable[[], str]
) -> None:
    call = released_note(client, key())

    with pytest.raises(RuntimeError, match="the CRM is down"), client.executing(call):
        raise RuntimeError("the CRM is down")

    after = client.get_call(call.run_id, call.call_id, wait_secs=0).execution
    assert after is not None
    assert (after.status, after.error) == (ExecutionStatus.FAILED, "RuntimeError: the CRM is down")


def test_a_second_attempt_runs_nothing_and_is_told_what_the_first_recorded(
    client: Client, key: Callable[[], str]
) -> None:
    same = key()
    call = released_note(client, same)
    with client.executing(call) as first:
        first.result = {"noted": 1}
    ran: list[str] = []

    # Another process asking the same call again sees it ran, in the answer.
    asked_again = released_note(client, same)
    with pytest.raises(AlreadyExecuted) as seen, client.executing(asked_again):
        ran.append("asked again")
    # One holding a view from before the claim is refused by the gateway.
    with pytest.raises(AlreadyExecuted) as refused, client.executing(call):
        ran.append("stale view")

    assert ran == []
    assert asked_again.run_id == call.run_id
    for error in (seen.value, refused.value):
        assert (error.execution.attempt, error.result) == (first.id, {"noted": 1})
    taken = refused.value.__cause__
    assert isinstance(taken, Conflict) and taken.code == "execution_taken"


def test_a_claim_never_finished_is_in_doubt_and_never_run_again(
    client: Client, key: Callable[[], str]
) -> None:
    call = released_note(client, key())
    # Interrupted in the middle: it may or may not have had its effect, so no end is reported.
    with pytest.raises(KeyboardInterrupt), client.executing(call):
        raise KeyboardInterrupt
    ran: list[str] = []

    looked = client.get_call(call.run_id, call.call_id, wait_secs=0)
    with pytest.raises(ExecutionInDoubt) as seen, client.executing(looked):
        ran.append("looked again")
    with pytest.raises(ExecutionInDoubt) as refused, client.executing(call):
        ran.append("stale view")

    assert ran == []
    assert looked.execution is not None and looked.execution.status is ExecutionStatus.STARTED
    assert seen.value.execution == looked.execution
    assert refused.value.execution.attempt == looked.execution.attempt


def test_a_call_not_released_to_the_agent_cannot_be_claimed(
    client: Client, key: Callable[[], str]
) -> None:
    held = held_email(client, key())
    ran_by_countersign = client.ask(
        AGENT, "issue_refund", {"order_id": "A-1002", "amount": 15.5}, idempotency_key=key()
    )
    ran: list[str] = []

    for call in (held, ran_by_countersign):
        with pytest.raises(Conflict) as refused, client.executing(call):
            ran.append(call.call_id)
        assert refused.value.code == "not_released"
    assert ran == []
