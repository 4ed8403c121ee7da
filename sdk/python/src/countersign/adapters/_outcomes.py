"""What the framework adapters share: the idempotency key of a framework's tool call, what the
model is told about a call that will not run or that failed, and running a call released to
the agent under its execution record, so that it runs once whichever process gets to it.

Imported by the adapters only: it needs pydantic, which every adapted framework depends on.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic_core import to_jsonable_python

from ..async_client import AsyncClient
from ..calls import Call, Status
from ..client import Client
from ..errors import (
    AlreadyExecuted,
    Cancelled,
    ExecutionClaimed,
    ExecutionInDoubt,
    Expired,
    Failed,
    OutcomeError,
    Rejected,
)

log = logging.getLogger("countersign")

#: The outcomes after which a call never runs, each said to the model as the SDK says it.
_REFUSALS: dict[Status, Callable[[Call], OutcomeError]] = {
    Status.REJECTED: Rejected,
    Status.EXPIRED: Expired,
    Status.CANCELLED: Cancelled,
}


def idempotency_key(framework: str, conversation: str, tool_call_id: str) -> str:
    """The key of one tool call of one conversation, so that the same call asked again (by a
    resumed run, or another process) is the same countersign call. A model's tool call ids
    are unique within a conversation only, hence both."""
    return f"{framework}:{conversation}:{tool_call_id}"


def refusal(call: Call) -> str | None:
    """What the model is told about a call that will never run (rejected, with the reviewer's
    reason; expired; cancelled), or None for any other."""
    refused = _REFUSALS.get(call.status)
    return str(refused(call)) if refused is not None else None


def failure(call: Call) -> str | None:
    """What the model is told about a call that was let through and failed (the tool
    countersign ran answered an error or could not be reached, or its run failed), or None."""
    if call.status is Status.FAILED:
        return str(Failed(call))
    if call.result is not None and call.result.is_error:
        return call.result.content
    return None


def countersign_result(call: Call) -> str:
    """What the tool countersign ran answered, as the model would have been told."""
    if call.result is None:
        raise ValueError(f"call {call.call_id} of run {call.run_id} has no result")
    return call.result.content


def claimed_message(claimed: ExecutionClaimed) -> str:
    """What the model is told when another attempt claimed the call and no result can be
    given: it failed there, or it never said how it ended (a person must check)."""
    if isinstance(claimed, ExecutionInDoubt):
        log.warning("call in doubt, not run again: %s", claimed)
    error = claimed.error if isinstance(claimed, AlreadyExecuted) else None
    return f"{claimed}: {error}" if error else str(claimed)


def run_released(client: Client, call: Call, run: Callable[[], Any]) -> Any:
    """`run()` (the framework's tool with the input the call may run with) under the call's
    execution record: claimed before, its result reported after. When another attempt claimed
    it first, nothing runs: its recorded result is given back, or `ExecutionClaimed` raised
    (it failed, or never said how it ended: `ExecutionInDoubt`)."""
    try:
        with client.executing(call) as attempt:
            result = run()
            attempt.result = _recordable(result)
    except AlreadyExecuted as done:
        return _recorded(done)
    return result


async def run_released_async(
    client: AsyncClient, call: Call, run: Callable[[], Awaitable[Any]]
) -> Any:
    """`run_released` for asyncio."""
    try:
        async with client.executing(call) as attempt:
            result = await run()
            attempt.result = _recordable(result)
    except AlreadyExecuted as done:
        return _recorded(done)
    return result


def _recordable(result: Any) -> Any:
    """The tool's result as JSON for the execution record. Never raises: the side effect has
    happened, and must not be reported as failed because its result does not serialize."""
    return to_jsonable_python(result, fallback=repr)


def _recorded(done: AlreadyExecuted) -> Any:
    if done.error is not None:
        raise done
    return done.result
