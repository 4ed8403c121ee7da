"""The same door through `AsyncClient`: asking, a run followed live across its pause and a
person's decision, decisions and errors, and running a released call."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest

from countersign import (
    AlreadyExecuted,
    AsyncClient,
    Event,
    ExecutionStatus,
    NotFound,
    RefusalCode,
    Refused,
    Reject,
    Status,
)

from .conftest import ADMIN_KEY, Gateway
from .support import AGENT, WITHIN_SECS

pytestmark = pytest.mark.asyncio


async def until_sorted(client: AsyncClient, run_id: str, call_id: str) -> Status:
    """The call's status once its policy has sorted it (see `support.until_sorted`)."""

    async def look() -> Status:
        while True:
            call = await client.get_call(run_id, call_id, wait_secs=0)
            if call.status is not Status.WORKING:
                return call.status
            await asyncio.sleep(0.05)

    return await asyncio.wait_for(look(), WITHIN_SECS)


async def test_a_call_the_policy_lets_through_is_answered_at_once(
    gateway: Gateway, key: Callable[[], str]
) -> None:
    async with gateway.async_client() as client:
        call = await client.ask(
            AGENT, "issue_refund", {"order_id": "A-1004", "amount": 12}, idempotency_key=key()
        )

    assert call.status is Status.ALLOWED and call.result is not None
    assert json.loads(call.result.content)["order_id"] == "A-1004"


async def test_a_run_followed_live_through_its_pause_and_a_persons_decision(
    gateway: Gateway, key: Callable[[], str]
) -> None:
    async with gateway.async_client() as client, gateway.async_client(ADMIN_KEY) as reviewer:
        held = await client.ask(
            AGENT,
            "issue_refund",
            {"order_id": "A-1005", "amount": 80, "reason": "arrived damaged"},
            idempotency_key=key(),
            message="The customer sent a photo of the damage.",
            evidence=[
                {"tool": "get_order", "input": {"order_id": "A-1005"}, "content": "paid $80"}
            ],
            wait_secs=0,
        )
        seen: list[Event] = []
        paused = asyncio.Event()

        async def follow() -> None:
            async for event in client.events(held.run_id):
                seen.append(event)
                if event.type == "approval.requested":
                    paused.set()

        following = asyncio.create_task(follow())
        await asyncio.wait_for(paused.wait(), WITHIN_SECS)
        assert await until_sorted(client, held.run_id, held.call_id) is Status.PENDING
        pending = await reviewer.pending(limit=500)
        [listed] = [p for p in pending.approvals if p.run_id == held.run_id]
        assert (listed.tool, listed.input["amount"], listed.text) == (
            "issue_refund",
            80,
            "The customer sent a photo of the damage.",
        )
        await reviewer.approve(listed)
        call = await client.wait(held, timeout=WITHIN_SECS)
        await asyncio.wait_for(following, WITHIN_SECS)

    # countersign ran the refund with the receipt, and the demo service checked it.
    assert call.status is Status.APPROVED and call.result is not None
    assert json.loads(call.result.content)["status"] == "refunded"
    types = [e.type for e in seen]
    for expected in ("tool.call", "approval.requested", "approval.decided", "tool.result"):
        assert expected in types, types
    assert types.index("approval.requested") < types.index("approval.decided")
    assert types[-1] == "run.completed"
    assert [e.seq for e in seen] == list(range(1, len(seen) + 1))
    decided = seen[types.index("approval.decided")].data
    assert (decided["action"], decided["decided_by"]) == ("approve", "you")


async def test_decisions_and_errors_through_the_async_client(
    gateway: Gateway, key: Callable[[], str]
) -> None:
    async with gateway.async_client() as client, gateway.async_client(ADMIN_KEY) as reviewer:
        with pytest.raises(NotFound):
            await client.ask(
                "nobody", "send_email", {"to": "a", "body": "b"}, idempotency_key=key()
            )
        held = await client.ask(
            AGENT,
            "send_email",
            {"to": "bo@example.com", "body": "hi"},
            idempotency_key=key(),
            wait_secs=0,
        )
        assert await until_sorted(client, held.run_id, held.call_id) is Status.PENDING
        held = await client.get_call(held.run_id, held.call_id, wait_secs=0)
        assert held.digest is not None
        with pytest.raises(Refused) as stale:
            await reviewer.decide(held.run_id, [Reject(held.call_id, "sha256:" + "1" * 64, "no")])
        assert stale.value.refusal is RefusalCode.STALE_DIGEST

        await reviewer.reject(held, "not to this address")
        call = await client.wait(held, timeout=WITHIN_SECS)
        run = await client.get_run(held.run_id)

    assert call.status is Status.REJECTED
    assert call.decision is not None and call.decision.reason == "not to this address"
    assert run.run_id == held.run_id and run.agent == AGENT


async def test_running_a_released_call_with_the_async_client(
    gateway: Gateway, key: Callable[[], str]
) -> None:
    async with gateway.async_client() as client:
        call = await client.ask(
            AGENT, "note_customer", {"customer": "bo", "note": "VIP"}, idempotency_key=key()
        )
        call = await client.wait(call, timeout=WITHIN_SECS)
        async with client.executing(call) as attempt:
            attempt.result = ["noted"]
        ran: list[str] = []
        with pytest.raises(AlreadyExecuted) as again:
            async with client.executing(call):
                ran.append("twice")

    execution = attempt.call.execution
    assert execution is not None
    assert (execution.status, execution.result) == (ExecutionStatus.SUCCEEDED, ["noted"])
    assert ran == [] and again.value.result == ["noted"]
