"""The Pydantic AI adapter with Pydantic AI itself, driven by its `FunctionModel`, against the
real gateway and worker: calls let through at once, held calls pausing the run and resumed
with `countersign_results` (approved, edited, rejected, expired), the run resumed in a second
process from what the first saved, the same call resumed twice, a claim in doubt, and the
capability that waits inside the run."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from pydantic_ai import (
    Agent,
    DeferredToolRequests,
    DeferredToolResults,
    FunctionToolset,
    ToolApproved,
    ToolDenied,
)
from pydantic_ai.conversation import Conversation, ConversationTypeAdapter
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.run import AgentRunResult

from countersign import AsyncClient, Client, ExecutionStatus, Status
from countersign.adapters.pydantic_ai import (
    CallRef,
    CountersignToolset,
    countersign_approvals,
    countersign_results,
    paused_calls,
)

from .conftest import Gateway
from .reviewing import Desk, brief_agent, held, receipt_checked, waiting_for_person
from .support import AGENT, WITHIN_SECS

pytestmark = pytest.mark.asyncio

#: What the model says beside its tool calls: the `message` countersign shows reviewers.
SAID = "I will take care of it."


@pytest_asyncio.fixture(loop_scope="session")
async def asker(gateway: Gateway) -> AsyncIterator[AsyncClient]:
    """The agent's client, with the support desk's key."""
    async with gateway.async_client() as client:
        yield client


def model(*calls: ToolCallPart) -> FunctionModel:
    """A model that asks for `calls`, then, once their results are back, says it is done."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        if isinstance(last, ModelRequest) and any(
            isinstance(part, ToolReturnPart) for part in last.parts
        ):
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[TextPart(SAID), *calls])

    return FunctionModel(respond)


def desk_agent(
    client: AsyncClient, desk: Desk, *calls: ToolCallPart, agent: str = AGENT, **options: Any
) -> Agent[None, str | DeferredToolRequests]:
    """An agent with the desk's tools under countersign, whose model asks for `calls`."""
    tools = FunctionToolset([desk.issue_refund, desk.send_email, desk.note_customer])
    countersigned = CountersignToolset(tools, client=client, agent=agent, wait_secs=1)
    return Agent(
        model(*calls),
        toolsets=[countersigned],
        output_type=[str, DeferredToolRequests],  # type: ignore[arg-type]
        **options,
    )


def email(marker: str) -> dict[str, str]:
    return {"to": "ana@example.com", "body": f"Your refund is on its way ({marker})."}


def returned(result: AgentRunResult[Any], tool_call_id: str) -> ToolReturnPart:
    """What the model was given for its call `tool_call_id`."""
    parts = [
        part
        for message in result.all_messages()
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart) and part.tool_call_id == tool_call_id
    ]
    assert len(parts) == 1, parts
    return parts[0]


def paused(result: AgentRunResult[Any]) -> tuple[DeferredToolRequests, CallRef]:
    """The run's pause on its one countersign call."""
    requests = result.output
    assert isinstance(requests, DeferredToolRequests), requests
    refs = list(paused_calls(requests).values())
    assert len(refs) == 1, requests
    return requests, refs[0]


async def resumed(
    agent: Agent[None, str | DeferredToolRequests],
    client: AsyncClient,
    conversation: Conversation,
) -> AgentRunResult[Any]:
    """The run resumed once its countersign calls are decided."""
    requests = conversation.deferred_tool_requests
    assert requests is not None
    results = await countersign_results(client, requests, timeout=WITHIN_SECS)
    assert requests.remaining(results) is None
    return await agent.run(conversation=conversation, deferred_tool_results=results)


async def test_calls_the_policy_lets_through_are_answered_in_the_run(
    asker: AsyncClient, client: Client
) -> None:
    desk = Desk()
    note = {"customer": "ana", "note": f"prefers email ({uuid.uuid4()})"}
    refund = {"order_id": f"A-{uuid.uuid4()}", "amount": 15.5}
    agent = desk_agent(
        asker,
        desk,
        ToolCallPart("note_customer", note, tool_call_id="call-note"),
        ToolCallPart("issue_refund", refund, tool_call_id="call-refund"),
    )

    result = await agent.run("Refund the lamp and note that Ana prefers email.")

    assert result.output == "done"
    # The note is released to the agent: run here once, under its execution record.
    assert desk.runs_of("note_customer") == [note]
    assert returned(result, "call-note").content == "noted"
    # The refund has an endpoint: countersign ran it, and the model got its result.
    assert desk.runs_of("issue_refund") == []
    ran = json.loads(str(returned(result, "call-refund").content))
    assert (ran["order_id"], ran["amount"], ran["status"]) == (refund["order_id"], 15.5, "refunded")

    # Asked again as the adapter asked it, the note is the same call, with its record.
    again = client.ask(
        AGENT,
        "note_customer",
        note,
        idempotency_key=f"pydantic-ai:{result.conversation.conversation_id}:call-note",
        task="Refund the lamp and note that Ana prefers email.",
        message=SAID,
        session=result.conversation.conversation_id,
    )
    assert again.status is Status.ALLOWED
    assert again.execution is not None
    assert (again.execution.status, again.execution.result) == (ExecutionStatus.SUCCEEDED, "noted")


async def test_a_held_refund_approved_is_run_by_countersign_once_with_a_receipt(
    gateway: Gateway, asker: AsyncClient, client: Client, reviewer: Client
) -> None:
    desk = Desk()
    refund = {"order_id": f"A-{uuid.uuid4()}", "amount": 40}
    agent = desk_agent(asker, desk, ToolCallPart("issue_refund", refund, tool_call_id="call-1"))

    first = await agent.run("Refund the damaged lamp.")
    requests, ref = paused(first)
    assert [part.tool_call_id for part in requests.approvals] == ["call-1"]
    reviewer.approve(held(client, ref.run_id, ref.call_id), note="photo checked")
    second = await resumed(agent, asker, first.conversation)

    assert second.output == "done"
    assert desk.runs_of("issue_refund") == []
    call = client.get_call(ref.run_id, ref.call_id, wait_secs=0)
    assert call.status is Status.APPROVED and call.result is not None
    assert returned(second, "call-1").content == call.result.content
    ran = json.loads(call.result.content)
    assert (ran["order_id"], ran["amount"], ran["status"]) == (refund["order_id"], 40, "refunded")
    claims = receipt_checked(gateway, call).claims
    assert (claims.run_id, claims.call_id, claims.action) == (ref.run_id, ref.call_id, "approve")


async def test_a_held_email_approved_runs_once_here_with_the_approved_input(
    gateway: Gateway, asker: AsyncClient, client: Client, reviewer: Client
) -> None:
    desk = Desk()
    input = email(str(uuid.uuid4()))
    agent = desk_agent(asker, desk, ToolCallPart("send_email", input, tool_call_id="call-1"))

    first = await agent.run("Tell Ana her refund is on its way.")
    requests, ref = paused(first)
    assert desk.ran == []
    reviewer.approve(held(client, ref.run_id, ref.call_id))
    results = await countersign_results(asker, requests, timeout=WITHIN_SECS)
    approval = results.approvals["call-1"]
    assert isinstance(approval, ToolApproved) and approval.override_args == input
    second = await agent.run(conversation=first.conversation, deferred_tool_results=results)

    assert desk.runs_of("send_email") == [input]
    assert returned(second, "call-1").content == {"message_id": "m-1"}
    call = client.get_call(ref.run_id, ref.call_id, wait_secs=0)
    assert call.execution is not None
    assert (call.execution.status, call.execution.result) == (
        ExecutionStatus.SUCCEEDED,
        {"message_id": "m-1"},
    )
    assert receipt_checked(gateway, call).claims.action == "approve"


async def test_an_edit_runs_the_reviewers_input(
    gateway: Gateway, asker: AsyncClient, client: Client, reviewer: Client
) -> None:
    desk = Desk()
    marker = str(uuid.uuid4())
    agent = desk_agent(asker, desk, ToolCallPart("send_email", email(marker), tool_call_id="c1"))
    edited = {"to": "ana@example.com", "body": f"Your refund of $40 is on its way ({marker})."}

    first = await agent.run("Tell Ana her refund is on its way.")
    _, ref = paused(first)
    reviewer.edit(held(client, ref.run_id, ref.call_id), edited, note="say how much")
    await resumed(agent, asker, first.conversation)

    assert desk.runs_of("send_email") == [edited]
    call = client.get_call(ref.run_id, ref.call_id, wait_secs=0)
    assert call.status is Status.EDITED
    assert receipt_checked(gateway, call).claims.action == "edit"


async def test_a_rejection_reaches_the_model_with_the_reviewers_reason(
    asker: AsyncClient, client: Client, reviewer: Client
) -> None:
    desk = Desk()
    agent = desk_agent(
        asker, desk, ToolCallPart("send_email", email(str(uuid.uuid4())), tool_call_id="c1")
    )

    first = await agent.run("Tell Ana her refund is on its way.")
    _, ref = paused(first)
    reviewer.reject(held(client, ref.run_id, ref.call_id), "Ana asked not to be emailed")
    second = await resumed(agent, asker, first.conversation)

    denied = returned(second, "c1")
    assert denied.outcome == "denied"
    assert "Ana asked not to be emailed" in str(denied.content)
    assert desk.ran == []


async def test_an_expired_call_reaches_the_model_as_a_denial_saying_so(
    gateway: Gateway, asker: AsyncClient
) -> None:
    desk = Desk()
    agent = desk_agent(
        asker,
        desk,
        ToolCallPart("send_email", email(str(uuid.uuid4())), tool_call_id="c1"),
        agent=brief_agent(gateway),
    )

    first = await agent.run("Tell Ana her refund is on its way.")
    requests, _ = paused(first)
    results = await countersign_results(asker, requests, timeout=WITHIN_SECS)
    assert isinstance(results.approvals["c1"], ToolDenied)
    second = await agent.run(conversation=first.conversation, deferred_tool_results=results)

    denied = returned(second, "c1")
    assert denied.outcome == "denied" and "expired" in str(denied.content)
    assert desk.ran == []


async def test_a_second_process_resumes_the_run_from_what_the_first_saved(
    gateway: Gateway, client: Client, reviewer: Client, tmp_path: Path
) -> None:
    input = email(str(uuid.uuid4()))
    call = ToolCallPart("send_email", input, tool_call_id="c1")

    # The first process pauses, saves the conversation under the countersign call, and ends.
    first_desk = Desk()
    async with gateway.async_client() as first_client:
        first = await desk_agent(first_client, first_desk, call).run("Tell Ana.")
    _, ref = paused(first)
    (tmp_path / f"{ref.run_id}.json").write_bytes(
        ConversationTypeAdapter.dump_json(first.conversation)
    )
    del first

    reviewer.approve(held(client, ref.run_id, ref.call_id))

    # Another process, told the run's call was decided, loads it and resumes it.
    second_desk = Desk()
    async with gateway.async_client() as second_client:
        saved = ConversationTypeAdapter.validate_json(
            (tmp_path / f"{ref.run_id}.json").read_bytes()
        )
        second = await resumed(desk_agent(second_client, second_desk, call), second_client, saved)

    assert second.output == "done"
    assert first_desk.ran == []
    assert second_desk.runs_of("send_email") == [input]


async def test_the_same_call_asked_and_resumed_twice_is_one_call_run_once(
    asker: AsyncClient, client: Client, reviewer: Client
) -> None:
    input = email(str(uuid.uuid4()))
    call = ToolCallPart("send_email", input, tool_call_id="c1")
    conversation_id = str(uuid.uuid4())
    desks = [Desk(), Desk()]

    # The same tool call of the same conversation, asked by two runs: one countersign call.
    runs = [
        await desk_agent(asker, desk, call).run("Tell Ana.", conversation_id=conversation_id)
        for desk in desks
    ]
    refs = {paused(run)[1] for run in runs}
    assert len(refs) == 1
    ref = refs.pop()
    reviewer.approve(held(client, ref.run_id, ref.call_id))

    # Both resume it: the second is given what the first recorded, and runs nothing.
    answers = [
        await resumed(desk_agent(asker, desk, call), asker, run.conversation)
        for desk, run in zip(desks, runs, strict=True)
    ]

    assert desks[0].runs_of("send_email") == [input] and desks[1].ran == []
    assert [returned(answer, "c1").content for answer in answers] == [{"message_id": "m-1"}] * 2


async def test_results_made_by_hand_decide_nothing(
    asker: AsyncClient, client: Client, reviewer: Client
) -> None:
    desk = Desk()
    input = email(str(uuid.uuid4()))
    agent = desk_agent(asker, desk, ToolCallPart("send_email", input, tool_call_id="c1"))
    first = await agent.run("Tell Ana.")
    _, ref = paused(first)

    # Approved by the application while nobody has decided: asked again, it pauses again.
    approved_here = DeferredToolResults(approvals={"c1": ToolApproved()})
    again = await agent.run(conversation=first.conversation, deferred_tool_results=approved_here)
    assert paused(again)[1] == ref
    assert desk.ran == []

    # Decided, then resumed with other arguments: what runs is what the person approved.
    decided = held(client, ref.run_id, ref.call_id)
    reviewer.approve(decided)
    assert client.wait(decided, timeout=WITHIN_SECS).status is Status.APPROVED
    other = DeferredToolResults(
        approvals={"c1": ToolApproved(override_args={"to": "mallory@example.com", "body": "x"})},
        metadata={"c1": ref.metadata()},
    )
    await agent.run(conversation=again.conversation, deferred_tool_results=other)
    assert desk.runs_of("send_email") == [input]


async def test_a_call_in_doubt_is_a_failure_for_the_model_and_is_not_run(
    asker: AsyncClient, client: Client, reviewer: Client
) -> None:
    desk = Desk()
    agent = desk_agent(
        asker, desk, ToolCallPart("send_email", email(str(uuid.uuid4())), tool_call_id="c1")
    )
    first = await agent.run("Tell Ana.")
    _, ref = paused(first)
    reviewer.approve(held(client, ref.run_id, ref.call_id))
    # Another process claimed it and was interrupted: it may or may not have sent the email.
    released = client.wait(client.get_call(ref.run_id, ref.call_id), timeout=WITHIN_SECS)
    with pytest.raises(KeyboardInterrupt), client.executing(released):
        raise KeyboardInterrupt

    second = await resumed(agent, asker, first.conversation)

    failed = returned(second, "c1")
    assert failed.outcome == "failed" and "never reported finished" in str(failed.content)
    assert desk.ran == []


async def test_the_capability_waits_inside_the_run_for_the_person(
    asker: AsyncClient, reviewer: Client
) -> None:
    desk = Desk()
    marker = str(uuid.uuid4())
    tools = FunctionToolset([desk.issue_refund, desk.send_email, desk.note_customer])
    agent = Agent(
        model(ToolCallPart("send_email", email(marker), tool_call_id="c1")),
        toolsets=[CountersignToolset(tools, client=asker, agent=AGENT, wait_secs=1)],
        capabilities=[countersign_approvals(asker, timeout=WITHIN_SECS)],
    )

    def approve() -> None:
        reviewer.approve(waiting_for_person(reviewer, marker))

    result, _ = await asyncio.gather(agent.run("Tell Ana."), asyncio.to_thread(approve))

    assert result.output == "done"
    assert desk.runs_of("send_email") == [email(marker)]


async def test_approvals_asked_for_by_anything_else_are_left_alone(asker: AsyncClient) -> None:
    requests = DeferredToolRequests(
        approvals=[ToolCallPart("send_email", {}, tool_call_id="theirs")],
        metadata={"theirs": {"reviewer": "someone else"}},
    )

    results = await countersign_results(asker, requests, timeout=0)

    assert paused_calls(requests) == {}
    assert requests.remaining(results) == requests
