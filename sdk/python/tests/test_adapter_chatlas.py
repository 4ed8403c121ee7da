"""The chatlas adapter against the real framework (chatlas from PyPI, its model a local fake of
OpenAI's Chat Completions wire, never the network) and the real gateway and worker: calls
let through at once; held calls waited for in `on_tool_request` and approved, edited,
rejected or expired; a call withdrawn at the adapter's timeout; a claim in doubt; the same
tool request asked again, by a second process after the first died waiting and after it ran;
and the same through `chat_async`, waiting without blocking its event loop."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from chatlas import Chat, ChatOpenAICompletions

from countersign import (
    AsyncClient,
    Client,
    ExecutionInDoubt,
    ExecutionStatus,
    PendingCall,
    RefusalCode,
    Refused,
    Status,
)
from countersign.adapters._released import EDITED
from countersign.adapters.chatlas import Gate, countersign_chat

from .conftest import ADMIN_KEY, REQUESTER_KEY, Gateway
from .interrupts_support import Desk, brief_agent, check_receipt, fresh, held
from .support import AGENT, WITHIN_SECS

#: What the model says beside its tool calls: the `message` reviewers are shown.
SAID = "I will take care of it."
ASKED = "Tell Ana her refund is on its way."


class FakeOpenAI:
    """A local stand-in for `POST /v1/chat/completions`: a request with no tool results yet is
    answered with `tool_calls`, one that has them with "done"; every request is kept, so a
    test reads what the model was told."""

    def __init__(self) -> None:
        self.tool_calls: list[tuple[str, str, dict[str, Any]]] = []
        self.requests: list[dict[str, Any]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def do_POST(self) -> None:
                request = json.loads(self.rfile.read(int(self.headers["content-length"])))
                fake.requests.append(request)
                body = json.dumps(fake.answer(request["messages"])).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"

    def answer(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        if messages[-1]["role"] == "tool":
            message: dict[str, Any] = {"role": "assistant", "content": "done"}
        else:
            message = {
                "role": "assistant",
                "content": SAID,
                "tool_calls": [
                    {
                        "id": id,
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments)},
                    }
                    for id, name, arguments in self.tool_calls
                ],
            }
        finish = "tool_calls" if "tool_calls" in message else "stop"
        return {
            "id": f"chatcmpl-{uuid.uuid4()}",
            "object": "chat.completion",
            "created": 0,
            "model": "fake",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    def told(self, tool_call_id: str) -> str:
        """What the model was last told of its call `tool_call_id`."""
        results = [
            message["content"]
            for message in self.requests[-1]["messages"]
            if message["role"] == "tool" and message["tool_call_id"] == tool_call_id
        ]
        assert len(results) == 1, self.requests[-1]
        return str(results[0])


@pytest.fixture
def model() -> Iterator[FakeOpenAI]:
    """The chat's model, served on a port of its own for the test."""
    fake = FakeOpenAI()
    serving = threading.Thread(target=fake.server.serve_forever, daemon=True)
    serving.start()
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()


def desk_chat(
    model: FakeOpenAI,
    tools: list[Callable[..., Any]],
    client: Client | AsyncClient,
    *,
    agent: str = AGENT,
    conversation_id: str | None = None,
    timeout: float | None = WITHIN_SECS,
) -> tuple[Chat[Any, Any], Gate]:
    """A chat with `tools` (the desk's) under countersign."""
    chat = ChatOpenAICompletions(base_url=model.url, api_key="test", model="fake")
    for tool in tools:
        chat.register_tool(tool)
    chat.conversation_id = conversation_id
    return chat, countersign_chat(chat, client, agent=agent, timeout=timeout)


def email() -> dict[str, str]:
    """A `send_email` input with a body no other test sends."""
    return {"to": "ana@example.com", "body": f"Your refund is on its way ({fresh('body')})."}


def chat_while(chat: Chat[Any, Any], decide: Callable[[], object]) -> None:
    """The chat's turn, while a person decides in another thread."""
    with ThreadPoolExecutor(1) as person:
        decided = person.submit(decide)
        chat.chat(ASKED, echo="none", stream=False)
        decided.result(timeout=WITHIN_SECS)


def test_calls_the_policy_lets_through_are_answered_at_once(
    gateway: Gateway, model: FakeOpenAI, client: Client
) -> None:
    desk = Desk(gateway)
    note = {"customer": "ana", "note": f"prefers email ({fresh('note')})"}
    refund = {"order_id": fresh("A"), "amount": 15.5}
    model.tool_calls = [("c-note", "note_customer", note), ("c-refund", "issue_refund", refund)]
    chat, gate = desk_chat(model, desk.tools(), client)

    chat.chat(ASKED, echo="none", stream=False)

    # The note is released to the agent: run here, once, under its execution record.
    assert desk.ran == [("note_customer", note)]
    assert model.told("c-note") == "noted about ana"
    record = client.get_call(gate.calls["c-note"].run_id, gate.calls["c-note"].call_id).execution
    assert record is not None
    assert (record.status, record.result) == (ExecutionStatus.SUCCEEDED, "noted about ana")
    # The refund has an endpoint: countersign's worker ran it, and the model got its result.
    ran = json.loads(model.told("c-refund"))
    assert (ran["order_id"], ran["amount"], ran["status"]) == (refund["order_id"], 15.5, "refunded")
    assert [gate.calls[id].status for id in ("c-note", "c-refund")] == [Status.ALLOWED] * 2


def test_a_held_refund_approved_is_run_by_countersign_once_with_a_receipt(
    gateway: Gateway, model: FakeOpenAI, client: Client, reviewer: Client
) -> None:
    desk = Desk(gateway)
    refund = {"order_id": fresh("A"), "amount": 40}
    model.tool_calls = [("c1", "issue_refund", refund)]
    chat, gate = desk_chat(model, desk.tools(), client)

    chat_while(chat, lambda: reviewer.approve(held(reviewer, "issue_refund", refund)))

    call = gate.calls["c1"]
    assert call.status is Status.APPROVED and call.result is not None
    assert model.told("c1") == call.result.content
    ran = json.loads(call.result.content)
    assert (ran["order_id"], ran["amount"], ran["status"]) == (refund["order_id"], 40, "refunded")
    assert desk.ran == []
    assert check_receipt(gateway, call, "issue_refund", call.input).claims.action == "approve"


def test_a_held_email_approved_runs_once_here_with_the_approved_input(
    gateway: Gateway, model: FakeOpenAI, client: Client, reviewer: Client
) -> None:
    desk = Desk(gateway)
    input = email()
    model.tool_calls = [("c1", "send_email", input)]
    chat, gate = desk_chat(model, desk.tools(), client)

    chat_while(chat, lambda: reviewer.approve(held(reviewer, "send_email", input)))

    # Run once, with the receipt of the approval, which the tool checked.
    assert desk.ran == [("send_email", input)]
    assert desk.receipts == [("send_email", "approve")]
    assert model.told("c1") == "sent to ana@example.com"
    record = client.get_call(gate.calls["c1"].run_id, gate.calls["c1"].call_id).execution
    assert record is not None
    assert (record.status, record.result) == (ExecutionStatus.SUCCEEDED, "sent to ana@example.com")


def test_an_edit_runs_the_reviewers_input_and_the_model_is_told(
    gateway: Gateway, model: FakeOpenAI, client: Client, reviewer: Client
) -> None:
    desk = Desk(gateway)
    input = email()
    edited = {**input, "body": f"Your refund of $40 is on its way ({fresh('body')})."}
    model.tool_calls = [("c1", "send_email", input)]
    chat, gate = desk_chat(model, desk.tools(), client)

    chat_while(chat, lambda: reviewer.edit(held(reviewer, "send_email", input), edited))

    assert desk.ran == [("send_email", edited)]
    assert desk.receipts == [("send_email", "edit")]
    call = gate.calls["c1"]
    assert call.status is Status.EDITED
    note = EDITED.format(input=json.dumps(call.input))
    assert model.told("c1") == f"{note}\n\nsent to ana@example.com"


def test_a_rejection_reaches_the_model_with_the_reviewers_reason(
    gateway: Gateway, model: FakeOpenAI, client: Client, reviewer: Client
) -> None:
    desk = Desk(gateway)
    input = email()
    model.tool_calls = [("c1", "send_email", input)]
    chat, _ = desk_chat(model, desk.tools(), client)

    with pytest.warns(RuntimeWarning, match="rejected"):
        chat_while(
            chat, lambda: reviewer.reject(held(reviewer, "send_email", input), "Ana said no")
        )

    assert model.told("c1") == (
        "Tool call failed with error: 'Tool call rejected. The call was not run: you rejected "
        "it in countersign, saying: Ana said no'"
    )
    assert desk.ran == []


def test_an_expired_call_reaches_the_model_as_a_rejection_saying_so(
    gateway: Gateway, model: FakeOpenAI, client: Client
) -> None:
    desk = Desk(gateway)
    model.tool_calls = [("c1", "send_email", email())]
    chat, gate = desk_chat(model, desk.tools(), client, agent=brief_agent(client, gateway))

    with pytest.warns(RuntimeWarning, match="expired"):
        chat.chat(ASKED, echo="none", stream=False)

    assert gate.calls["c1"].status is Status.EXPIRED
    assert "Tool call rejected." in model.told("c1") and "expired" in model.told("c1")
    assert desk.ran == []


def test_a_call_still_waiting_at_the_timeout_is_withdrawn_and_never_runs(
    gateway: Gateway, model: FakeOpenAI, client: Client, reviewer: Client
) -> None:
    desk = Desk(gateway)
    input = email()
    model.tool_calls = [("c1", "send_email", input)]
    chat, gate = desk_chat(model, desk.tools(), client, timeout=2)
    seen: list[PendingCall] = []

    with pytest.warns(RuntimeWarning, match="cancelled"):
        chat_while(chat, lambda: seen.append(held(reviewer, "send_email", input)))

    assert gate.calls["c1"].status is Status.CANCELLED
    assert "cancelled" in model.told("c1")
    # A decision that comes too late is refused: the call never runs behind the model's back.
    with pytest.raises(Refused) as late:
        reviewer.approve(seen[0])
    assert late.value.refusal is RefusalCode.RUN_CANCELLED
    assert desk.ran == []


def test_a_call_in_doubt_stops_the_chat_and_is_not_run_again(
    gateway: Gateway, model: FakeOpenAI, client: Client, reviewer: Client
) -> None:
    input = email()
    model.tool_calls = [("c1", "send_email", input)]
    conversation_id = fresh("conversation")

    def send_email(to: str, body: str) -> str:
        """Email a customer."""
        raise KeyboardInterrupt  # the process is stopped while it sends: it may have sent it

    first, _ = desk_chat(model, [send_email], client, conversation_id=conversation_id)
    with pytest.raises(KeyboardInterrupt):
        chat_while(first, lambda: reviewer.approve(held(reviewer, "send_email", input)))

    desk = Desk(gateway)
    again, again_gate = desk_chat(model, desk.tools(), client, conversation_id=conversation_id)
    with pytest.raises(ExecutionInDoubt):
        again.chat(ASKED, echo="none", stream=False)

    assert desk.ran == []
    record = again_gate.calls["c1"].execution
    assert record is not None and record.status is ExecutionStatus.STARTED


def test_a_second_process_asking_again_finds_the_decision_and_runs_the_call_once(
    gateway: Gateway, model: FakeOpenAI, client: Client, reviewer: Client
) -> None:
    input = email()
    model.tool_calls = [("c1", "send_email", input)]
    conversation_id = fresh("conversation")

    # The first process dies while it waits: its connection breaks once the call is sorted.
    def dies_waiting(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("wait_secs") not in (None, "0", "1"):
            raise ConnectionError("the process is gone")
        with httpx.Client() as real:
            return real.send(
                real.build_request(
                    request.method, request.url, headers=request.headers, content=request.content
                )
            )

    first_desk = Desk(gateway)
    transport = httpx.MockTransport(dies_waiting)
    with Client(gateway.url, REQUESTER_KEY, transport=transport) as dying:
        first, first_gate = desk_chat(
            model, first_desk.tools(), dying, conversation_id=conversation_id
        )
        with pytest.raises(ConnectionError):
            first.chat(ASKED, echo="none", stream=False)
    reviewer.approve(held(reviewer, "send_email", input))

    # The second asks the same tool request of the same conversation: the same call.
    second_desk = Desk(gateway)
    second, second_gate = desk_chat(
        model, second_desk.tools(), client, conversation_id=conversation_id
    )
    second.chat(ASKED, echo="none", stream=False)

    assert second_gate.calls["c1"].run_id == first_gate.calls["c1"].run_id
    assert first_desk.ran == [] and second_desk.ran == [("send_email", input)]
    assert model.told("c1") == "sent to ana@example.com"


def test_the_same_request_asked_again_after_it_ran_is_given_what_it_recorded(
    gateway: Gateway, model: FakeOpenAI, client: Client, reviewer: Client
) -> None:
    input = email()
    model.tool_calls = [("c1", "send_email", input)]
    conversation_id = fresh("conversation")
    desks = [Desk(gateway), Desk(gateway)]

    first, first_gate = desk_chat(model, desks[0].tools(), client, conversation_id=conversation_id)
    chat_while(first, lambda: reviewer.approve(held(reviewer, "send_email", input)))
    again, again_gate = desk_chat(model, desks[1].tools(), client, conversation_id=conversation_id)
    again.chat(ASKED, echo="none", stream=False)

    assert again_gate.calls["c1"].run_id == first_gate.calls["c1"].run_id
    assert desks[0].ran == [("send_email", input)] and desks[1].ran == []
    assert model.told("c1") == "sent to ana@example.com"


@pytest.mark.asyncio
async def test_an_async_chat_waits_without_blocking_its_loop(
    gateway: Gateway, model: FakeOpenAI
) -> None:
    desk = Desk(gateway)
    input = email()
    model.tool_calls = [("c1", "send_email", input)]

    async def approve(reviewer: AsyncClient, gate: Gate) -> None:
        """On the same loop as the chat: it comes only if the chat's wait lets it run."""
        while True:
            seen = gate.calls.get("c1")
            if seen is not None:
                call = await reviewer.get_call(seen.run_id, seen.call_id, wait_secs=0)
                if call.status is Status.PENDING:
                    await reviewer.approve(call)
                    return
            await asyncio.sleep(0.05)

    async with gateway.async_client() as asker, gateway.async_client(ADMIN_KEY) as reviewer:
        chat, gate = desk_chat(model, desk.tools(), asker)
        await asyncio.wait_for(
            asyncio.gather(
                chat.chat_async(ASKED, echo="none", stream=False), approve(reviewer, gate)
            ),
            WITHIN_SECS,
        )

    assert desk.ran == [("send_email", input)]
    assert model.told("c1") == "sent to ana@example.com"
