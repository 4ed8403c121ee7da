"""The chatlas adapter with chatlas itself, its model a local fake of OpenAI's Chat Completions
wire, against the real gateway and worker: calls let through at once; held calls waited for
in `on_tool_request` and approved, edited, rejected or expired; a call withdrawn at the
adapter's timeout; the same tool request asked again, by a second process after the first
died waiting and after it ran; and the same through `chat_async`."""

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
    Call,
    Client,
    ExecutionStatus,
    RefusalCode,
    Refused,
    Status,
)
from countersign.adapters.chatlas import Gate, countersign_chat

from .conftest import ADMIN_KEY, REQUESTER_KEY, Gateway
from .reviewing import Desk, brief_agent, held, receipt_checked, until
from .support import AGENT, WITHIN_SECS

#: What the model says beside its tool calls: the `message` countersign shows reviewers.
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
    desk: Desk,
    client: Client | AsyncClient,
    *,
    agent: str = AGENT,
    conversation_id: str | None = None,
    timeout: float | None = WITHIN_SECS,
) -> tuple[Chat[Any, Any], Gate]:
    """A chat with the desk's tools under countersign."""
    chat = ChatOpenAICompletions(base_url=model.url, api_key="test", model="fake")
    for tool in (desk.issue_refund, desk.send_email, desk.note_customer):
        chat.register_tool(tool)
    chat.conversation_id = conversation_id
    return chat, countersign_chat(chat, client, agent=agent, timeout=timeout)


def email(marker: str) -> dict[str, str]:
    return {"to": "ana@example.com", "body": f"Your refund is on its way ({marker})."}


def chat_while(chat: Chat[Any, Any], decide: Callable[[], None]) -> None:
    """The chat's turn, while a person decides in another thread."""
    with ThreadPoolExecutor(1) as person:
        decided = person.submit(decide)
        chat.chat(ASKED, echo="none", stream=False)
        decided.result(timeout=WITHIN_SECS)


def asked(client: Client, gate: Gate, request_id: str) -> Any:
    """The call of tool request `request_id`, once the gate has asked it and it is held."""
    call = until(lambda: gate.calls.get(request_id))
    return held(client, call.run_id, call.call_id)


def test_calls_the_policy_lets_through_are_answered_at_once(
    model: FakeOpenAI, client: Client
) -> None:
    desk = Desk()
    note = {"customer": "ana", "note": f"prefers email ({uuid.uuid4()})"}
    refund = {"order_id": f"A-{uuid.uuid4()}", "amount": 15.5}
    model.tool_calls = [("c-note", "note_customer", note), ("c-refund", "issue_refund", refund)]
    chat, gate = desk_chat(model, desk, client)

    chat.chat(ASKED, echo="none", stream=False)

    assert desk.runs_of("note_customer") == [note]
    assert model.told("c-note") == "noted"
    assert desk.runs_of("issue_refund") == []
    ran = json.loads(model.told("c-refund"))
    assert (ran["order_id"], ran["amount"], ran["status"]) == (refund["order_id"], 15.5, "refunded")
    assert [gate.calls[id].status for id in ("c-note", "c-refund")] == [Status.ALLOWED] * 2
    recorded = client.get_call(gate.calls["c-note"].run_id, gate.calls["c-note"].call_id)
    assert recorded.execution is not None
    assert (recorded.execution.status, recorded.execution.result) == (
        ExecutionStatus.SUCCEEDED,
        "noted",
    )


def test_a_held_refund_approved_is_run_by_countersign_once_with_a_receipt(
    gateway: Gateway, model: FakeOpenAI, client: Client, reviewer: Client
) -> None:
    desk = Desk()
    refund = {"order_id": f"A-{uuid.uuid4()}", "amount": 40}
    model.tool_calls = [("c1", "issue_refund", refund)]
    chat, gate = desk_chat(model, desk, client)

    chat_while(chat, lambda: reviewer.approve(asked(client, gate, "c1")))

    call = gate.calls["c1"]
    assert call.status is Status.APPROVED and call.result is not None
    assert model.told("c1") == call.result.content
    ran = json.loads(call.result.content)
    assert (ran["order_id"], ran["amount"], ran["status"]) == (refund["order_id"], 40, "refunded")
    assert desk.runs_of("issue_refund") == []
    assert receipt_checked(gateway, call).claims.action == "approve"


def test_a_held_email_approved_runs_once_here_with_the_approved_input(
    gateway: Gateway, model: FakeOpenAI, client: Client, reviewer: Client
) -> None:
    desk = Desk()
    input = email(str(uuid.uuid4()))
    model.tool_calls = [("c1", "send_email", input)]
    chat, gate = desk_chat(model, desk, client)

    chat_while(chat, lambda: reviewer.approve(asked(client, gate, "c1")))

    assert desk.runs_of("send_email") == [input]
    assert json.loads(model.told("c1")) == {"message_id": "m-1"}
    call = client.get_call(gate.calls["c1"].run_id, gate.calls["c1"].call_id)
    assert call.execution is not None
    assert (call.execution.status, call.execution.result) == (
        ExecutionStatus.SUCCEEDED,
        {"message_id": "m-1"},
    )
    assert receipt_checked(gateway, call).claims.action == "approve"


def test_an_edit_runs_the_reviewers_input(
    gateway: Gateway, model: FakeOpenAI, client: Client, reviewer: Client
) -> None:
    desk = Desk()
    marker = str(uuid.uuid4())
    edited = {"to": "ana@example.com", "body": f"Your refund of $40 is on its way ({marker})."}
    model.tool_calls = [("c1", "send_email", email(marker))]
    chat, gate = desk_chat(model, desk, client)

    chat_while(chat, lambda: reviewer.edit(asked(client, gate, "c1"), edited))

    assert desk.runs_of("send_email") == [edited]
    assert gate.calls["c1"].status is Status.EDITED
    assert receipt_checked(gateway, gate.calls["c1"]).claims.action == "edit"


def test_a_rejection_reaches_the_model_with_the_reviewers_reason(
    model: FakeOpenAI, client: Client, reviewer: Client
) -> None:
    desk = Desk()
    model.tool_calls = [("c1", "send_email", email(str(uuid.uuid4())))]
    chat, gate = desk_chat(model, desk, client)

    with pytest.warns(RuntimeWarning, match="rejected"):
        chat_while(chat, lambda: reviewer.reject(asked(client, gate, "c1"), "Ana asked not to"))

    told = model.told("c1")
    assert "Tool call rejected." in told and "Ana asked not to" in told
    assert desk.ran == []


def test_an_expired_call_reaches_the_model_as_a_rejection_saying_so(
    gateway: Gateway, model: FakeOpenAI, client: Client
) -> None:
    desk = Desk()
    model.tool_calls = [("c1", "send_email", email(str(uuid.uuid4())))]
    chat, gate = desk_chat(model, desk, client, agent=brief_agent(gateway))

    with pytest.warns(RuntimeWarning, match="expired"):
        chat.chat(ASKED, echo="none", stream=False)

    assert gate.calls["c1"].status is Status.EXPIRED
    assert "expired" in model.told("c1")
    assert desk.ran == []


def test_a_call_still_waiting_at_the_timeout_is_withdrawn_and_never_runs(
    model: FakeOpenAI, client: Client, reviewer: Client
) -> None:
    desk = Desk()
    model.tool_calls = [("c1", "send_email", email(str(uuid.uuid4())))]
    chat, gate = desk_chat(model, desk, client, timeout=2)
    seen: list[Call] = []

    with pytest.warns(RuntimeWarning, match="cancelled"):
        chat_while(chat, lambda: seen.append(asked(client, gate, "c1")))

    assert gate.calls["c1"].status is Status.CANCELLED
    assert "cancelled" in model.told("c1")
    # A decision that comes too late is refused: the call never runs behind the model's back.
    with pytest.raises(Refused) as late:
        reviewer.approve(seen[0])
    assert late.value.refusal is RefusalCode.RUN_CANCELLED
    assert desk.ran == []


def test_a_second_process_asking_again_finds_the_decision_and_runs_the_call_once(
    gateway: Gateway, model: FakeOpenAI, client: Client, reviewer: Client
) -> None:
    input = email(str(uuid.uuid4()))
    model.tool_calls = [("c1", "send_email", input)]
    conversation_id = str(uuid.uuid4())

    # The first process dies while it waits: its connection to the gateway breaks after the ask.
    asks: list[str] = []

    def dies_after_asking(request: httpx.Request) -> httpx.Response:
        if asks:
            raise ConnectionError("the process is gone")
        asks.append(request.url.path)
        with httpx.Client(base_url=gateway.url) as real:
            return real.send(
                real.build_request(
                    request.method, request.url, headers=request.headers, content=request.content
                )
            )

    first_desk = Desk()
    with Client(
        gateway.url, REQUESTER_KEY, transport=httpx.MockTransport(dies_after_asking)
    ) as dying:
        first, first_gate = desk_chat(model, first_desk, dying, conversation_id=conversation_id)
        with pytest.raises(ConnectionError):
            first.chat(ASKED, echo="none", stream=False)
    reviewer.approve(asked(client, first_gate, "c1"))

    # The second replays the same tool request of the same conversation: the same call.
    second_desk = Desk()
    second, second_gate = desk_chat(model, second_desk, client, conversation_id=conversation_id)
    second.chat(ASKED, echo="none", stream=False)

    assert second_gate.calls["c1"].run_id == first_gate.calls["c1"].run_id
    assert first_desk.ran == [] and second_desk.runs_of("send_email") == [input]
    assert json.loads(model.told("c1")) == {"message_id": "m-1"}


def test_the_same_request_asked_again_after_it_ran_is_given_what_it_recorded(
    model: FakeOpenAI, client: Client, reviewer: Client
) -> None:
    input = email(str(uuid.uuid4()))
    model.tool_calls = [("c1", "send_email", input)]
    conversation_id = str(uuid.uuid4())
    desks = [Desk(), Desk()]

    first, first_gate = desk_chat(model, desks[0], client, conversation_id=conversation_id)
    chat_while(first, lambda: reviewer.approve(asked(client, first_gate, "c1")))
    again, again_gate = desk_chat(model, desks[1], client, conversation_id=conversation_id)
    again.chat(ASKED, echo="none", stream=False)

    assert again_gate.calls["c1"].run_id == first_gate.calls["c1"].run_id
    assert desks[0].runs_of("send_email") == [input] and desks[1].ran == []
    assert json.loads(model.told("c1")) == {"message_id": "m-1"}


@pytest.mark.asyncio
async def test_an_async_chat_waits_without_blocking_its_loop(
    gateway: Gateway, model: FakeOpenAI
) -> None:
    desk = Desk()
    input = email(str(uuid.uuid4()))
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
        chat, gate = desk_chat(model, desk, asker)
        await asyncio.wait_for(
            asyncio.gather(
                chat.chat_async(ASKED, echo="none", stream=False), approve(reviewer, gate)
            ),
            WITHIN_SECS,
        )

    assert desk.runs_of("send_email") == [input]
    assert json.loads(model.told("c1")) == {"message_id": "m-1"}
