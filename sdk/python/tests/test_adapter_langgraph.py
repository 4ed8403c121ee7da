"""The LangGraph adapter against the real framework (langgraph, langchain's `create_agent`
and `HumanInTheLoopMiddleware` from PyPI, driven by LangChain's fake chat model) and the real
gateway and worker: what the policy lets through runs at once, held calls interrupt the
thread and countersign's decisions resume it with `Command(resume=...)`, and a paused thread
kept by a SQLite checkpointer is resumed by another process."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from pydantic import Field

from countersign import Client, ExecutionInDoubt
from countersign.adapters.interrupts import FilePauses, Pause, idempotency_key
from countersign.adapters.langgraph import Countersign, Graph

from .conftest import REQUESTER_KEY, Gateway
from .interrupts_support import (
    Desk,
    WaitedAsyncClient,
    WaitedClient,
    brief_agent,
    check_receipt,
    decide_when_waited,
    fresh,
    pending_with,
)
from .support import AGENT, WITHIN_SECS

COUNTERSIGNED = ("issue_refund", "send_email", "note_customer")


class ScriptedChat(GenericFakeChatModel):
    """LangChain's fake chat model, answering with its scripted messages in turn; it takes
    the agent's tools as a real model does, and keeps what it was given each turn."""

    seen: list[list[BaseMessage]] = Field(default_factory=list)

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChat:  # type: ignore[override]
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.seen.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


def calls(*tool_calls: tuple[str, dict[str, Any], str]) -> AIMessage:
    """A model turn calling tools: (name, arguments, id) each."""
    return AIMessage(
        content="",
        tool_calls=[{"name": n, "args": a, "id": i, "type": "tool_call"} for n, a, i in tool_calls],
    )


def desk_graph(
    countersign: Countersign,
    desk: Desk,
    *turns: AIMessage,
    checkpointer: BaseCheckpointSaver[Any] | None = None,
) -> tuple[Graph, ScriptedChat]:
    model = ScriptedChat(messages=iter(turns))
    graph = create_agent(
        model,
        tools=desk.tools(),
        middleware=countersign.middleware(),
        checkpointer=checkpointer or InMemorySaver(),
    )
    return graph, model


def thread(thread_id: str | None = None) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id or fresh("t")}}


def asked(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def results(state: dict[str, Any]) -> dict[str, ToolMessage]:
    """The tool messages of the thread, by tool call id."""
    return {m.tool_call_id: m for m in state["messages"] if isinstance(m, ToolMessage)}


@pytest.fixture
def requester(gateway: Gateway) -> Iterator[WaitedClient]:
    """The support desk's client, which the agent asks with."""
    with WaitedClient(gateway.url, REQUESTER_KEY) as client:
        yield client


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=2) as reviewers:
        yield reviewers


def test_calls_the_policy_lets_through_run_at_once(gateway: Gateway, client: Client) -> None:
    desk = Desk(gateway)
    order = fresh("A")
    note = {"customer": "ana", "note": "prefers email"}
    countersign = Countersign(client, AGENT, COUNTERSIGNED)
    graph, _ = desk_graph(
        countersign,
        desk,
        calls(
            ("note_customer", note, "note-1"),
            ("issue_refund", {"order_id": order, "amount": 15}, "refund-1"),
        ),
        AIMessage(content="Noted and refunded."),
    )

    state = countersign.invoke(graph, asked("Refund A"), thread())

    assert state["messages"][-1].content == "Noted and refunded."
    assert "__interrupt__" not in state
    assert desk.ran == [("note_customer", note)]
    given = results(state)
    assert (given["note-1"].content, given["note-1"].status) == ("noted about ana", "success")
    refund = json.loads(str(given["refund-1"].content))
    assert (refund["order_id"], refund["amount"], refund["status"]) == (order, 15, "refunded")


def test_a_held_refund_approved_runs_once_in_countersign_with_its_receipt(
    gateway: Gateway, requester: WaitedClient, reviewer: Client, pool: ThreadPoolExecutor
) -> None:
    desk = Desk(gateway)
    input = {"order_id": fresh("A"), "amount": 40}
    countersign = Countersign(requester, AGENT, COUNTERSIGNED, timeout=WITHIN_SECS)
    graph, _ = desk_graph(
        countersign,
        desk,
        calls(("issue_refund", input, "refund-1")),
        AIMessage(content="Refunded."),
    )
    approval = decide_when_waited(
        pool, requester, reviewer, "issue_refund", input, lambda r, c: r.approve(c)
    )

    state = countersign.invoke(graph, asked("Refund the lamp"), thread())

    assert state["messages"][-1].content == "Refunded."
    assert desk.ran == []  # countersign's worker ran it, not the framework
    refund = json.loads(str(results(state)["refund-1"].content))
    assert (refund["order_id"], refund["amount"], refund["status"]) == (
        input["order_id"],
        40,
        "refunded",
    )
    held = approval.result()
    call = requester.get_call(held.run_id, held.call_id, wait_secs=0)
    assert call.result is not None and json.loads(call.result.content) == refund
    checked = check_receipt(gateway, call, "issue_refund", input)
    assert (checked.claims.action, checked.claims.call_id) == ("approve", held.call_id)


def test_an_edit_runs_the_reviewers_input_and_the_model_is_told(
    gateway: Gateway, requester: WaitedClient, reviewer: Client, pool: ThreadPoolExecutor
) -> None:
    desk = Desk(gateway)
    email = {"to": "ana@example.com", "body": f"Refund {fresh('r')} is on its way."}
    edited = {"to": "ana@example.com", "body": "Your refund of $40 is on its way."}
    countersign = Countersign(requester, AGENT, COUNTERSIGNED, timeout=WITHIN_SECS)
    graph, _ = desk_graph(
        countersign, desk, calls(("send_email", email, "email-1")), AIMessage(content="Emailed.")
    )
    decide_when_waited(
        pool, requester, reviewer, "send_email", email, lambda r, c: r.edit(c, edited)
    )

    state = countersign.invoke(graph, asked("Tell Ana"), thread())

    assert state["messages"][-1].content == "Emailed."
    assert desk.ran == [("send_email", edited)]
    assert desk.receipts == [("send_email", "edit")]
    given = str(results(state)["email-1"].content)
    # HumanInTheLoopMiddleware's own notice of an edit, naming what ran.
    assert given.startswith("Note: a human reviewer replaced this tool call before it ran.")
    notice, _, output = given.partition("\n\nTool response:\n")
    ran_with = notice.partition("Executed instead: send_email with arguments ")[2].rstrip(".")
    assert json.loads(ran_with) == edited and output == "sent to ana@example.com"


def test_a_rejection_reaches_the_model_with_its_reason_beside_an_approval(
    gateway: Gateway, requester: WaitedClient, reviewer: Client, pool: ThreadPoolExecutor
) -> None:
    desk = Desk(gateway)
    to_ana = {"to": "ana@example.com", "body": f"Refund {fresh('r')} is on its way."}
    to_bo = {"to": "bo@example.com", "body": f"Refund {fresh('r')} is on its way."}
    countersign = Countersign(requester, AGENT, COUNTERSIGNED, timeout=WITHIN_SECS)
    graph, model = desk_graph(
        countersign,
        desk,
        calls(("send_email", to_ana, "email-1"), ("send_email", to_bo, "email-2")),
        AIMessage(content="I emailed Bo only."),
    )
    rejection = decide_when_waited(
        pool, requester, reviewer, "send_email", to_ana, lambda r, c: r.reject(c, "No refunds.")
    )
    approval = decide_when_waited(
        pool, requester, reviewer, "send_email", to_bo, lambda r, c: r.approve(c)
    )

    state = countersign.invoke(graph, asked("Tell Ana and Bo"), thread())

    rejection.result(), approval.result()
    assert state["messages"][-1].content == "I emailed Bo only."
    assert desk.ran == [("send_email", to_bo)]
    told = {m.tool_call_id: m for m in model.seen[-1] if isinstance(m, ToolMessage)}
    assert (told["email-1"].status, told["email-1"].content) == (
        "error",
        (
            "User rejected the tool call for `send_email` with reason: The call was not run: "
            "you rejected it in countersign, saying: No refunds."
        ),
    )
    assert (told["email-2"].status, told["email-2"].content) == (
        "success",
        "sent to bo@example.com",
    )


def test_an_expired_call_reaches_the_model_as_expired_and_nothing_runs(
    gateway: Gateway, client: Client
) -> None:
    desk = Desk(gateway)
    email = {"to": "ana@example.com", "body": f"Refund {fresh('r')} is on its way."}
    countersign = Countersign(
        client, brief_agent(client, gateway), ("send_email",), timeout=WITHIN_SECS
    )
    graph, model = desk_graph(
        countersign,
        desk,
        calls(("send_email", email, "email-1")),
        AIMessage(content="Nobody answered."),
    )

    state = countersign.invoke(graph, asked("Tell Ana"), thread())

    assert state["messages"][-1].content == "Nobody answered."
    assert desk.ran == []
    told = model.seen[-1][-1]
    assert isinstance(told, ToolMessage) and "expired" in str(told.content)


def test_a_paused_thread_is_resumed_by_another_process_once_decided(
    gateway: Gateway, reviewer: Client, tmp_path: Path
) -> None:
    email = {"to": "ana@example.com", "body": f"Refund {fresh('r')} is on its way."}
    config = thread()
    checkpoints = tmp_path / "checkpoints.sqlite"
    pauses = tmp_path / "pauses"

    def first_process() -> Pause:
        with (
            gateway.client() as client,
            closing(sqlite3.connect(checkpoints, check_same_thread=False)) as connection,
        ):
            desk = Desk(gateway)
            countersign = Countersign(client, AGENT, COUNTERSIGNED)
            graph, _ = desk_graph(
                countersign,
                desk,
                calls(("send_email", email, "email-1")),
                checkpointer=SqliteSaver(connection),
            )
            paused = countersign.start(graph, asked("Tell Ana"), config, FilePauses(pauses))
            assert isinstance(paused, Pause)
            # Asked to resume before anyone decided, it changes nothing.
            [waiting] = paused.calls
            again = countersign.resume(graph, waiting.run_id, waiting.call_id, FilePauses(pauses))
            assert again == paused and desk.ran == []
            return paused

    paused = first_process()
    [waiting] = paused.calls
    assert (waiting.tool_call_id, paused.session) == (
        "email-1",
        config["configurable"]["thread_id"],
    )
    [held] = pending_with(reviewer, "send_email", email)
    assert (held.run_id, held.call_id) == (waiting.run_id, waiting.call_id)
    reviewer.approve(held)

    # The second process: nothing shared but the checkpoints and the pauses on disk.
    with (
        gateway.client() as client,
        closing(sqlite3.connect(checkpoints, check_same_thread=False)) as connection,
    ):
        desk = Desk(gateway)
        countersign = Countersign(client, AGENT, COUNTERSIGNED)
        graph, _ = desk_graph(
            countersign, desk, AIMessage(content="Emailed."), checkpointer=SqliteSaver(connection)
        )
        store = FilePauses(pauses)
        state = countersign.resume(graph, waiting.run_id, waiting.call_id, store)
        assert isinstance(state, dict)
        assert state["messages"][-1].content == "Emailed."
        assert desk.ran == [("send_email", email)]
        assert desk.receipts == [("send_email", "approve")]
        assert results(state)["email-1"].content == "sent to ana@example.com"
        # Resumed once: the pause is gone.
        assert countersign.resume(graph, waiting.run_id, waiting.call_id, store) is None


def test_the_same_call_asked_again_is_the_same_call_and_never_runs_twice(
    gateway: Gateway, requester: WaitedClient, reviewer: Client, pool: ThreadPoolExecutor
) -> None:
    email = {"to": "ana@example.com", "body": f"Refund {fresh('r')} is on its way."}
    config = thread()
    desk = Desk(gateway)

    def run_once(answer: str) -> ToolMessage:
        # A fresh checkpointer each time: the thread is run again from the start, as after a
        # crash that lost its state (the same thread and tool call ids).
        countersign = Countersign(requester, AGENT, COUNTERSIGNED, timeout=WITHIN_SECS)
        graph, _ = desk_graph(
            countersign, desk, calls(("send_email", email, "email-1")), AIMessage(content=answer)
        )
        state = countersign.invoke(graph, asked("Tell Ana"), config)
        assert state["messages"][-1].content == answer
        return results(state)["email-1"]

    approval = decide_when_waited(
        pool, requester, reviewer, "send_email", email, lambda r, c: r.approve(c)
    )
    first = run_once("Emailed.")
    approval.result()
    second = run_once("Emailed, as before.")

    assert desk.ran == [("send_email", email)]
    assert first.content == second.content == "sent to ana@example.com"
    assert pending_with(reviewer, "send_email", email) == []


def test_a_call_another_attempt_left_in_doubt_is_never_run_again(
    gateway: Gateway, client: Client
) -> None:
    note = {"customer": "ana", "note": fresh("n")}
    config = thread()
    # Another process asked the same call, claimed it, and died before saying how it ended.
    call = client.ask(
        AGENT,
        "note_customer",
        note,
        idempotency_key=idempotency_key(config["configurable"]["thread_id"], "note-1"),
        task="Note it",
        session=config["configurable"]["thread_id"],
    )
    with pytest.raises(KeyboardInterrupt), client.executing(client.wait(call, WITHIN_SECS)):
        raise KeyboardInterrupt
    desk = Desk(gateway)
    countersign = Countersign(client, AGENT, COUNTERSIGNED)
    graph, _ = desk_graph(countersign, desk, calls(("note_customer", note, "note-1")))

    with pytest.raises(ExecutionInDoubt):
        countersign.invoke(graph, asked("Note it"), config)

    assert desk.ran == []


@pytest.mark.asyncio
async def test_an_async_graph_runs_the_free_call_and_waits_for_the_held_one(
    gateway: Gateway, reviewer: Client, pool: ThreadPoolExecutor
) -> None:
    desk = Desk(gateway)
    note = {"customer": "ana", "note": fresh("n")}
    email = {"to": "ana@example.com", "body": f"Refund {fresh('r')} is on its way."}
    async with WaitedAsyncClient(gateway.url, REQUESTER_KEY) as client:
        approval = decide_when_waited(
            pool, client, reviewer, "send_email", email, lambda r, c: r.approve(c)
        )
        countersign = Countersign(client, AGENT, COUNTERSIGNED, timeout=WITHIN_SECS)
        graph, _ = desk_graph(
            countersign,
            desk,
            calls(("note_customer", note, "note-1"), ("send_email", email, "email-1")),
            AIMessage(content="Done."),
        )
        state = await countersign.ainvoke(graph, asked("Note and tell Ana"), thread())

    approval.result()
    assert state["messages"][-1].content == "Done."
    assert sorted(desk.ran, key=lambda ran: ran[0]) == [
        ("note_customer", note),
        ("send_email", email),
    ]
    assert desk.receipts == [("send_email", "approve")]
    given = results(state)
    assert given["note-1"].content == "noted about ana"
    assert given["email-1"].content == "sent to ana@example.com"


@pytest.mark.asyncio
async def test_an_async_thread_paused_is_resumed_by_another_process(
    gateway: Gateway, reviewer: Client, tmp_path: Path
) -> None:
    email = {"to": "ana@example.com", "body": f"Refund {fresh('r')} is on its way."}
    config = thread()
    checkpoints = str(tmp_path / "checkpoints.sqlite")
    pauses = tmp_path / "pauses"

    async with (
        gateway.async_client() as client,
        AsyncSqliteSaver.from_conn_string(checkpoints) as saver,
    ):
        countersign = Countersign(client, AGENT, COUNTERSIGNED)
        graph, _ = desk_graph(
            countersign, Desk(gateway), calls(("send_email", email, "email-1")), checkpointer=saver
        )
        paused = await countersign.astart(graph, asked("Tell Ana"), config, FilePauses(pauses))
    assert isinstance(paused, Pause)
    [waiting] = paused.calls
    [held] = pending_with(reviewer, "send_email", email)
    reviewer.edit(held, {**email, "body": "Your refund is on its way."})

    async with (
        gateway.async_client() as client,
        AsyncSqliteSaver.from_conn_string(checkpoints) as saver,
    ):
        desk = Desk(gateway)
        countersign = Countersign(client, AGENT, COUNTERSIGNED)
        graph, _ = desk_graph(countersign, desk, AIMessage(content="Emailed."), checkpointer=saver)
        state = await countersign.aresume(
            graph, waiting.run_id, waiting.call_id, FilePauses(pauses)
        )

    assert isinstance(state, dict) and state["messages"][-1].content == "Emailed."
    assert desk.ran == [("send_email", {**email, "body": "Your refund is on its way."})]
    assert desk.receipts == [("send_email", "edit")]
