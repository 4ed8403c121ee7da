"""The Pydantic AI adapter against the real framework (pydantic-ai-slim from PyPI, driven by its
own `FunctionModel`, never the network) and the real gateway and worker: what the policy lets
through runs at once, held calls pause the run and countersign's outcomes resume it
(approved, edited, rejected, expired), a paused run is resumed by another process, the same
call resumed twice runs once, and results made by hand decide nothing."""

from __future__ import annotations

import asyncio
import json
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
from pydantic_ai.conversation import Conversation
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.run import AgentRunResult

from countersign import AsyncClient, Client, ExecutionInDoubt, ExecutionStatus, Status
from countersign.adapters._released import EDITED
from countersign.adapters.interrupts import FilePauses, HeldCall, Pause, idempotency_key
from countersign.adapters.pydantic_ai import (
    CountersignToolset,
    countersign_approvals,
    countersign_results,
    paused_calls,
    resume,
    start,
)

from .conftest import Gateway
from .interrupts_support import Desk, brief_agent, check_receipt, fresh, held
from .support import AGENT, WITHIN_SECS

pytestmark = pytest.mark.asyncio

#: What the model says beside its tool calls: the `message` reviewers are shown.
SAID = "I will take care of it."
ASKED = "Tell Ana her refund is on its way."


@pytest_asyncio.fixture
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
    tools = CountersignToolset(FunctionToolset(desk.tools()), client=client, agent=agent)
    return Agent(
        model(*calls),
        toolsets=[tools],
        output_type=[str, DeferredToolRequests],  # type: ignore[arg-type]
        **options,
    )


def email(id: str = "c1") -> tuple[ToolCallPart, dict[str, str]]:
    """A `send_email` call of the model's, with a body no other test sends."""
    input = {"to": "ana@example.com", "body": f"Your refund is on its way ({fresh('body')})."}
    return ToolCallPart("send_email", input, tool_call_id=id), input


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


def paused(result: AgentRunResult[Any]) -> HeldCall:
    """The countersign call the run paused on."""
    requests = result.output
    assert isinstance(requests, DeferredToolRequests), requests
    [waiting] = paused_calls(requests)
    return waiting


async def resumed(
    agent: Agent[None, str | DeferredToolRequests], client: AsyncClient, conversation: Conversation
) -> AgentRunResult[Any]:
    """The run resumed with the outcomes of the calls it paused on, once they have them."""
    requests = conversation.deferred_tool_requests
    assert requests is not None
    results = await countersign_results(client, requests, timeout=WITHIN_SECS)
    assert requests.remaining(results) is None
    return await agent.run(conversation=conversation, deferred_tool_results=results)


async def test_calls_the_policy_lets_through_are_answered_in_the_run(
    gateway: Gateway, asker: AsyncClient, client: Client
) -> None:
    desk = Desk(gateway)
    note = {"customer": "ana", "note": f"prefers email ({fresh('note')})"}
    refund = {"order_id": fresh("A"), "amount": 15.5}
    agent = desk_agent(
        asker,
        desk,
        ToolCallPart("note_customer", note, tool_call_id="c-note"),
        ToolCallPart("issue_refund", refund, tool_call_id="c-refund"),
    )

    result = await agent.run("Refund the lamp and note that Ana prefers email.")

    assert result.output == "done"
    # The note is released to the agent: run here, once, under its execution record.
    assert desk.ran == [("note_customer", note)]
    assert returned(result, "c-note").content == "noted about ana"
    # The refund has an endpoint: countersign's worker ran it, and the model got its result.
    ran = json.loads(str(returned(result, "c-refund").content))
    assert (ran["order_id"], ran["amount"], ran["status"]) == (refund["order_id"], 15.5, "refunded")

    # Asked again as the adapter asked it, the note is the same call, with its record.
    conversation = result.conversation.conversation_id
    again = client.ask(
        AGENT,
        "note_customer",
        note,
        idempotency_key=idempotency_key(conversation, "c-note"),
        task="Refund the lamp and note that Ana prefers email.",
        message=SAID,
        session=conversation,
        wait_secs=1,
    )
    assert again.status is Status.ALLOWED and again.execution is not None
    assert (again.execution.status, again.execution.result) == (
        ExecutionStatus.SUCCEEDED,
        "noted about ana",
    )


async def test_a_held_refund_approved_is_run_by_countersign_once_with_a_receipt(
    gateway: Gateway, asker: AsyncClient, client: Client, reviewer: Client
) -> None:
    desk = Desk(gateway)
    refund = {"order_id": fresh("A"), "amount": 40}
    agent = desk_agent(asker, desk, ToolCallPart("issue_refund", refund, tool_call_id="c1"))

    first = await agent.run("Refund the damaged lamp.")
    waiting = paused(first)
    reviewer.approve(held(reviewer, "issue_refund", refund), note="photo checked")
    second = await resumed(agent, asker, first.conversation)

    assert second.output == "done"
    assert desk.ran == []
    call = client.get_call(waiting.run_id, waiting.call_id, wait_secs=0)
    assert call.status is Status.APPROVED and call.result is not None
    assert returned(second, "c1").content == call.result.content
    ran = json.loads(call.result.content)
    assert (ran["order_id"], ran["amount"], ran["status"]) == (refund["order_id"], 40, "refunded")
    claims = check_receipt(gateway, call, "issue_refund", call.input).claims
    assert (claims.call_id, claims.action) == (waiting.call_id, "approve")


async def test_a_held_email_approved_runs_once_here_with_the_approved_input(
    gateway: Gateway, asker: AsyncClient, client: Client, reviewer: Client
) -> None:
    desk = Desk(gateway)
    call, input = email()
    agent = desk_agent(asker, desk, call)

    first = await agent.run(ASKED)
    waiting = paused(first)
    assert desk.ran == []
    reviewer.approve(held(reviewer, "send_email", input))
    requests = first.output
    assert isinstance(requests, DeferredToolRequests)
    results = await countersign_results(asker, requests, timeout=WITHIN_SECS)
    approval = results.approvals["c1"]
    assert isinstance(approval, ToolApproved) and approval.override_args == input
    second = await agent.run(conversation=first.conversation, deferred_tool_results=results)

    # Run once, with the receipt of the approval, which the tool checked.
    assert desk.ran == [("send_email", input)]
    assert desk.receipts == [("send_email", "approve")]
    assert returned(second, "c1").content == "sent to ana@example.com"
    record = client.get_call(waiting.run_id, waiting.call_id, wait_secs=0).execution
    assert record is not None
    assert (record.status, record.result) == (ExecutionStatus.SUCCEEDED, "sent to ana@example.com")


async def test_an_edit_runs_the_reviewers_input_and_the_model_is_told(
    gateway: Gateway, asker: AsyncClient, client: Client, reviewer: Client
) -> None:
    desk = Desk(gateway)
    call, input = email()
    edited = {**input, "body": f"Your refund of $40 is on its way ({fresh('body')})."}
    agent = desk_agent(asker, desk, call)

    first = await agent.run(ASKED)
    reviewer.edit(held(reviewer, "send_email", input), edited, note="say how much")
    second = await resumed(agent, asker, first.conversation)

    assert desk.ran == [("send_email", edited)]
    assert desk.receipts == [("send_email", "edit")]
    # Beside the result, since the model's history keeps the arguments it gave.
    waiting = paused(first)
    ran = client.get_call(waiting.run_id, waiting.call_id, wait_secs=0)
    told = [
        part.content
        for message in second.new_messages()
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, UserPromptPart)
    ]
    assert told == [EDITED.format(input=json.dumps(ran.input))]


async def test_a_rejection_reaches_the_model_with_the_reviewers_reason(
    gateway: Gateway, asker: AsyncClient, reviewer: Client
) -> None:
    desk = Desk(gateway)
    call, input = email()
    agent = desk_agent(asker, desk, call)

    first = await agent.run(ASKED)
    reviewer.reject(held(reviewer, "send_email", input), "Ana asked not to be emailed")
    second = await resumed(agent, asker, first.conversation)

    denied = returned(second, "c1")
    assert denied.outcome == "denied"
    assert denied.content == (
        "The call was not run: you rejected it in countersign, saying: Ana asked not to be emailed"
    )
    assert desk.ran == []


async def test_an_expired_call_reaches_the_model_as_a_denial_saying_so(
    gateway: Gateway, asker: AsyncClient, client: Client
) -> None:
    desk = Desk(gateway)
    call, _ = email()
    agent = desk_agent(asker, desk, call, agent=brief_agent(client, gateway))

    first = await agent.run(ASKED)
    requests = first.output
    assert isinstance(requests, DeferredToolRequests)
    results = await countersign_results(asker, requests, timeout=WITHIN_SECS)
    assert isinstance(results.approvals["c1"], ToolDenied)
    second = await agent.run(conversation=first.conversation, deferred_tool_results=results)

    denied = returned(second, "c1")
    assert denied.outcome == "denied" and "expired" in str(denied.content)
    assert desk.ran == []


async def test_a_second_process_resumes_the_run_from_the_pause_the_first_saved(
    gateway: Gateway, reviewer: Client, tmp_path: Path
) -> None:
    call, input = email()

    # The first process starts the run, which pauses; it saves the pause and is gone.
    first_desk = Desk(gateway)
    async with gateway.async_client() as first_client:
        first_agent = desk_agent(first_client, first_desk, call)
        pause = await start(first_agent, ASKED, store=FilePauses(tmp_path))
        assert isinstance(pause, Pause)
        [waiting] = pause.calls
        still = await resume(
            first_agent, first_client, waiting.run_id, waiting.call_id, store=FilePauses(tmp_path)
        )
        assert still == pause  # nobody decided yet: nothing changed
    del first_agent

    reviewer.approve(held(reviewer, "send_email", input))

    # Another process, told of the decision, resumes the run from the store.
    second_desk = Desk(gateway)
    async with gateway.async_client() as second_client:
        second_agent = desk_agent(second_client, second_desk, call)
        store = FilePauses(tmp_path)
        result = await resume(
            second_agent,
            second_client,
            waiting.run_id,
            waiting.call_id,
            store=store,
            timeout=WITHIN_SECS,
        )
        again = await resume(
            second_agent, second_client, waiting.run_id, waiting.call_id, store=store
        )

    assert isinstance(result, AgentRunResult) and result.output == "done"
    assert again is None  # resumed already
    assert first_desk.ran == [] and second_desk.ran == [("send_email", input)]


async def test_the_same_call_asked_and_resumed_twice_is_one_call_run_once(
    gateway: Gateway, asker: AsyncClient, reviewer: Client
) -> None:
    call, input = email()
    conversation_id = fresh("conversation")
    desks = [Desk(gateway), Desk(gateway)]

    # The same tool call of the same conversation, asked by two runs: one countersign call.
    runs = [
        await desk_agent(asker, desk, call).run(ASKED, conversation_id=conversation_id)
        for desk in desks
    ]
    assert paused(runs[0]) == paused(runs[1])
    reviewer.approve(held(reviewer, "send_email", input))

    # Both resume it: the second is given what the first recorded, and runs nothing.
    answers = [
        await resumed(desk_agent(asker, desk, call), asker, run.conversation)
        for desk, run in zip(desks, runs, strict=True)
    ]

    assert desks[0].ran == [("send_email", input)] and desks[1].ran == []
    assert [returned(answer, "c1").content for answer in answers] == ["sent to ana@example.com"] * 2


async def test_a_call_in_doubt_is_raised_out_of_the_run_and_not_run_again(
    gateway: Gateway, asker: AsyncClient, client: Client, reviewer: Client
) -> None:
    desk = Desk(gateway)
    call, input = email()
    agent = desk_agent(asker, desk, call)
    first = await agent.run(ASKED)
    waiting = paused(first)
    reviewer.approve(held(reviewer, "send_email", input))
    # Another process claimed it and was interrupted: it may or may not have sent the email.
    released = client.wait(client.get_call(waiting.run_id, waiting.call_id), timeout=WITHIN_SECS)
    with pytest.raises(KeyboardInterrupt), client.executing(released):
        raise KeyboardInterrupt

    with pytest.raises(ExecutionInDoubt):
        await resumed(agent, asker, first.conversation)

    assert desk.ran == []


async def test_results_made_by_hand_decide_nothing(
    gateway: Gateway, asker: AsyncClient, client: Client, reviewer: Client
) -> None:
    desk = Desk(gateway)
    call, input = email()
    agent = desk_agent(asker, desk, call)
    first = await agent.run(ASKED)
    waiting = paused(first)

    # Approved by the application while nobody has decided: asked again, it pauses again.
    approved_here = DeferredToolResults(approvals={"c1": ToolApproved()})
    again = await agent.run(conversation=first.conversation, deferred_tool_results=approved_here)
    assert paused(again) == waiting
    assert desk.ran == []

    # Decided, then resumed with other arguments: what runs is what the person approved.
    reviewer.approve(held(reviewer, "send_email", input))
    decided = client.wait(client.get_call(waiting.run_id, waiting.call_id), timeout=WITHIN_SECS)
    assert decided.status is Status.APPROVED
    requests = again.output
    assert isinstance(requests, DeferredToolRequests)
    other = DeferredToolResults(
        approvals={"c1": ToolApproved(override_args={"to": "mallory@example.com", "body": "x"})},
        metadata={"c1": requests.metadata["c1"]},
    )
    await agent.run(conversation=again.conversation, deferred_tool_results=other)
    assert desk.ran == [("send_email", input)]


async def test_the_capability_waits_inside_the_run_for_the_person(
    gateway: Gateway, asker: AsyncClient, reviewer: Client
) -> None:
    desk = Desk(gateway)
    call, input = email()
    tools = CountersignToolset(FunctionToolset(desk.tools()), client=asker, agent=AGENT)
    agent = Agent(
        model(call),
        toolsets=[tools],
        capabilities=[countersign_approvals(asker, timeout=WITHIN_SECS)],
    )

    result, _ = await asyncio.gather(
        agent.run(ASKED),
        asyncio.to_thread(lambda: reviewer.approve(held(reviewer, "send_email", input))),
    )

    assert result.output == "done"
    assert desk.ran == [("send_email", input)]


async def test_approvals_asked_for_by_anything_else_are_left_alone(asker: AsyncClient) -> None:
    requests = DeferredToolRequests(
        approvals=[ToolCallPart("send_email", {}, tool_call_id="theirs")],
        metadata={"theirs": {"reviewer": "someone else"}},
    )

    results = await countersign_results(asker, requests, timeout=0)

    assert paused_calls(requests) == []
    assert requests.remaining(results) == requests
