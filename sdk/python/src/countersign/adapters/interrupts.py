"""What the adapters for frameworks that pause a run for approval share (the OpenAI Agents
SDK's interruptions, LangGraph's interrupts): asking the door about one tool call of the
framework, what the model is told of a call that did not run, the call a tool is running
under, and the record of a run paused on countersign's calls, which another process resumes.

A framework's tool call is one door call: its idempotency key is the framework's session
(the run's or thread's id) and the tool call's id, so the same tool call asked again, by a
resumed run or another process, is the same countersign call, never asked of a person twice.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

from .. import operations
from ..calls import Call, Status
from ..operations import Flow

#: How long one look at a call being sorted may be held: the gateway answers at once when the
#: policy lets the call through (with its result, for a tool countersign runs), and after
#: this long with a call held for a person, which has no outcome to wait for.
SORT_SECS = 1


def idempotency_key(session: str, tool_call_id: str) -> str:
    """The door's idempotency key for one tool call of one framework run or thread."""
    return f"{session}:{tool_call_id}"


def sorted_call(
    agent: str,
    tool: str,
    input: Any,
    *,
    session: str,
    tool_call_id: str,
    task: str | None = None,
    message: str = "",
) -> Flow[Call]:
    """Asks the door about one tool call and looks until its policy has sorted it: the call
    has its outcome (the policy let it through, or it was decided before), or it is held for
    a person (`pending`). The same arguments again are the same call."""
    call: Call = yield operations.ask(
        agent,
        tool,
        input,
        idempotency_key=idempotency_key(session, tool_call_id),
        task=task,
        message=message,
        evidence=(),
        session=session,
        requested_by=None,
        wait_secs=SORT_SECS,
    )
    while call.status is Status.WORKING:
        call = yield operations.get_call(call.run_id, call.call_id, SORT_SECS)
    return call


def for_a_person(call: Call) -> bool:
    """Whether a person holds the call, or decided it: such a call goes through the
    framework's own pause, so that their decision reaches the model as the framework tells
    it (a call decided while it was being sorted, or decided before and asked again, too).
    A call the policy let through runs at once."""
    return call.status is Status.PENDING or call.decision is not None


def refusal(call: Call) -> str | None:
    """What the model is told of a call a person, the deadline or a cancellation stopped, in
    place of the tool's result; None for any other call."""
    if call.status is Status.REJECTED:
        who = call.decision.decided_by if call.decision else "a reviewer"
        reason = call.decision.reason if call.decision else None
        said = f", saying: {reason}" if reason else "."
        return f"The call was not run: {who} rejected it in countersign{said}"
    if call.status is Status.EXPIRED:
        return (
            "The call was not run: nobody decided on it in countersign before its deadline, "
            "so it expired."
        )
    if call.status is Status.CANCELLED:
        return "The call was not run: its countersign run was cancelled."
    return None


def failure(call: Call) -> str:
    """What the model is told of a `failed` call: the tool countersign ran failed (with what
    it answered), its outcome was lost in a crash, or its run failed."""
    said = f": {call.result.content}" if call.result and call.result.content else ""
    return f"The call failed ({call.error or 'countersign gave no reason'}){said}"


_running: ContextVar[Call | None] = ContextVar("countersign_running_call", default=None)


def running_call() -> Call | None:
    """The countersign call the tool being run now was released under, as claimed: its
    `input`, and its `receipt` (`receipt_headers()`) for a backend that checks receipts.
    None outside a tool an adapter runs."""
    return _running.get()


@contextmanager
def running(call: Call) -> Iterator[Call]:
    """Makes `call` the running call for the tool run inside the block (threads and tasks
    started inside it see it too: they copy the context)."""
    token = _running.set(call)
    try:
        yield call
    finally:
        _running.reset(token)


@dataclass(frozen=True)
class HeldCall:
    """A framework tool call a paused run waits on, and the countersign call it is."""

    tool_call_id: str
    run_id: str
    call_id: str

    @classmethod
    def of(cls, tool_call_id: str, call: Call) -> HeldCall:
        return cls(tool_call_id, call.run_id, call.call_id)


def looked_up(held: Sequence[HeldCall]) -> Flow[dict[str, Call]]:
    """Each held call as it stands now, by tool call id, looked at without waiting."""
    calls: dict[str, Call] = {}
    for one in held:
        calls[one.tool_call_id] = yield operations.get_call(one.run_id, one.call_id, 0)
    return calls


@dataclass(frozen=True)
class Pause:
    """A framework run paused on countersign calls, as another process needs it to resume:
    the framework's session (the run's or thread's id), the calls it waits on, the task they
    were asked under, and the framework's state when no checkpointer keeps it (the Agents
    SDK's `RunState`, serialized)."""

    session: str
    calls: tuple[HeldCall, ...]
    task: str | None = None
    state: str | None = None

    def to_json(self) -> str:
        return json.dumps(
            {
                "session": self.session,
                "task": self.task,
                "state": self.state,
                "calls": [
                    {"tool_call_id": c.tool_call_id, "run_id": c.run_id, "call_id": c.call_id}
                    for c in self.calls
                ],
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Pause:
        data: Mapping[str, Any] = json.loads(text)
        return cls(
            session=data["session"],
            calls=tuple(
                HeldCall(c["tool_call_id"], c["run_id"], c["call_id"]) for c in data["calls"]
            ),
            task=data.get("task"),
            state=data.get("state"),
        )


class PauseStore(Protocol):
    """Where paused runs are kept until their calls are decided, found by any of their
    countersign calls (a decision names its run and call: a webhook, the run's events)."""

    def save(self, pause: Pause) -> None: ...

    def load(self, run_id: str, call_id: str) -> Pause | None:
        """The pause waiting on this call; None when there is none (never paused, or resumed
        already)."""
        ...

    def remove(self, pause: Pause) -> None: ...


class FilePauses:
    """A `PauseStore` in a folder: the pause is written whole under each of its calls (a
    file per call), each write synced and put in place at once, so that a crash leaves the
    old file or the new one, never half of one."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def _path(self, run_id: str, call_id: str) -> Path:
        # Ids are not trusted to be file names; "+" is escaped inside each, so it separates.
        return self.directory / f"{quote(run_id, safe='')}+{quote(call_id, safe='')}.json"

    def save(self, pause: Pause) -> None:
        text = pause.to_json()
        for call in pause.calls:
            path = self._path(call.run_id, call.call_id)
            descriptor, temporary = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            try:
                with os.fdopen(descriptor, "w", encoding="utf-8") as file:
                    file.write(text)
                    file.flush()
                    os.fsync(file.fileno())
                os.replace(temporary, path)
            except BaseException:
                Path(temporary).unlink(missing_ok=True)
                raise

    def load(self, run_id: str, call_id: str) -> Pause | None:
        try:
            text = self._path(run_id, call_id).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        return Pause.from_json(text)

    def remove(self, pause: Pause) -> None:
        for call in pause.calls:
            self._path(call.run_id, call.call_id).unlink(missing_ok=True)
