"""countersign for Pydantic AI (`pydantic-ai-slim` 2.68): countersign's policy decides every
call of a countersigned tool, through Pydantic AI's own deferred tools.

`CountersignToolset` wraps the toolset of an agent's countersigned tools. Each call of one is
asked at the door (`interrupts.sorted_call`, keyed by the run's conversation id and the
model's tool call id). A call the policy lets through runs at once; one a person holds, or
has decided, pauses the run the way Pydantic AI pauses for approval: the tool raises
`ApprovalRequired`, and the run ends with `DeferredToolRequests` whose metadata names the
countersign call. `countersign_results` turns those requests into `DeferredToolResults`
from countersign's outcomes: `ToolApproved` with the input the call may run with as
`override_args` (the reviewer's, after an edit), or `ToolDenied` with what the model is told
(the reviewer's reason, or that the call expired). The resumed run comes back to the
toolset, which looks the call up again and trusts the results for no more than which call to
look up: a tool countersign runs (it has an endpoint) is not run here, the model gets the
result countersign's worker recorded; a call released to the agent runs the wrapped tool with
countersign's input, only inside its execution claim (`executing`), so it never runs twice.

`countersign_approvals` waits for the decisions inside the run instead (a
`HandleDeferredToolCalls` capability). `start` and `resume` are the durable pattern: the
paused run's `Conversation` (Pydantic AI's own record of it) is saved in a `PauseStore`
under countersign's ids, and resumed in whichever process hears of the decision.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.capabilities import HandleDeferredToolCalls
from pydantic_ai.conversation import ConversationTypeAdapter
from pydantic_ai.exceptions import ApprovalRequired, ToolFailed, UserError
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturn,
    UserPromptPart,
)
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import (
    AgentDepsT,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    ToolApproved,
    ToolDenied,
)
from pydantic_ai.toolsets import WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool

from ..async_client import AsyncClient
from ..calls import Call, Executes
from ..errors import AlreadyExecuted
from ..operations import drive_async
from ._released import (
    countersign_error,
    countersign_result,
    edited,
    failed_elsewhere,
    run_released_async,
)
from .interrupts import HeldCall, Pause, PauseStore, for_a_person, refusal, sorted_call

#: Under which key of a deferred call's metadata the countersign call is named.
METADATA_KEY = "countersign"


@dataclass
class CountersignToolset(WrapperToolset[AgentDepsT]):
    """The wrapped toolset's tools, each call asked of countersign first as a call of the
    `external` agent `agent`'s tool of the same name, with `client` (a key that may start
    runs)."""

    client: AsyncClient
    agent: str

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[AgentDepsT],
        tool: ToolsetTool[AgentDepsT],
    ) -> Any:
        # `tool_args` are not used: what runs is what countersign says may run.
        named = _named(ctx.tool_call_metadata) if ctx.tool_call_approved else None
        if named is None:
            call = await self._sorted(name, ctx)
            # A person's decision reaches the model through the pause and its results.
            settled = not for_a_person(call)
        else:
            call = await self.client.get_call(*named, wait_secs=0)
            if call.tool != name:
                raise ToolFailed(f"countersign call {call.call_id} is a call of {call.tool}")
            settled = call.outcome_reached
        if not settled:
            raise ApprovalRequired(metadata=_metadata(call))
        return await self._answer(call, name, ctx, tool)

    async def _sorted(self, name: str, ctx: RunContext[AgentDepsT]) -> Call:
        """The call asked of the door (again: the same ask is the same call) until sorted."""
        if ctx.conversation_id is None or ctx.tool_call_id is None:
            raise UserError("a countersigned tool was called outside an agent run")
        proposed, task, message = _asked(ctx.messages, ctx.tool_call_id)
        flow = sorted_call(
            self.agent,
            name,
            # The model's arguments as it sent them (Pydantic AI checked them already), not
            # the validated ones, which add defaults the agent file's schema may not allow.
            proposed.args_as_dict(),
            session=ctx.conversation_id,
            tool_call_id=ctx.tool_call_id,
            task=task,
            message=message,
        )
        return await drive_async(flow, self.client.send)

    async def _answer(
        self, call: Call, name: str, ctx: RunContext[AgentDepsT], tool: ToolsetTool[AgentDepsT]
    ) -> Any:
        """What the model gets for a call with its outcome, as countersign says."""
        stopped = refusal(call)
        if stopped is not None:
            return ToolDenied(stopped)
        error = countersign_error(call)
        if error is not None:
            raise ToolFailed(error)
        if call.executes is Executes.COUNTERSIGN:
            output: Any = countersign_result(call)
        else:
            args = tool.args_validator.validate_python(call.input, context=ctx.validation_context)
            try:
                output = await run_released_async(
                    self.client, call, lambda: self.wrapped.call_tool(name, args, ctx, tool)
                )
            except AlreadyExecuted as done:
                raise ToolFailed(failed_elsewhere(done)) from done
        note = edited(call)
        return output if note is None else ToolReturn(return_value=output, content=note)


def _metadata(call: Call) -> dict[str, Any]:
    return {METADATA_KEY: {"run_id": call.run_id, "call_id": call.call_id}}


def _named(metadata: Any) -> tuple[str, str] | None:
    """The countersign call (run id, call id) a deferred call's metadata names, if any."""
    named = metadata.get(METADATA_KEY) if isinstance(metadata, dict) else None
    if not isinstance(named, dict):
        return None
    run_id, call_id = named.get("run_id"), named.get("call_id")
    if not isinstance(run_id, str) or not isinstance(call_id, str):
        return None
    return run_id, call_id


def _asked(messages: list[ModelMessage], tool_call_id: str) -> tuple[ToolCallPart, str | None, str]:
    """The model's tool call, the user's request before it and what the model said with it,
    read from the history: they are the same when the run is resumed, so the call is asked
    the same way again (the door refuses the same key with another ask)."""
    for index in range(len(messages) - 1, -1, -1):
        response = messages[index]
        if not isinstance(response, ModelResponse):
            continue
        for part in response.parts:
            if isinstance(part, ToolCallPart) and part.tool_call_id == tool_call_id:
                said = "".join(p.content for p in response.parts if isinstance(p, TextPart))
                return part, _request(messages[:index]), said
    raise UserError(f"tool call {tool_call_id} is not in the run's messages")


def _request(messages: list[ModelMessage]) -> str | None:
    """The latest text the user sent: what the agent was asked to do."""
    for message in reversed(messages):
        for part in reversed(message.parts):
            if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                return part.content
    return None


def paused_calls(requests: DeferredToolRequests) -> list[HeldCall]:
    """The countersign calls `requests` waits on. Approvals something else asked for are not
    countersign's, and are not listed."""
    held = []
    for part in requests.approvals:
        named = _named(requests.metadata.get(part.tool_call_id))
        if named is not None:
            held.append(HeldCall(part.tool_call_id, *named))
    return held


async def countersign_results(
    client: AsyncClient, requests: DeferredToolRequests, *, timeout: float | None = None
) -> DeferredToolResults:
    """The results of the countersign calls `requests` waits on that have their outcome
    within `timeout` seconds (None: as long as it takes; 0: as they stand now). A call still
    waiting is left out: `requests.remaining(results)` is what the run still waits on.

    A call that may run is `ToolApproved`, with the input it may run with as `override_args`;
    a rejection, an expiry or a cancellation is `ToolDenied` with what the model is told. A
    failed call is approved without override: the toolset tells the model how it failed."""
    deadline = None if timeout is None else time.monotonic() + timeout
    results = DeferredToolResults()
    for held in paused_calls(requests):
        call = await client.get_call(held.run_id, held.call_id, wait_secs=0)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        call = await client.wait(call, left)
        if not call.outcome_reached:
            continue
        stopped = refusal(call)
        if stopped is not None:
            results.approvals[held.tool_call_id] = ToolDenied(stopped)
            continue
        override = call.input if call.may_run and isinstance(call.input, dict) else None
        results.approvals[held.tool_call_id] = ToolApproved(override_args=override)
        results.metadata[held.tool_call_id] = _metadata(call)
    return results


def countersign_approvals(
    client: AsyncClient, *, timeout: float | None = None
) -> HandleDeferredToolCalls[Any]:
    """A capability that waits inside the run for the countersign calls it pauses on (at most
    `timeout` seconds; None: as long as it takes) and resumes it with their outcomes. Calls
    still waiting then end the run with `DeferredToolRequests`, as without it."""

    async def handle(
        ctx: RunContext[Any], requests: DeferredToolRequests
    ) -> DeferredToolResults | None:
        results = await countersign_results(client, requests, timeout=timeout)
        return results if results.approvals else None

    return HandleDeferredToolCalls(handler=handle)


async def start(
    agent: Agent[Any, Any], prompt: str, *, store: PauseStore, **run: Any
) -> AgentRunResult[Any] | Pause:
    """`agent.run(prompt, **run)` without waiting for a person: when it pauses on
    countersign calls, its `Conversation` is saved in `store` under each call's ids and the
    `Pause` returned; `resume` continues it once they are decided."""
    return _paused(await agent.run(prompt, **run), store)


async def resume(
    agent: Agent[Any, Any],
    client: AsyncClient,
    run_id: str,
    call_id: str,
    *,
    store: PauseStore,
    timeout: float = 0,
    **run: Any,
) -> AgentRunResult[Any] | Pause | None:
    """Continues the run paused on countersign call `call_id` of run `run_id`, in this
    process or another (`agent` built as it was): when every countersign call it waits on has
    its outcome (waiting at most `timeout` seconds: a decision just recorded takes a moment
    to release its call), it is resumed with their results, to its result or its next
    `Pause`; while one still waits, the pause is returned unchanged. None when nothing is
    paused on that call (never, or resumed already). Its deferred calls must all be
    countersign's: others are the application's to answer (`countersign_results`)."""
    pause = store.load(run_id, call_id)
    if pause is None:
        return None
    if pause.state is None:
        raise ValueError("the pause holds no Conversation: it was not saved by this adapter")
    conversation = ConversationTypeAdapter.validate_json(pause.state)
    requests = conversation.deferred_tool_requests
    if requests is None:
        raise ValueError("the saved Conversation is not paused")
    results = await countersign_results(client, requests, timeout=timeout)
    if requests.remaining(results) is not None:
        return pause
    result = await agent.run(conversation=conversation, deferred_tool_results=results, **run)
    outcome = _paused(result, store)
    # The next pause is saved before this one goes: a crash between them leaves this one to
    # resume again, whose calls are the same calls and never run twice.
    store.remove(pause)
    return outcome


def _paused(result: AgentRunResult[Any], store: PauseStore) -> AgentRunResult[Any] | Pause:
    conversation = result.conversation
    requests = conversation.deferred_tool_requests
    held = paused_calls(requests) if requests is not None else []
    if not held:
        return result
    pause = Pause(
        session=conversation.conversation_id,
        calls=tuple(held),
        state=ConversationTypeAdapter.dump_json(conversation).decode(),
    )
    store.save(pause)
    return pause
