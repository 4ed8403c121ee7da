"""countersign for chatlas (0.23): countersign's policy decides every call of a countersigned
tool, through `Chat.on_tool_request`.

chatlas has no deferred pause: a tool request is answered in the process that got it, and
`on_tool_request` can only let the tool run (return), reject the call (`ToolRejectError`,
whose reason the model is told) or stop the chat (any other exception). So the adapter's
callback asks the door (`interrupts.sorted_call`, keyed by the chat's conversation id and the
model's tool call id) and waits there for the call's outcome:

- a rejection, an expiry or a cancellation raises `ToolRejectError` with what the model is
  told (the reviewer's reason, or that the call expired);
- a call still waiting after `timeout` seconds is withdrawn (its run cancelled, so that it
  never runs later behind the model's back) and rejected as cancelled;
- a call another attempt claimed and never said how it ended raises `ExecutionInDoubt` out
  of the chat, for a person to check;
- a call that may run returns, and the tool, which the adapter wraps, gives the model the
  result countersign's worker recorded for a tool with an endpoint (the function does not
  run), or runs the function with countersign's input (the reviewer's, after an edit, and the
  model is told) inside the call's execution claim, so that it never runs twice.

The callback hands the call to the tool through a context variable: chatlas runs a
request's tool right after its callbacks, in the same context, one request at a time.
"""

from __future__ import annotations

import inspect
import json
import uuid
from collections.abc import Callable, Collection, Sequence
from contextvars import ContextVar
from typing import Any, cast

from chatlas import AssistantTurn, Chat, ContentToolRequest, Tool, ToolRejectError, Turn, UserTurn

from ..async_client import AsyncClient
from ..calls import Call, Executes
from ..client import Client
from ..errors import AlreadyExecuted, Conflict, ExecutionInDoubt, StillPending
from ..operations import Flow, drive, drive_async
from ._released import (
    countersign_error,
    countersign_result,
    edited,
    failed_elsewhere,
    run_released,
    run_released_async,
)
from .interrupts import refusal, sorted_call

#: Why a call still waiting at the adapter's timeout is withdrawn, as its run's cancel says.
WITHDRAWN = "withdrawn by the agent: no decision within its timeout"
#: How long a withdrawn call may take to read as cancelled (or as decided, when a decision
#: came first).
WITHDRAW_SECS = 30.0

#: The call the callback let through, for the tool chatlas runs next.
_cleared: ContextVar[Call | None] = ContextVar("countersign_chatlas_cleared", default=None)


class Gate:
    """What `countersign_chat` puts in front of a chat's tools. `calls` holds each tool
    request's countersign call as last seen, by the request's id, from the moment it is
    sorted (so that the application can tell which call a waiting request is)."""

    def __init__(
        self, chat: Chat[Any, Any], agent: str, names: Collection[str], timeout: float | None
    ) -> None:
        self.chat = chat
        self.agent = agent
        self.names = frozenset(names)
        self.timeout = timeout
        self.calls: dict[str, Call] = {}

    def _sorted(self, request: ContentToolRequest) -> Flow[Call]:
        """The request asked of the door until sorted: asked the same way each time, so the
        same request of the same conversation is the same call."""
        if not isinstance(request.arguments, dict):
            raise ToolRejectError(f"{request.name} takes an object of arguments")
        if self.chat.conversation_id is None:
            self.chat.conversation_id = str(uuid.uuid4())
        task, message = _asked(self.chat.get_turns(), request.id)
        return sorted_call(
            self.agent,
            request.name,
            request.arguments,
            session=self.chat.conversation_id,
            tool_call_id=request.id,
            task=task,
            message=message,
        )

    def _settle(self, request: ContentToolRequest, call: Call) -> None:
        """Rejects a call that will not run; clears any other for the tool run next."""
        self.calls[request.id] = call
        stopped = refusal(call)
        if stopped is not None:
            raise ToolRejectError(stopped)
        if not call.outcome_reached:
            # A withdrawn call read neither cancelled nor decided in time: the chat stops
            # rather than run it or tell the model it will not run.
            raise StillPending(call)
        if call.execution is not None and not call.execution.finished:
            raise ExecutionInDoubt(call.execution)
        _cleared.set(call)

    @staticmethod
    def _take(name: str) -> Call:
        """The call the callback cleared for this run of the tool, taken so that it clears one
        run only. Without one (the callback removed, the tool called by other code) nothing
        runs."""
        call = _cleared.get()
        _cleared.set(None)
        if call is None or call.tool != name:
            raise RuntimeError(f"{name} was not cleared by countersign for this request")
        return call

    def _tool(self, tool: Tool, run: Callable[..., Any]) -> Tool:
        """`tool` as the model sees it (name, description, parameters), running `run`."""
        definition = tool.schema["function"]
        return Tool(
            func=run,
            name=tool.name,
            description=definition.get("description", ""),
            parameters=dict(definition.get("parameters", {})),
            annotations=tool.annotations,
            strict=definition.get("strict"),
        )


class SyncGate(Gate):
    """The gate of a chat used with `chat()` and `stream()`, asking with a `Client`."""

    def __init__(self, chat: Chat[Any, Any], client: Client, **settings: Any) -> None:
        super().__init__(chat, **settings)
        self.client = client

    def on_tool_request(self, request: ContentToolRequest) -> None:
        if request.name not in self.names:
            return
        call = drive(self._sorted(request), self.client.send)
        self.calls[request.id] = call
        call = self.client.wait(call, self.timeout)
        if not call.outcome_reached:
            call = self._withdraw(call)
        self._settle(request, call)

    def _withdraw(self, call: Call) -> Call:
        try:
            self.client.cancel_run(call.run_id, reason=WITHDRAWN)
        except Conflict:
            pass  # it ended meanwhile: its outcome is what counts
        return self.client.wait(call, WITHDRAW_SECS)

    def wrap(self, tool: Tool) -> Tool:
        func = tool.func

        def run(**_: Any) -> Any:
            call = self._take(tool.name)
            if call.executes is Executes.COUNTERSIGN:
                return _ran_by_countersign(call)
            try:
                output = run_released(self.client, call, lambda: func(**call.input))
            except AlreadyExecuted as done:
                raise RuntimeError(failed_elsewhere(done)) from done
            return _told(call, output)

        return self._tool(tool, run)


class AsyncGate(Gate):
    """The gate of a chat used with `chat_async()` and `stream_async()`, asking with an
    `AsyncClient`, so that waiting for a person does not block the event loop."""

    def __init__(self, chat: Chat[Any, Any], client: AsyncClient, **settings: Any) -> None:
        super().__init__(chat, **settings)
        self.client = client

    async def on_tool_request(self, request: ContentToolRequest) -> None:
        if request.name not in self.names:
            return
        call = await drive_async(self._sorted(request), self.client.send)
        self.calls[request.id] = call
        call = await self.client.wait(call, self.timeout)
        if not call.outcome_reached:
            call = await self._withdraw(call)
        self._settle(request, call)

    async def _withdraw(self, call: Call) -> Call:
        try:
            await self.client.cancel_run(call.run_id, reason=WITHDRAWN)
        except Conflict:
            pass  # it ended meanwhile: its outcome is what counts
        return await self.client.wait(call, WITHDRAW_SECS)

    def wrap(self, tool: Tool) -> Tool:
        func = tool.func

        async def run(**_: Any) -> Any:
            call = self._take(tool.name)
            if call.executes is Executes.COUNTERSIGN:
                return _ran_by_countersign(call)

            async def invoke() -> Any:
                output = func(**call.input)
                return await output if inspect.isawaitable(output) else output

            try:
                output = await run_released_async(self.client, call, invoke)
            except AlreadyExecuted as done:
                raise RuntimeError(failed_elsewhere(done)) from done
            return _told(call, output)

        return self._tool(tool, run)


def countersign_chat(
    chat: Chat[Any, Any],
    client: Client | AsyncClient,
    *,
    agent: str,
    tools: Collection[str] | None = None,
    timeout: float | None = None,
) -> Gate:
    """Puts countersign in front of `chat`'s tools (those named in `tools`, default all
    registered so far): each request for one is asked as a call of the `external` agent
    `agent`'s tool of the same name, with `client` (a key that may start runs), and waited for
    at most `timeout` seconds (None: as long as it takes). A `Client` serves `chat()`; an
    `AsyncClient`, `chat_async()`.

    Register the chat's tools before, and callbacks that may reject a request after (chatlas
    runs the newest first), so that a request they reject is never asked. A chat without a
    `conversation_id` is given one at its first request: keep it with the chat's turns, so
    that a process that asks the same tool requests again asks the same calls.
    """
    registered = chat.get_tools()
    names = {t.name for t in registered if isinstance(t, Tool)} if tools is None else set(tools)
    settings: dict[str, Any] = {"agent": agent, "names": names, "timeout": timeout}
    gate: SyncGate | AsyncGate
    if isinstance(client, AsyncClient):
        gate = AsyncGate(chat, client, **settings)
    else:
        gate = SyncGate(chat, client, **settings)
    chat.set_tools(
        [gate.wrap(t) if isinstance(t, Tool) and t.name in names else t for t in registered]
    )
    # chatlas awaits an async callback under `chat_async()`, though its annotation names only
    # plain ones.
    chat.on_tool_request(cast(Callable[[ContentToolRequest], None], gate.on_tool_request))
    return gate


def _ran_by_countersign(call: Call) -> str:
    """The answer of a call whose tool countersign ran: its result, or its failure raised as
    the tool's error, which chatlas tells the model."""
    error = countersign_error(call)
    if error is not None:
        raise RuntimeError(error)
    return countersign_result(call)


def _told(call: Call, output: Any) -> Any:
    """The function's output, after what the model is told of an edit (chatlas keeps the
    model's own arguments in its history, not the ones that ran)."""
    note = edited(call)
    if note is None:
        return output
    return f"{note}\n\n{output if isinstance(output, str) else json.dumps(output, default=str)}"


def _asked(turns: Sequence[Turn], request_id: str) -> tuple[str | None, str]:
    """The user's request before the assistant turn holding tool request `request_id`, and
    what the model said in that turn: both the same each time the request is asked."""
    for index in range(len(turns) - 1, -1, -1):
        turn = turns[index]
        if isinstance(turn, AssistantTurn) and any(
            isinstance(c, ContentToolRequest) and c.id == request_id for c in turn.contents
        ):
            requests = (t.text for t in reversed(turns[:index]) if isinstance(t, UserTurn))
            return next((text for text in requests if text), None), turn.text
    return None, ""
