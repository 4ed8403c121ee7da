"""Pydantic AI's tools under countersign, through Pydantic AI's own pause for approvals.

`CountersignToolset` wraps the toolset of an agent's countersigned tools. Each call of one is
asked at the door first, keyed by the run's conversation id and the model's tool call id. A
call that gets its outcome within `wait_secs` is answered at once; any other pauses the run as
Pydantic AI pauses for approvals: the tool raises `ApprovalRequired`, and the run ends with
`DeferredToolRequests` whose metadata names the countersign call. `countersign_results` turns
those requests into `DeferredToolResults` once the calls are decided (`ToolApproved` with the
input the call may run with as `override_args`, `ToolDenied` with the rejection's reason or
the expiry), and the run resumed with them comes back to the toolset, which looks the call up
again and never trusts the results for more than which call to look up:

- a tool countersign runs (it has an endpoint) is not run again here: the model gets the
  result countersign's worker got;
- a call released to the agent runs the wrapped tool with countersign's input (the
  reviewer's, after an edit) under the call's execution record, so a second process resuming
  the same run gets the recorded result instead of running it again.

`countersign_approvals` is the same, waited for inside the run (a `HandleDeferredToolCalls`
capability), for a process that may block until a person decides.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pydantic_ai.capabilities import HandleDeferredToolCalls
from pydantic_ai.exceptions import ApprovalRequired, ToolFailed, UserError
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, UserPromptPart
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
from ..errors import ExecutionClaimed
from ._outcomes import (
    claimed_message,
    countersign_result,
    failure,
    idempotency_key,
    refusal,
    run_released_async,
)

FRAMEWORK = "pydantic-ai"
#: Under which key of a deferred call's metadata the countersign call is named.
METADATA_KEY = "countersign"


@dataclass(frozen=True)
class CallRef:
    """Which countersign call a paused tool call is: what to store a paused run's state
    under, and to look the call up by."""

    run_id: str
    call_id: str

    @classmethod
    def of(cls, call: Call) -> CallRef:
        return cls(call.run_id, call.call_id)

    def metadata(self) -> dict[str, Any]:
        return {METADATA_KEY: {"run_id": self.run_id, "call_id": self.call_id}}

    @classmethod
    def from_metadata(cls, metadata: Any) -> CallRef | None:
        named = metadata.get(METADATA_KEY) if isinstance(metadata, dict) else None
        if not isinstance(named, dict):
            return None
        run_id, call_id = named.get("run_id"), named.get("call_id")
        if not isinstance(run_id, str) or not isinstance(call_id, str):
            return None
        return cls(run_id, call_id)


@dataclass
class CountersignToolset(WrapperToolset[AgentDepsT]):
    """The wrapped toolset's tools, each call asked of countersign first as a call of `agent`'s
    tool of the same name (an `external` agent, docs/door.md), with `client`'s key.

    `wait_secs` is how long an ask waits for the call's outcome before the run pauses for it:
    a call the policy lets through is answered within it, and a held call costs it once.
    `requested_by` is whom the calls are for, when the key speaks for others.
    """

    client: AsyncClient
    agent: str
    wait_secs: int = 2
    requested_by: str | None = None

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[AgentDepsT],
        tool: ToolsetTool[AgentDepsT],
    ) -> Any:
        # `tool_args` are ignored: what runs is what countersign says may run.
        call = await self._call(name, ctx)
        if not call.outcome_reached:
            raise ApprovalRequired(metadata=CallRef.of(call).metadata())
        refused = refusal(call)
        if refused is not None:
            return ToolDenied(refused)
        failed = failure(call)
        if failed is not None:
            raise ToolFailed(failed)
        if call.executes is Executes.COUNTERSIGN:
            return countersign_result(call)
        args = tool.args_validator.validate_python(call.input, context=ctx.validation_context)
        try:
            return await run_released_async(
                self.client, call, lambda: self.wrapped.call_tool(name, args, ctx, tool)
            )
        except ExecutionClaimed as claimed:
            raise ToolFailed(claimed_message(claimed)) from claimed

    async def _call(self, name: str, ctx: RunContext[AgentDepsT]) -> Call:
        """The countersign call of this tool call: looked up by the reference an approval
        carries, else asked (again: the same ask is the same call)."""
        ref = CallRef.from_metadata(ctx.tool_call_metadata) if ctx.tool_call_approved else None
        if ref is not None:
            call = await self.client.get_call(ref.run_id, ref.call_id, wait_secs=0)
            if call.tool != name:
                raise ToolFailed(f"countersign call {ref.call_id} is a call of {call.tool}")
            return call
        if ctx.conversation_id is None or ctx.tool_call_id is None:
            raise UserError("a countersigned tool is called outside an agent run")
        proposed, task, message = _asked(ctx.messages, ctx.tool_call_id)
        # The model's arguments as it sent them (Pydantic AI checked them already), not the
        # validated ones, which add the defaults the agent file's schema may not allow.
        return await self.client.ask(
            self.agent,
            name,
            proposed.args_as_dict(),
            idempotency_key=idempotency_key(FRAMEWORK, ctx.conversation_id, ctx.tool_call_id),
            task=task,
            message=message,
            session=ctx.conversation_id,
            requested_by=self.requested_by,
            wait_secs=self.wait_secs,
        )


def _asked(messages: list[ModelMessage], tool_call_id: str) -> tuple[ToolCallPart, str | None, str]:
    """The model's tool call, the user's request before it and what the model said with it,
    read from the history: it is the same when the run is resumed, so the call is asked the
    same way again (the door refuses the same key with another ask)."""
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


def paused_calls(requests: DeferredToolRequests) -> dict[str, CallRef]:
    """The countersign calls a paused run waits on, by tool call id: what to store its state
    under. Approvals asked for by anything else are not countersign's, and not listed."""
    paused = {}
    for part in requests.approvals:
        ref = CallRef.from_metadata(requests.metadata.get(part.tool_call_id))
        if ref is not None:
            paused[part.tool_call_id] = ref
    return paused


async def countersign_results(
    client: AsyncClient, requests: DeferredToolRequests, *, timeout: float | None = None
) -> DeferredToolResults:
    """The results of the countersign calls `requests` waits on that have their outcome
    within `timeout` seconds (None: as long as it takes; 0: as they stand now). A call still
    waiting is left out: `requests.remaining(results)` is what the run would still wait on.

    A call that may run is `ToolApproved`, with the input it may run with (the reviewer's,
    after an edit) as `override_args`; a rejection, an expiry or a cancellation is
    `ToolDenied` with what the model is told. A failed call is approved too, so that the
    toolset tells the model how it failed."""
    deadline = None if timeout is None else time.monotonic() + timeout
    results = DeferredToolResults()
    for tool_call_id, ref in paused_calls(requests).items():
        call = await client.get_call(ref.run_id, ref.call_id, wait_secs=0)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        call = await client.wait(call, left)
        if not call.outcome_reached:
            continue
        refused = refusal(call)
        if refused is not None:
            results.approvals[tool_call_id] = ToolDenied(refused)
            continue
        override = call.input if call.may_run and isinstance(call.input, dict) else None
        results.approvals[tool_call_id] = ToolApproved(override_args=override)
        results.metadata[tool_call_id] = ref.metadata()
    return results


def countersign_approvals(
    client: AsyncClient, *, timeout: float | None = None
) -> HandleDeferredToolCalls[Any]:
    """A capability that waits inside the run for the countersign calls it pauses on (at most
    `timeout` seconds, None: as long as it takes) and resumes it with their outcomes. Calls
    still waiting then end the run with `DeferredToolRequests` as usual."""

    async def handle(
        ctx: RunContext[Any], requests: DeferredToolRequests
    ) -> DeferredToolResults | None:
        results = await countersign_results(client, requests, timeout=timeout)
        return results if results.approvals else None

    return HandleDeferredToolCalls(handler=handle)
