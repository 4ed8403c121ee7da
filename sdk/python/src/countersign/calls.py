"""A call asked through the door (docs/door.md "The answer"), as the door answers it.

`Call.from_json` reads the body that `POST /v1/agents/{agent}/calls`,
`GET /v1/runs/{run}/calls/{call}` and the execution reports answer alike. Fields the SDK
does not model stay in `raw`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any

from .errors import Cancelled, Expired, Failed, Rejected, StillPending
from .instants import instant


class Status(str, Enum):
    """Where a door call stands."""

    WORKING = "working"
    """Not sorted by its policy yet, or running."""
    PENDING = "pending"
    """Held for a person."""
    ALLOWED = "allowed"
    """The policy or a standing grant let it through."""
    APPROVED = "approved"
    EDITED = "edited"
    """Approved with the reviewer's input, which `Call.input` then is."""
    REJECTED = "rejected"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    FAILED = "failed"


#: The statuses that let the call run (or, for a tool countersign runs, say that it ran).
RUNS = frozenset({Status.ALLOWED, Status.APPROVED, Status.EDITED})
#: The statuses a call does not leave.
OUTCOMES = RUNS | {Status.REJECTED, Status.EXPIRED, Status.CANCELLED, Status.FAILED}


class Executes(str, Enum):
    """Who runs a call once it may run."""

    COUNTERSIGN = "countersign"
    """The tool has an endpoint: countersign's worker runs it; the answer carries its result."""
    AGENT = "agent"
    """The tool has none: the call is released to the agent, which runs it and reports."""


@dataclass(frozen=True)
class Held:
    """A call waiting for a person: what they were shown and who may decide."""

    call_id: str
    digest: str
    policy_version: str
    reason: str
    deciders: tuple[str, ...] | None
    quorum: int | None
    deadline: datetime | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Held:
        deciders = data.get("deciders")
        return cls(
            call_id=data["call_id"],
            digest=data["digest"],
            policy_version=data.get("policy_version", ""),
            reason=data.get("reason", ""),
            deciders=tuple(deciders) if deciders is not None else None,
            quorum=data.get("quorum"),
            deadline=instant(data.get("deadline")),
        )


@dataclass(frozen=True)
class Decision:
    """The decision that counts for a call."""

    call_id: str
    action: str
    """`approve`, `edit` or `reject`."""
    decided_by: str
    decided_at: datetime | None
    digest: str
    input: Any = None
    """An edit's input."""
    note: str | None = None
    reason: str | None = None
    """A rejection's."""
    expired: bool = False
    receipt: str | None = None
    """The countersignature receipt of an approval or edit, shown to the key that asked (or
    an admin) only."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Decision:
        receipt = data.get("receipt")
        return cls(
            call_id=data["call_id"],
            action=data["action"],
            decided_by=data.get("decided_by", ""),
            decided_at=instant(data.get("decided_at")),
            digest=data.get("digest", ""),
            input=data.get("input"),
            note=data.get("note"),
            reason=data.get("reason"),
            expired=bool(data.get("expired", False)),
            # A withheld receipt reads `{"withheld": true}`: not one to send.
            receipt=receipt if isinstance(receipt, str) else None,
        )


@dataclass(frozen=True)
class CallResult:
    """What the tool countersign ran answered, as the model would have been told."""

    content: str
    is_error: bool

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CallResult:
        return cls(content=data.get("content", ""), is_error=bool(data.get("is_error")))


class ExecutionStatus(str, Enum):
    """Where a call the agent runs stands in its execution record."""

    STARTED = "started"
    """Claimed by an attempt, no end reported (yet)."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True)
class Execution:
    """The execution record of a call the agent runs itself: which attempt claimed it, and
    how it ended once that attempt said."""

    status: ExecutionStatus
    attempt: str
    reported_by: str
    started_at: datetime | None
    finished_at: datetime | None = None
    result: Any = None
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.status is not ExecutionStatus.STARTED

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Execution:
        return cls(
            status=ExecutionStatus(data["status"]),
            attempt=data.get("attempt", ""),
            reported_by=data.get("reported_by", ""),
            started_at=instant(data.get("started_at")),
            finished_at=instant(data.get("finished_at")),
            result=data.get("result"),
            error=data.get("error"),
        )


@dataclass(frozen=True)
class Call:
    """A door call as the gateway last answered about it."""

    run_id: str
    call_id: str
    status: Status
    tool: str | None = None
    executes: Executes | None = None
    input: Any = None
    """The input it runs, or may run, with: the reviewer's after an edit."""
    held: Held | None = None
    decision: Decision | None = None
    result: CallResult | None = None
    error: str | None = None
    execution: Execution | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Call:
        def optional(name: str, read: Any) -> Any:
            value = data.get(name)
            return read(value) if value is not None else None

        return cls(
            run_id=data["run_id"],
            call_id=data["call_id"],
            status=Status(data["status"]),
            tool=data.get("tool"),
            executes=optional("executes", Executes),
            input=data.get("input"),
            held=optional("held", Held.from_json),
            decision=optional("decision", Decision.from_json),
            result=optional("result", CallResult.from_json),
            error=data.get("error"),
            execution=optional("execution", Execution.from_json),
            raw=data,
        )

    @property
    def outcome_reached(self) -> bool:
        """Whether the call has the outcome it keeps: waiting more changes nothing."""
        return self.status in OUTCOMES

    @property
    def may_run(self) -> bool:
        """Whether the call may run: the policy, a grant or a person let it through. For a
        tool countersign runs, it has run, and `result` says how."""
        return self.status in RUNS

    @property
    def digest(self) -> str | None:
        """The digest a decision on the held call quotes, while it is held."""
        return self.held.digest if self.held else None

    @property
    def receipt(self) -> str | None:
        """The countersignature receipt of the approval or edit that lets it run, if the key
        that looked may hold it."""
        return self.decision.receipt if self.decision else None

    def raise_for_outcome(self) -> Call:
        """This call if it may run; otherwise the exception that says why not: `Rejected`,
        `Expired`, `Cancelled`, `Failed`, or `StillPending` for a call with no outcome yet,
        so that nothing runs on a wait that ended first."""
        if self.may_run:
            return self
        if self.status is Status.REJECTED:
            raise Rejected(self)
        if self.status is Status.EXPIRED:
            raise Expired(self)
        if self.status is Status.CANCELLED:
            raise Cancelled(self)
        if self.status is Status.FAILED:
            raise Failed(self)
        raise StillPending(self)

    def receipt_headers(self) -> dict[str, str]:
        """The headers a call released to the agent carries to a tool that checks receipts
        (`countersign.receipts`, the `countersign-receipt` crate): the receipt and the
        `Idempotency-Key` it is spent under, `RUN:TURN:CALL`. Empty for a call without a
        receipt (the policy let it through, or this key may not hold it)."""
        if self.receipt is None:
            return {}
        claims = _unverified_claims(self.receipt)
        key = f"{claims['run_id']}:{claims['turn']}:{claims['call_id']}"
        return {"Countersign-Receipt": self.receipt, "Idempotency-Key": key}


def _unverified_claims(token: str) -> dict[str, Any]:
    """The claims of a receipt, read without checking its signature: only to name the call
    it is for when sending it on. The tool that receives it checks it."""
    payload = token.split(".")[1]
    padded = payload + "=" * (-len(payload) % 4)
    claims: dict[str, Any] = json.loads(base64.urlsafe_b64decode(padded))
    return claims
