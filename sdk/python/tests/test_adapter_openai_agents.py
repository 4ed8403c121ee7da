"""The OpenAI Agents SDK adapter against the real framework (openai-agents from PyPI, driven
by its own scripted test model, never the network) and the real gateway and worker: what the
policy lets through runs at once, held calls interrupt the run and countersign's decisions
resume it, and a paused run is resumed by another process."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from agents import Agent, UserError, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call

from countersign import Client, ExecutionInDoubt, PendingCall
from countersign.adapters.interrupts import FilePauses, HeldCall, Pause, idempotency_key
from countersign.adapters.openai_agents import Countersign

from .conftest import REQUESTER_KEY, Gateway
from .interrupts_support import (
    Desk,
    WaitedAsyncClient,
    brief_agent,
    check_receipt,
    decide_when_waited,
    fresh,
    pending_with,
)
from .support import AGENT, WITHIN_SECS

pytestmark = pytest.mark.asyncio

# No trace leaves the process; no model is reached (every agent here runs a ScriptedModel).
set_tracing_disabled(True)


@pytest_asyncio.fixture
async def requester(gateway: Gateway) -> AsyncIterator[WaitedAsyncClient]:
    """The support desk's client, which the agent asks with."""
    async with WaitedAsyncClient(gateway.url, REQUESTER_KEY) as client:
        yield client


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=2) as reviewers:
        yield reviewers


def desk_agent(
    countersign: Countersign, desk: Desk, *steps: Any
) -> tuple[Agent[Any], ScriptedModel]:
    """The desk's agent, its tools countersigned, answering with the scripted `steps`."""
    model = ScriptedModel(steps)
    tools = [countersign.tool(function) for function in desk.tools()]
    return Agent(name="desk", instructions="Help the customer.", model=model, tools=tools), model


def held_call(reviewer: Client, waiting: HeldCall) -> PendingCall:
    """The held call a pause waits on, as the reviewer lists it."""
    [call] = [
        c
        for c in reviewer.pending(limit=500).approvals
        if (c.run_id, c.call_id) == (waiting.run_id, waiting.call_id)
    ]
    return call


def outputs(model: ScriptedModel) -> dict[str, str]:
    """What the model was last given as each tool call's result, by call id."""
    assert model.last_call is not None
    items = model.last_call.input
    assert isinstance(items, list)
    return {
        item["call_id"]: item["output"]
        for item in items
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    }


async def test_calls_the_policy_lets_through_run_at_once(
    gateway: Gateway, requester: WaitedAsyncClient
) -> None:
    desk = Desk(gateway)
    order = fresh("A")
    note = {"customer": "ana", "note": "prefers email"}
    agent, model = desk_agent(
        Countersign(requester, AGENT),
        desk,
        [
            function_call("note_customer", note, call_id="note-1"),
            function_call("issue_refund", {"order_id": order, "amount": 15}, call_id="refund-1"),
        ],
        [assistant_message("Noted and refunded.")],
    )

    result = await Countersign(requester, AGENT).run(agent, "Refund A", session=fresh("s"))

    assert result.final_output == "Noted and refunded." and not result.interruptions
    # The note was released to the agent and ran here once; the refund ran in countersign.
    assert desk.ran == [("note_customer", note)]
    given = outputs(model)
    assert given["note-1"] == "noted about ana"
    refund = json.loads(given["refund-1"])
    assert (refund["order_id"], refund["amount"], refund["status"]) == (order, 15, "refunded")


async def test_a_held_refund_approved_runs_once_in_countersign_with_its_receipt(
    gateway: Gateway, requester: WaitedAsyncClient, reviewer: Client, pool: ThreadPoolExecutor
) -> None:
    desk = Desk(gateway)
    input = {"order_id": fresh("A"), "amount": 40}
    countersign = Countersign(requester, AGENT, timeout=WITHIN_SECS)
    agent, model = desk_agent(
        countersign,
        desk,
        [function_call("issue_refund", input, call_id="refund-1")],
        [assistant_message("Refunded.")],
    )
    approval = decide_when_waited(
        pool,
        requester,
        reviewer,
        "issue_refund",
        input,
        lambda r, c: r.approve(c, note="photo checked"),
    )

    result = await countersign.run(agent, "Refund the lamp", session=fresh("s"))

    assert result.final_output == "Refunded."
    assert desk.ran == []  # countersign's worker ran it, not the framework
    refund = json.loads(outputs(model)["refund-1"])
    assert (refund["order_id"], refund["amount"], refund["status"]) == (
        input["order_id"],
        40,
        "refunded",
    )
    held = approval.result()
    call = await requester.get_call(held.run_id, held.call_id, wait_secs=0)
    assert call.result is not None and json.loads(call.result.content) == refund
    checked = check_receipt(gateway, call, "issue_refund", input)
    assert (checked.claims.action, checked.claims.call_id) == ("approve", held.call_id)


async def test_an_edit_runs_the_reviewers_input_and_the_model_is_told(
    gateway: Gateway, requester: WaitedAsyncClient, reviewer: Client, pool: ThreadPoolExecutor
) -> None:
    desk = Desk(gateway)
    asked = {"to": "ana@example.com", "body": f"Refund {fresh('r')} is on its way."}
    edited = {"to": "ana@example.com", "body": "Your refund of $40 is on its way."}
    countersign = Countersign(requester, AGENT, timeout=WITHIN_SECS)
    agent, model = desk_agent(
        countersign,
        desk,
        [function_call("send_email", asked, call_id="email-1")],
        [assistant_message("Emailed.")],
    )
    decide_when_waited(
        pool, requester, reviewer, "send_email", asked, lambda r, c: r.edit(c, edited)
    )

    result = await countersign.run(agent, "Tell Ana", session=fresh("s"))

    assert result.final_output == "Emailed."
    assert desk.ran == [("send_email", edited)]
    assert desk.receipts == [("send_email", "edit")]
    note, _, output = outputs(model)["email-1"].partition("\n\n")
    assert note.startswith("A person edited this call in countersign")
    ran_with = note.partition("it ran with ")[2].rpartition(", not the arguments")[0]
    assert json.loads(ran_with) == edited and output == "sent to ana@example.com"


async def test_a_rejection_reaches_the_model_with_its_reason_beside_an_approval(
    gateway: Gateway, requester: WaitedAsyncClient, reviewer: Client, pool: ThreadPoolExecutor
) -> None:
    desk = Desk(gateway)
    to_ana = {"to": "ana@example.com", "body": f"Refund {fresh('r')} is on its way."}
    to_bo = {"to": "bo@example.com", "body": f"Refund {fresh('r')} is on its way."}
    countersign = Countersign(requester, AGENT, timeout=WITHIN_SECS)
    agent, model = desk_agent(
        countersign,
        desk,
        [
            function_call("send_email", to_ana, call_id="email-1"),
            function_call("send_email", to_bo, call_id="email-2"),
        ],
        [assistant_message("I emailed Bo only.")],
    )
    rejection = decide_when_waited(
        pool, requester, reviewer, "send_email", to_ana, lambda r, c: r.reject(c, "No refunds.")
    )
    approval = decide_when_waited(
        pool, requester, reviewer, "send_email", to_bo, lambda r, c: r.approve(c)
    )

    result = await countersign.run(agent, "Tell Ana and Bo", session=fresh("s"))

    rejection.result(), approval.result()
    assert result.final_output == "I emailed Bo only."
    assert desk.ran == [("send_email", to_bo)]
    given = outputs(model)
    assert given["email-1"] == (
        "The call was not run: you rejected it in countersign, saying: No refunds."
    )
    assert given["email-2"] == "sent to bo@example.com"


async def test_an_expired_call_reaches_the_model_as_expired_and_nothing_runs(
    gateway: Gateway, requester: WaitedAsyncClient, reviewer: Client
) -> None:
    expiring = await asyncio.to_thread(brief_agent, reviewer, gateway)
    desk = Desk(gateway)
    asked = {"to": "ana@example.com", "body": f"Refund {fresh('r')} is on its way."}
    countersign = Countersign(requester, expiring, timeout=WITHIN_SECS)
    agent, model = desk_agent(
        countersign,
        desk,
        [function_call("send_email", asked, call_id="email-1")],
        [assistant_message("Nobody answered.")],
    )

    result = await countersign.run(agent, "Tell Ana", session=fresh("s"))

    assert result.final_output == "Nobody answered."
    assert desk.ran == []
    assert "expired" in outputs(model)["email-1"]


async def test_a_paused_run_is_resumed_by_another_process_once_decided(
    gateway: Gateway, reviewer: Client, tmp_path: Path
) -> None:
    asked = {"to": "ana@example.com", "body": f"Refund {fresh('r')} is on its way."}
    session = fresh("s")

    async def first_process() -> Pause:
        async with gateway.async_client() as client:
            desk = Desk(gateway)
            countersign = Countersign(client, AGENT)
            agent, _ = desk_agent(
                countersign, desk, [function_call("send_email", asked, call_id="email-1")]
            )
            paused = await countersign.start(
                agent, "Tell Ana", session=session, store=FilePauses(tmp_path)
            )
            assert isinstance(paused, Pause)
            # Asked to resume before anyone decided, it changes nothing.
            again = await countersign.resume(
                agent, paused.calls[0].run_id, paused.calls[0].call_id, store=FilePauses(tmp_path)
            )
            assert again == paused and desk.ran == []
            return paused

    paused = await first_process()
    [waiting] = paused.calls
    assert waiting.tool_call_id == "email-1"
    await asyncio.to_thread(reviewer.approve, await asyncio.to_thread(held_call, reviewer, waiting))

    async with gateway.async_client() as client:  # the second process: nothing shared
        desk = Desk(gateway)
        countersign = Countersign(client, AGENT)
        agent, model = desk_agent(countersign, desk, [assistant_message("Emailed.")])
        store = FilePauses(tmp_path)
        result = await countersign.resume(agent, waiting.run_id, waiting.call_id, store=store)
        assert result is not None and not isinstance(result, Pause)
        assert result.final_output == "Emailed."
        assert desk.ran == [("send_email", asked)]
        assert desk.receipts == [("send_email", "approve")]
        assert outputs(model)["email-1"] == "sent to ana@example.com"
        # Resumed once: the pause is gone.
        assert await countersign.resume(agent, waiting.run_id, waiting.call_id, store=store) is None


async def test_the_same_call_asked_again_is_the_same_call_and_never_runs_twice(
    gateway: Gateway, requester: WaitedAsyncClient, reviewer: Client, pool: ThreadPoolExecutor
) -> None:
    asked = {"to": "ana@example.com", "body": f"Refund {fresh('r')} is on its way."}
    session = fresh("s")
    desk = Desk(gateway)

    async def run_once(answer: str) -> dict[str, str]:
        countersign = Countersign(requester, AGENT, timeout=WITHIN_SECS)
        agent, model = desk_agent(
            countersign,
            desk,
            [function_call("send_email", asked, call_id="email-1")],
            [assistant_message(answer)],
        )
        result = await countersign.run(agent, "Tell Ana", session=session)
        assert result.final_output == answer
        return outputs(model)

    approval = decide_when_waited(
        pool, requester, reviewer, "send_email", asked, lambda r, c: r.approve(c)
    )
    first = await run_once("Emailed.")
    approval.result()
    # The run again (a retry after a crash): the same session and tool call id.
    second = await run_once("Emailed, as before.")

    assert desk.ran == [("send_email", asked)]
    assert first["email-1"] == second["email-1"] == "sent to ana@example.com"
    assert pending_with(reviewer, "send_email", asked) == []


async def test_a_call_another_attempt_left_in_doubt_is_never_run_again(
    gateway: Gateway, requester: WaitedAsyncClient, client: Client
) -> None:
    note = {"customer": "ana", "note": fresh("n")}
    session = fresh("s")
    # Another process asked the same call, claimed it, and died before saying how it ended.
    call = client.ask(
        AGENT,
        "note_customer",
        note,
        idempotency_key=idempotency_key(session, "note-1"),
        task="Note it",
        session=session,
    )
    with pytest.raises(KeyboardInterrupt), client.executing(client.wait(call, WITHIN_SECS)):
        raise KeyboardInterrupt
    desk = Desk(gateway)
    countersign = Countersign(requester, AGENT)
    agent, _ = desk_agent(
        countersign, desk, [function_call("note_customer", note, call_id="note-1")]
    )

    with pytest.raises(UserError) as failed:
        await countersign.run(agent, "Note it", session=session)

    assert isinstance(failed.value.__cause__, ExecutionInDoubt)
    assert desk.ran == []
