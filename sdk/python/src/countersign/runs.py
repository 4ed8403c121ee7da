"""Runs, the calls waiting for a person across runs, and the decisions sent on them, as the
API writes them (docs/api.md "Routes", "Decisions"). Fields the SDK does not model stay in
`raw`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from .instants import instant


@dataclass(frozen=True)
class RunState:
    """The answer to starting or cancelling a run: its id and where it stands."""

    run_id: str
    status: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunState:
        return cls(run_id=data["run_id"], status=data["status"])


@dataclass(frozen=True)
class Run:
    """A run as `GET /v1/runs/{run_id}` shows it. `pending` lists its held calls as the API
    writes them (digests, decisions, editable `fields`); `messages` and the rest are in
    `raw`."""

    run_id: str
    agent: str
    status: str
    requested_by: str | None
    metadata: Mapping[str, Any]
    text: str
    pending: tuple[Mapping[str, Any], ...]
    answer: str | None
    error: str | None
    failed_calls: tuple[Mapping[str, Any], ...]
    created_at: datetime | None
    updated_at: datetime | None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ended(self) -> bool:
        return self.status in ("completed", "failed", "cancelled")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Run:
        return cls(
            run_id=data["run_id"],
            agent=data.get("agent", ""),
            status=data["status"],
            requested_by=data.get("requested_by"),
            metadata=data.get("metadata") or {},
            text=data.get("text", ""),
            pending=tuple(data.get("pending") or ()),
            answer=data.get("answer"),
            error=data.get("error"),
            failed_calls=tuple(data.get("failed_calls") or ()),
            created_at=instant(data.get("created_at")),
            updated_at=instant(data.get("updated_at")),
            raw=data,
        )


@dataclass(frozen=True)
class PendingCall:
    """A call held for a person, as `GET /v1/approvals` lists it."""

    run_id: str
    call_id: str
    agent: str
    tool: str
    input: Any
    digest: str
    summary: str
    reason: str
    requested_by: str | None
    text: str
    """The agent's words in the paused turn."""
    paused_at: datetime | None
    deadline: datetime | None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PendingCall:
        return cls(
            run_id=data["run_id"],
            call_id=data["call_id"],
            agent=data.get("agent", ""),
            tool=data.get("tool", ""),
            input=data.get("input"),
            digest=data["digest"],
            summary=data.get("summary", ""),
            reason=data.get("reason", ""),
            requested_by=data.get("requested_by"),
            text=data.get("text", ""),
            paused_at=instant(data.get("paused_at")),
            deadline=instant(data.get("deadline")),
            raw=data,
        )


@dataclass(frozen=True)
class PendingPage:
    """One page of held calls, oldest first; `next_cursor` fetches the next, None at the end."""

    approvals: tuple[PendingCall, ...]
    next_cursor: str | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PendingPage:
        return cls(
            approvals=tuple(PendingCall.from_json(a) for a in data.get("approvals", ())),
            next_cursor=data.get("next_cursor"),
        )


class Decidable(Protocol):
    """Anything that names a held call and the digest a reviewer was shown: a `PendingCall`,
    or a door `Call` while it is held."""

    @property
    def run_id(self) -> str: ...

    @property
    def call_id(self) -> str: ...

    @property
    def digest(self) -> str | None: ...


def digest_of(call: Decidable) -> str:
    """The digest a decision on `call` quotes; a call that is not held has none to decide."""
    if call.digest is None:
        raise ValueError(f"call {call.call_id} of run {call.run_id} is not held: no digest")
    return call.digest


@dataclass(frozen=True)
class Approve:
    """Run the call as it was asked."""

    call_id: str
    digest: str
    note: str | None = None

    @classmethod
    def of(cls, call: Decidable, *, note: str | None = None) -> Approve:
        return cls(call.call_id, digest_of(call), note)

    def to_json(self) -> dict[str, Any]:
        return _decision(self.call_id, self.digest, "approve", note=self.note)


@dataclass(frozen=True)
class Edit:
    """Run the call with `input` instead; the agent is told what changed, with the note."""

    call_id: str
    digest: str
    input: Any
    note: str | None = None

    @classmethod
    def of(cls, call: Decidable, input: Any, *, note: str | None = None) -> Edit:
        return cls(call.call_id, digest_of(call), input, note)

    def to_json(self) -> dict[str, Any]:
        return _decision(self.call_id, self.digest, "edit", input=self.input, note=self.note)


@dataclass(frozen=True)
class Reject:
    """Do not run the call; the agent is told `reason`."""

    call_id: str
    digest: str
    reason: str

    @classmethod
    def of(cls, call: Decidable, reason: str) -> Reject:
        return cls(call.call_id, digest_of(call), reason)

    def to_json(self) -> dict[str, Any]:
        return _decision(self.call_id, self.digest, "reject", reason=self.reason)


DecisionRequest = Approve | Edit | Reject


def _decision(call_id: str, digest: str, action: str, **given: Any) -> dict[str, Any]:
    decision = {"call_id": call_id, "digest": digest, "action": action}
    decision.update({name: value for name, value in given.items() if value is not None})
    return decision


@dataclass(frozen=True)
class CallDecided:
    """What became of one decision: `recorded`, `approval_recorded` (a quorum still counts)
    or `already_recorded` (the same decision again)."""

    call_id: str
    status: str
    resumes: bool
    approvals: int | None = None
    quorum: int | None = None


@dataclass(frozen=True)
class Decided:
    """The answer to decisions on one run; `resumes` when the run's last held call is
    decided and a worker takes the run up again."""

    run_id: str
    decided_by: str
    decisions: tuple[CallDecided, ...]
    resumes: bool

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Decided:
        return cls(
            run_id=data["run_id"],
            decided_by=data["decided_by"],
            decisions=tuple(
                CallDecided(
                    call_id=d["call_id"],
                    status=d["status"],
                    resumes=bool(d.get("resumes")),
                    approvals=d.get("approvals"),
                    quorum=d.get("quorum"),
                )
                for d in data.get("decisions", ())
            ),
            resumes=bool(data.get("resumes")),
        )
