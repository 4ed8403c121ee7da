"""countersign for the OpenAI Agents SDK (`openai-agents`): countersign's policy decides every
call of a countersigned tool, through the SDK's own approvals.

`Countersign.tool(function)` makes a function tool whose `needs_approval` asks the door about
the call: a call the policy lets through runs at once; one a person holds (or decided
already) interrupts the run (the result's `interruptions`). The SDK's `RunState` is then
decided from countersign's outcomes:
`approve`, or `reject` with a `rejection_message` that the model gets in place of the
result (the reviewer's reason, or that the call expired). `run` waits for the decisions and
resumes in the same process; `start` saves the paused `RunState` under countersign's ids and
returns, and `resume` continues it, in any process, once the calls are decided.

The SDK's `RunState` cannot edit a call's arguments: `approve` takes none, and the arguments
in the state are the model's. An edit therefore takes effect inside the tool this module
makes: it runs the reviewer's input (countersign's `call.input`), never the model's, and
tells the model it did. The tool runs a call released to the agent only inside the call's
execution claim (`executing`), so a call is never run twice, whoever asks it again; a call
countersign runs itself (its tool has an endpoint) is not run here at all: the model gets
the result countersign's worker recorded.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from agents import (
    Agent,
    FunctionTool,
    RunContextWrapper,
    Runner,
    RunResult,
    RunState,
    ToolApprovalItem,
    default_tool_error_function,
)
from agents.function_schema import FuncSchema, function_schema
from agents.items import TResponseInputItem
from agents.tool_context import ToolContext

from ..async_client import AsyncClient
from ..calls import Call, Executes, Status
from ..errors import AlreadyExecuted, StillPending
from ..operations import drive_async
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

#: What the model is told before the result of a call a reviewer edited: the arguments in its
#: own history are the ones it gave, not the ones that ran.
EDITED = (
    "A person edited this call in countersign before it ran: it ran with {input}, "
    "not the arguments you gave."
)

Input = str | list[TResponseInputItem]


@dataclass
class _Run:
    """One framework run as its countersigned tools see it: the session their calls are
    asked under, the task, and the countersign call of each tool call sorted so far."""

    session: str
    task: str | None
    calls: dict[str, Call] = field(default_factory=dict)


# The SDK hands a tool the run's context, which belongs to the application; the run's
# session reaches the tools this way instead (tasks and threads the run starts copy it).
_current: ContextVar[_Run] = ContextVar("countersign_openai_agents_run")


@contextmanager
def _as_current(run: _Run) -> Iterator[_Run]:
    token = _current.set(run)
    try:
        yield run
    finally:
        _current.reset(token)


def _current_run() -> _Run:
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError(
            "a countersigned tool ran outside Countersign.run, start or resume, which give "
            "its calls their session"
        ) from None


class Countersign:
    """Countersigned tools of one countersign `external` agent (`agent`, the name in its
    agent file), asked with `client` (a key that may start runs). `timeout` bounds how long
    `run` waits for a person (None: as long as it takes)."""

    def __init__(self, client: AsyncClient, agent: str, *, timeout: float | None = None) -> None:
        self.client = client
        self.agent = agent
        self.timeout = timeout
        self._tools: set[str] = set()

    def tool(
        self,
        function: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
    ) -> FunctionTool:
        """A function tool of the SDK for `function` (sync or async; its schema and
        description read from its signature and docstring, as `function_tool` reads them),
        named as the tool in the agent file."""
        schema = function_schema(function, name_override=name, description_override=description)
        guarded = _Guarded(self, schema, function)
        self._tools.add(schema.name)
        return FunctionTool(
            name=schema.name,
            description=schema.description or "",
            params_json_schema=schema.params_json_schema,
            on_invoke_tool=guarded.invoke,
            needs_approval=guarded.needs_approval,
        )

    async def run(
        self,
        agent: Agent[Any],
        input: Input | RunState[Any],
        *,
        session: str,
        task: str | None = None,
        **runner: Any,
    ) -> RunResult:
        """`Runner.run(agent, input, **runner)`, waiting in this process for the decisions on
        every held call, until the run ends or stops on an interruption that is not
        countersign's. `session` names the conversation: the same session and tool call id
        are the same countersign call. `task` is shown to reviewers (default: `input` when
        it is text). Raises `StillPending` when `timeout` passes first."""
        run = _Run(session, _task(input, task))
        with _as_current(run):
            result = await Runner.run(agent, input, **runner)
            while held := self._held(result.interruptions):
                state = result.to_state()
                for item in held:
                    call = await self._call(run, str(item.tool_name), _id(item), item.arguments)
                    call = await self.client.wait(call, self.timeout)
                    if not call.outcome_reached:
                        raise StillPending(call)
                    run.calls[_id(item)] = call
                self._decide(state, held, run)
                result = await Runner.run(agent, state, **runner)
        return result

    async def start(
        self,
        agent: Agent[Any],
        input: Input,
        *,
        session: str,
        store: PauseStore,
        task: str | None = None,
        **runner: Any,
    ) -> RunResult | Pause:
        """`Runner.run` without waiting for a person: when a countersigned call is held, the
        run's `RunState` is saved in `store` under each held call's ids and the `Pause` is
        returned; `resume` continues it once they are decided."""
        run = _Run(session, _task(input, task))
        with _as_current(run):
            result = await Runner.run(agent, input, **runner)
        return await self._paused(result, run, store)

    async def resume(
        self,
        agent: Agent[Any],
        run_id: str,
        call_id: str,
        *,
        store: PauseStore,
        **runner: Any,
    ) -> RunResult | Pause | None:
        """Continues the run paused on countersign call `call_id` of run `run_id`, in this
        process or another (`agent` built as it was): when every call it waits on has its
        outcome, the saved `RunState` is decided and run on, and the result returned (or the
        next `Pause`); while one is still waiting, the pause is returned unchanged. None
        when nothing is paused on that call (never, or resumed already)."""
        pause = store.load(run_id, call_id)
        if pause is None:
            return None
        calls = await drive_async(looked_up(pause.calls), self.client.send)
        if not all(call.outcome_reached for call in calls.values()):
            return pause
        if pause.state is None:
            raise ValueError("the pause holds no RunState: it was not saved by this adapter")
        state = await RunState.from_string(agent, pause.state)
        run = _Run(pause.session, pause.task, calls)
        self._decide(state, self._held(state.get_interruptions()), run)
        with _as_current(run):
            result = await Runner.run(agent, state, **runner)
        outcome = await self._paused(result, run, store)
        # The next pause is saved before this one goes: a crash between them leaves this one
        # to resume again, whose calls are the same calls and are never run twice.
        store.remove(pause)
        return outcome

    def _held(self, interruptions: Iterable[ToolApprovalItem]) -> list[ToolApprovalItem]:
        """The interruptions that are countersign's to decide: its tools' calls."""
        return [item for item in interruptions if item.tool_name in self._tools]

    async def _call(self, run: _Run, tool: str, tool_call_id: str, arguments: str | None) -> Call:
        """The countersign call of a tool call: the one `needs_approval` asked (or `resume`
        looked up), or, if the SDK went on without asking, the same call asked now."""
        known = run.calls.get(tool_call_id)
        if known is not None:
            return known
        return await self._sort(run, tool, tool_call_id, json.loads(arguments or "{}"))

    async def _sort(self, run: _Run, tool: str, tool_call_id: str, input: Any) -> Call:
        """Asks the door about one tool call of `run`, until sorted, and remembers the call."""
        flow = sorted_call(
            self.agent, tool, input, session=run.session, tool_call_id=tool_call_id, task=run.task
        )
        call = await drive_async(flow, self.client.send)
        run.calls[tool_call_id] = call
        return call

    def _decide(self, state: RunState[Any], held: Iterable[ToolApprovalItem], run: _Run) -> None:
        """Applies countersign's outcome to each held item of `state`: a call a person, the
        deadline or a cancellation stopped is rejected with what the model is told; any
        other is approved, and the tool does what countersign says (runs the reviewer's
        input, gives countersign's result, or reports a failure)."""
        for item in held:
            stopped = refusal(run.calls[_id(item)])
            if stopped is None:
                state.approve(item)
            else:
                state.reject(item, rejection_message=stopped)

    async def _paused(self, result: RunResult, run: _Run, store: PauseStore) -> RunResult | Pause:
        held = self._held(result.interruptions)
        if not held:
            return result
        calls = [
            HeldCall.of(
                _id(item), await self._call(run, str(item.tool_name), _id(item), item.arguments)
            )
            for item in held
        ]
        pause = Pause(
            session=run.session,
            calls=tuple(calls),
            task=run.task,
            state=result.to_state().to_string(),
        )
        store.save(pause)
        return pause


def _id(item: ToolApprovalItem) -> str:
    call_id = item.call_id
    if call_id is None:
        raise ValueError(f"the interruption of {item.tool_name} has no call id")
    return call_id


def _task(input: Input | RunState[Any], task: str | None) -> str | None:
    if task is not None:
        return task
    return input if isinstance(input, str) else None


class _Guarded:
    """The two callables of one countersigned function tool."""

    def __init__(self, owner: Countersign, schema: FuncSchema, function: Callable[..., Any]):
        self.owner = owner
        self.schema = schema
        self.function = function

    async def needs_approval(
        self, context: RunContextWrapper[Any], arguments: dict[str, Any], tool_call_id: str
    ) -> bool:
        """Whether the run stops for this call: it does for a call a person holds or
        decided, whose decision the SDK's `approve` or `reject` then carries."""
        call = await self.owner._sort(_current_run(), self.schema.name, tool_call_id, arguments)
        return for_a_person(call)

    async def invoke(self, context: ToolContext[Any], arguments: str) -> Any:
        """What the model gets for a call the run went on with, as countersign says."""
        run = _current_run()
        call = await self.owner._call(run, self.schema.name, context.tool_call_id, arguments)
        if not call.outcome_reached:
            raise StillPending(call)
        stopped = refusal(call)
        if stopped is not None:
            return stopped
        if call.status is Status.FAILED:
            return failure(call)
        if call.executes is Executes.COUNTERSIGN:
            output: Any = call.result.content if call.result else ""
        else:
            output = await self._execute(context, call)
        if call.status is Status.EDITED:
            return f"{EDITED.format(input=json.dumps(call.input))}\n\n{_text(output)}"
        return output

    async def _execute(self, context: ToolContext[Any], call: Call) -> Any:
        """Runs the function with the call's input inside its execution claim. The
        function's own exception is reported failed and told to the model as the SDK's
        function tools tell it; another attempt's claim is answered with what it recorded,
        or raised when it never said how it ended (`ExecutionInDoubt`)."""
        raised: Exception | None = None
        try:
            async with self.owner.client.executing(call) as attempt:
                with running(attempt.call):
                    try:
                        output = await self._call_function(context, call.input)
                    except Exception as error:
                        raised = error
                        raise
                attempt.result = _recordable(output)
        except AlreadyExecuted as done:
            return done.result if done.error is None else f"The call failed: {done.error}"
        except Exception as error:
            if error is raised:
                return default_tool_error_function(context, error)
            raise
        return output

    async def _call_function(self, context: ToolContext[Any], input: Any) -> Any:
        parsed = self.schema.params_pydantic_model(**input)
        args, kwargs = self.schema.to_call_args(parsed)
        if self.schema.takes_context:
            args = [context, *args]
        if inspect.iscoroutinefunction(self.function):
            return await self.function(*args, **kwargs)
        # As the SDK runs a sync tool: in a thread, which copies the running call's context.
        return await asyncio.to_thread(self.function, *args, **kwargs)


def _recordable(output: Any) -> Any:
    """The output as the execution record keeps it: JSON as it is, anything else as text."""
    try:
        json.dumps(output)
    except (TypeError, ValueError):
        return str(output)
    return output


def _text(output: Any) -> str:
    return output if isinstance(output, str) else json.dumps(_recordable(output))
