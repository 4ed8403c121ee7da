"""countersign for LangGraph agents made with LangChain's `create_agent`: countersign's policy
decides every call of a countersigned tool, through LangGraph's human-in-the-loop interrupts.

`Countersign(...).middleware()` is the agent's middleware: LangChain's own
`HumanInTheLoopMiddleware` (batched: one interrupt per model turn), whose reviewer is
countersign, and this module's middleware after it. After each model turn, this middleware
asks the door about every countersigned tool call and keeps each call's ids in the graph's
state; a held call makes `HumanInTheLoopMiddleware` interrupt the run, and the interrupt is
answered with `Command(resume=...)` carrying the decisions countersign reached: `approve`,
`edit` with the reviewer's input (the middleware runs it and tells the model), or `reject`
with what the model is told (the reviewer's reason, or that the call expired). `invoke`
waits for them in this process; `start` records the paused thread under countersign's ids
and returns, and `resume` continues it in any process once they are decided: the graph's
checkpointer keeps the state, so it must outlive the process (a SQLite checkpointer).

Around each countersigned tool call this middleware enforces what countersign says, whatever
the graph was resumed with: a call released to the agent runs with countersign's input, only
inside its execution claim (`executing`), so a call is never run twice; a call countersign
runs itself (its tool has an endpoint) is not run here: the model gets the result
countersign's worker recorded.

The graph may be run with `invoke` (give a `countersign.Client`) or `ainvoke` (an
`AsyncClient`); the middleware's hooks and this module's helpers of each kind use that one.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Annotated, Any, Literal, cast

from langchain.agents.middleware import (
    AgentMiddleware,
    AgentState,
    HumanInTheLoopMiddleware,
    InterruptOnConfig,
    ToolCallRequest,
)
from langchain.agents.middleware.types import PrivateStateAttr
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_config
from langgraph.pregel import Pregel
from langgraph.runtime import Runtime
from langgraph.types import Command, StateSnapshot
from typing_extensions import NotRequired

from ..async_client import AsyncClient
from ..calls import Call, Executes, Status
from ..client import Client
from ..errors import AlreadyExecuted, StillPending
from ..operations import Flow, drive, drive_async
from .interrupts import (
    HeldCall,
    Pause,
    PauseStore,
    failure,
    for_a_person,
    looked_up,
    refusal,
    running,
    sorted_call,
)

#: The graph state's key for the countersign call of each countersigned tool call of the
#: latest model turn, by tool call id: `run_id`, `call_id`, and `held` (whether a person held
#: or decided it when it was asked, which decides whether the turn is interrupted for it).
STATE_KEY = "countersign_calls"

Graph = Pregel[Any, Any, Any, Any]


class CountersignState(AgentState[Any]):
    countersign_calls: NotRequired[Annotated[dict[str, dict[str, Any]], PrivateStateAttr]]


def decision_for(call: Call) -> dict[str, Any]:
    """The `HumanInTheLoopMiddleware` decision countersign's outcome is: `reject` for a call
    a person, the deadline or a cancellation stopped, with what the model is told; `edit`
    with the reviewer's input; `approve` otherwise (a failure is told by the tool call's
    middleware). Raises `StillPending` for a call with no outcome yet."""
    if not call.outcome_reached:
        raise StillPending(call)
    stopped = refusal(call)
    if stopped is not None:
        return {"type": "reject", "message": stopped}
    if call.status is Status.EDITED:
        return {"type": "edit", "edited_action": {"name": call.tool, "args": call.input}}
    return {"type": "approve"}


class ToolError(Exception):
    """The tool answered with an error message: reported as the call's failure in its
    execution record, and given to the model as it was."""

    def __init__(self, message: ToolMessage) -> None:
        super().__init__(_text(message.content))
        self.message = message


class Countersign(AgentMiddleware[CountersignState, Any, Any]):
    """Countersigns the calls of `tools` (their names, as in the agent file) of the
    countersign `external` agent `agent`, asked with `client` (a key that may start runs).
    `timeout` bounds how long `invoke` waits for a person (None: as long as it takes)."""

    state_schema = CountersignState

    def __init__(
        self,
        client: Client | AsyncClient,
        agent: str,
        tools: Iterable[str],
        *,
        timeout: float | None = None,
    ) -> None:
        super().__init__()
        self.client = client
        self.agent = agent
        self.countersigned = frozenset(tools)
        self.timeout = timeout

    def middleware(self) -> list[AgentMiddleware[Any, Any, Any]]:
        """The agent's middleware for `create_agent`, in this order: the
        human-in-the-loop middleware interrupts for the calls countersign holds, and this
        one, after it, asks countersign first (its `after_model` runs before) and runs
        each call inside (its tool-call wrapper is inside, so it gets an edit applied)."""
        review = InterruptOnConfig(
            allowed_decisions=["approve", "edit", "reject"],
            when=self._interrupts,
            description=self._describe,
        )
        hitl = HumanInTheLoopMiddleware(interrupt_on=dict.fromkeys(self.countersigned, review))
        return [hitl, self]

    # The hooks

    def after_model(self, state: CountersignState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return drive(self._sorting(state), self._sync().send)

    async def aafter_model(
        self, state: CountersignState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        return await drive_async(self._sorting(state), self._async().send)

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        if request.tool_call["name"] not in self.countersigned:
            return handler(request)
        client = self._sync()
        call = client.get_call(*_ids(request), wait_secs=0)
        answer = _answer(request, call)
        if answer is not None:
            return answer
        try:
            with client.executing(call) as attempt, running(attempt.call):
                result = handler(_with_input(request, call))
                attempt.result = _recorded(result)
        except AlreadyExecuted as done:
            return _replayed(request, done)
        except ToolError as failed:
            return failed.message
        return result

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        if request.tool_call["name"] not in self.countersigned:
            return await handler(request)
        client = self._async()
        call = await client.get_call(*_ids(request), wait_secs=0)
        answer = _answer(request, call)
        if answer is not None:
            return answer
        try:
            async with client.executing(call) as attempt:
                with running(attempt.call):
                    result = await handler(_with_input(request, call))
                attempt.result = _recorded(result)
        except AlreadyExecuted as done:
            return _replayed(request, done)
        except ToolError as failed:
            return failed.message
        return result

    # Running the graph

    def invoke(self, graph: Graph, input: Any, config: RunnableConfig) -> Any:
        """`graph.invoke(input, config)`, waiting in this process for the decisions on every
        held call and resuming with them, until the run ends or stops on an interrupt that
        is not countersign's. Raises `StillPending` when `timeout` passes first."""
        client = self._sync()
        result = graph.invoke(input, config)
        while (paused := self._paused(graph.get_state(config))) is not None:
            interrupt_id, held = paused
            calls = [client.wait(_unseen(h), self.timeout) for h in held]
            result = graph.invoke(_resumed(interrupt_id, calls), config)
        return result

    async def ainvoke(self, graph: Graph, input: Any, config: RunnableConfig) -> Any:
        """`invoke` for `graph.ainvoke`."""
        client = self._async()
        result = await graph.ainvoke(input, config)
        while (paused := self._paused(await graph.aget_state(config))) is not None:
            interrupt_id, held = paused
            calls = [await client.wait(_unseen(h), self.timeout) for h in held]
            result = await graph.ainvoke(_resumed(interrupt_id, calls), config)
        return result

    def start(self, graph: Graph, input: Any, config: RunnableConfig, store: PauseStore) -> Any:
        """`graph.invoke(input, config)` without waiting for a person: when countersign holds
        a call, the thread is recorded in `store` under each held call's ids and the `Pause`
        returned (the checkpointer keeps the graph's state); `resume` continues it."""
        result = graph.invoke(input, config)
        return self._pause(graph.get_state(config), store) or result

    async def astart(
        self, graph: Graph, input: Any, config: RunnableConfig, store: PauseStore
    ) -> Any:
        """`start` for `graph.ainvoke`."""
        result = await graph.ainvoke(input, config)
        return self._pause(await graph.aget_state(config), store) or result

    def resume(
        self,
        graph: Graph,
        run_id: str,
        call_id: str,
        store: PauseStore,
        config: RunnableConfig | None = None,
    ) -> Any:
        """Continues the thread paused on countersign call `call_id` of run `run_id`, in this
        process or another (`graph` built as it was, on the same checkpointer; `config`
        adds to the thread's): when every call it waits on has its outcome, the graph is
        resumed with their decisions and its result returned (or the next `Pause`); while
        one is still waiting, the pause is returned unchanged. None when nothing is paused
        on that call (never, or resumed already)."""
        pause = store.load(run_id, call_id)
        if pause is None:
            return None
        calls = drive(looked_up(pause.calls), self._sync().send)
        if not all(call.outcome_reached for call in calls.values()):
            return pause
        config = _thread(pause.session, config)
        command = self._resuming(graph.get_state(config), pause, calls, store)
        if command is None:
            return None
        result = graph.invoke(command, config)
        return self._moved_on(self._pause(graph.get_state(config), store) or result, pause, store)

    async def aresume(
        self,
        graph: Graph,
        run_id: str,
        call_id: str,
        store: PauseStore,
        config: RunnableConfig | None = None,
    ) -> Any:
        """`resume` for `graph.ainvoke`."""
        pause = store.load(run_id, call_id)
        if pause is None:
            return None
        calls = await drive_async(looked_up(pause.calls), self._async().send)
        if not all(call.outcome_reached for call in calls.values()):
            return pause
        config = _thread(pause.session, config)
        command = self._resuming(await graph.aget_state(config), pause, calls, store)
        if command is None:
            return None
        result = await graph.ainvoke(command, config)
        paused = self._pause(await graph.aget_state(config), store)
        return self._moved_on(paused or result, pause, store)

    # What the hooks and helpers share, sync or async

    def _sync(self) -> Client:
        if not isinstance(self.client, Client):
            raise TypeError("graph.invoke runs the sync hooks: give Countersign a Client")
        return self.client

    def _async(self) -> AsyncClient:
        if not isinstance(self.client, AsyncClient):
            raise TypeError("graph.ainvoke runs the async hooks: give Countersign an AsyncClient")
        return self.client

    def _sorting(self, state: CountersignState) -> Flow[dict[str, Any] | None]:
        """Asks the door about the countersigned calls of the model's latest turn, and
        records them in the state for the interrupt and the tool calls that follow."""
        message = _latest_ai(state["messages"])
        if message is None:
            return None
        tool_calls = [c for c in message.tool_calls if c["name"] in self.countersigned]
        if not tool_calls:
            return None
        session = _thread_id(get_config())
        task = _task(state["messages"])
        recorded: dict[str, dict[str, Any]] = {}
        for tool_call in tool_calls:
            tool_call_id = _tool_call_id(tool_call)
            call = yield from sorted_call(
                self.agent,
                tool_call["name"],
                tool_call["args"],
                session=session,
                tool_call_id=tool_call_id,
                task=task,
                message=str(message.text),
            )
            recorded[tool_call_id] = {
                "run_id": call.run_id,
                "call_id": call.call_id,
                "held": for_a_person(call),
            }
        return {STATE_KEY: recorded}

    def _interrupts(self, request: ToolCallRequest) -> bool:
        """`HumanInTheLoopMiddleware`'s `when`: whether the run stops for this call, read
        from the state so that it answers the same when the interrupted step runs again on
        resume. A call countersign was not asked about (it cannot be) stops the run."""
        recorded = _recorded_call(request.state, request.tool_call.get("id"))
        return recorded is None or bool(recorded["held"])

    def _describe(self, tool_call: Any, state: Any, runtime: Any) -> str:
        recorded = _recorded_call(state, tool_call.get("id"))
        if recorded is None:
            return f"countersign was not asked about this call of {tool_call['name']}"
        return (
            f"countersign holds this call of {tool_call['name']} for a person "
            f"(run {recorded['run_id']}, call {recorded['call_id']}); its decision resumes it"
        )

    def _paused(self, snapshot: StateSnapshot) -> tuple[str, list[HeldCall]] | None:
        """The interrupt the thread waits on that is countersign's (all its calls are of
        countersigned tools), and its calls in the order of its action requests, which is
        the order of the decisions that answer it."""
        for interrupt in snapshot.interrupts:
            value = interrupt.value
            if not isinstance(value, dict) or "action_requests" not in value:
                continue
            requests = value["action_requests"]
            if not all(request["name"] in self.countersigned for request in requests):
                continue
            held = _held_calls(snapshot.values)
            if [(r["name"], r["args"]) for r in requests] != [
                (c["name"], c["args"]) for c, _ in held
            ]:
                raise RuntimeError(
                    "the interrupt's calls are not the ones countersign holds: was the "
                    "human-in-the-loop middleware made by Countersign.middleware()?"
                )
            return interrupt.id, [one for _, one in held]
        return None

    def _pause(self, snapshot: StateSnapshot, store: PauseStore) -> Pause | None:
        """The thread recorded in `store` under its held calls, if it waits on them."""
        paused = self._paused(snapshot)
        if paused is None:
            return None
        pause = Pause(session=_thread_id(snapshot.config), calls=tuple(paused[1]))
        store.save(pause)
        return pause

    def _resuming(
        self,
        snapshot: StateSnapshot,
        pause: Pause,
        calls: dict[str, Call],
        store: PauseStore,
    ) -> Command[Any] | None:
        """The command that resumes the thread from `pause`, or None when the thread no
        longer waits on its calls (another process resumed it): the pause is dropped."""
        paused = self._paused(snapshot)
        if paused is None or tuple(paused[1]) != pause.calls:
            store.remove(pause)
            return None
        interrupt_id, held = paused
        return _resumed(interrupt_id, [calls[h.tool_call_id] for h in held])

    def _moved_on(self, outcome: Any, pause: Pause, store: PauseStore) -> Any:
        # The next pause is saved before this one goes: a crash between them leaves this one
        # to resume again, which finds the thread moved on and drops it.
        store.remove(pause)
        return outcome


def _resumed(interrupt_id: str, calls: Sequence[Call]) -> Command[Any]:
    """The command answering the interrupt with countersign's decisions, in its order."""
    return Command(resume={interrupt_id: {"decisions": [decision_for(c) for c in calls]}})


def _unseen(held: HeldCall) -> Call:
    """A held call known by its ids only, for `wait` to look at."""
    return Call(run_id=held.run_id, call_id=held.call_id, status=Status.WORKING)


def _answer(request: ToolCallRequest, call: Call) -> ToolMessage | None:
    """What the model gets in place of running the tool, or None when the tool runs here
    (a call released to the agent)."""
    if not call.outcome_reached:
        raise StillPending(call)
    stopped = refusal(call)
    if stopped is not None:
        return _message(request, stopped, "error")
    if call.status is Status.FAILED:
        return _message(request, failure(call), "error")
    if call.executes is Executes.COUNTERSIGN:
        result = call.result
        content = result.content if result else ""
        return _message(request, content, "error" if result and result.is_error else "success")
    return None


def _with_input(request: ToolCallRequest, call: Call) -> ToolCallRequest:
    """The request with countersign's input (the reviewer's, after an edit)."""
    return request.override(tool_call={**request.tool_call, "args": call.input})


def _recorded(result: ToolMessage | Command[Any]) -> Any:
    """What the execution record keeps of the tool's answer; an error message raises, so
    that the call is recorded as failed."""
    if not isinstance(result, ToolMessage):
        return None  # a Command updates the graph: it had its effect, with nothing to show
    if result.status == "error":
        raise ToolError(result)
    return result.content


def _replayed(request: ToolCallRequest, done: AlreadyExecuted) -> ToolMessage:
    """What another attempt recorded, for a call it ran already."""
    if done.error is not None:
        return _message(request, f"The call failed: {done.error}", "error")
    return _message(request, _text(done.result), "success")


def _message(
    request: ToolCallRequest, content: str, status: Literal["success", "error"]
) -> ToolMessage:
    tool_call = request.tool_call
    return ToolMessage(
        content=content,
        name=tool_call["name"],
        tool_call_id=_tool_call_id(tool_call),
        status=status,
    )


def _text(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content)


def _latest_ai(messages: Sequence[AnyMessage]) -> AIMessage | None:
    return next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)


def _task(messages: Sequence[AnyMessage]) -> str | None:
    """What the agent was asked, shown to reviewers: the latest human message."""
    asked = next((m for m in reversed(messages) if isinstance(m, HumanMessage)), None)
    return str(asked.text) if asked is not None else None


def _tool_call_id(tool_call: Any) -> str:
    tool_call_id = tool_call.get("id")
    if not tool_call_id:
        raise ValueError(f"the call of {tool_call['name']} has no id to ask countersign with")
    return str(tool_call_id)


def _recorded_call(state: Any, tool_call_id: str | None) -> dict[str, Any] | None:
    recorded = (state.get(STATE_KEY) or {}) if isinstance(state, dict) else {}
    return cast("dict[str, Any] | None", recorded.get(tool_call_id))


def _ids(request: ToolCallRequest) -> tuple[str, str]:
    recorded = _recorded_call(request.state, request.tool_call.get("id"))
    if recorded is None:
        raise RuntimeError(
            f"countersign was not asked about this call of {request.tool_call['name']}: "
            "add the middleware with Countersign.middleware()"
        )
    return recorded["run_id"], recorded["call_id"]


def _held_calls(values: Any) -> list[tuple[ToolCall, HeldCall]]:
    """The calls of the latest model turn countersign held, in the turn's order."""
    message = _latest_ai(values.get("messages", []))
    recorded: dict[str, dict[str, Any]] = values.get(STATE_KEY) or {}
    held: list[tuple[ToolCall, HeldCall]] = []
    for tool_call in message.tool_calls if message else []:
        one = recorded.get(tool_call.get("id") or "")
        if one is not None and one["held"]:
            ids = HeldCall(_tool_call_id(tool_call), one["run_id"], one["call_id"])
            held.append((tool_call, ids))
    return held


def _thread_id(config: RunnableConfig) -> str:
    thread_id = (config.get("configurable") or {}).get("thread_id")
    if thread_id is None:
        raise ValueError("a countersigned graph runs on a thread: give config a thread_id")
    return str(thread_id)


def _thread(thread_id: str, config: RunnableConfig | None) -> RunnableConfig:
    """`config` (or none) on the thread `thread_id`."""
    thread = RunnableConfig(**(config or {}))
    thread["configurable"] = {**thread.get("configurable", {}), "thread_id": thread_id}
    return thread
