"""What the framework adapters' tests share: the tools on the framework's side, which count
what they run; a person deciding a call once it is held; the receipt a decided call carries,
checked as a tool would; and an agent whose held calls expire within seconds."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from countersign import Call, Client, NotFound, PendingCall, Status
from countersign.receipts import Checked, MemoryJtis, Verifier

from .conftest import Gateway
from .support import WITHIN_SECS

T = TypeVar("T")

#: An agent of the runner's folder whose `send_email` calls expire two seconds after they
#: are held; `note_customer` needs nobody, and says when the agent is loaded.
BRIEF_AGENT = "desk-brief"
BRIEF_AGENT_FILE = """\
name = "desk-brief"

[model]
provider = "external"

[[tools]]
name = "send_email"
input_schema = { type = "object", properties = { to = { type = "string" }, body = { type = "string" } }, required = ["to", "body"] }
[tools.approval]
reason = "Email leaves the company"
timeout = "2s"

[[tools]]
name = "note_customer"
input_schema = { type = "object", properties = { customer = { type = "string" }, note = { type = "string" } }, required = ["customer", "note"] }
approval = "never"
"""


class Desk:
    """The desk's tools as the framework runs them: each records what it ran with."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, dict[str, Any]]] = []

    def issue_refund(self, order_id: str, amount: float) -> str:
        """Refund an order (countersign's worker runs this one: it must never run here)."""
        self.ran.append(("issue_refund", {"order_id": order_id, "amount": amount}))
        return "refunded by the agent"

    def send_email(self, to: str, body: str) -> dict[str, str]:
        """Send an email to a customer."""
        self.ran.append(("send_email", {"to": to, "body": body}))
        return {"message_id": f"m-{len(self.ran)}"}

    def note_customer(self, customer: str, note: str) -> str:
        """Note something about a customer."""
        self.ran.append(("note_customer", {"customer": customer, "note": note}))
        return "noted"

    def runs_of(self, tool: str) -> list[dict[str, Any]]:
        return [input for name, input in self.ran if name == tool]


def until(look: Callable[[], T | None], within: float = WITHIN_SECS) -> T:
    """What `look` finds, once it finds something."""
    deadline = time.monotonic() + within
    while True:
        found = look()
        if found is not None:
            return found
        assert time.monotonic() < deadline, f"nothing found in {within}s"
        time.sleep(0.05)


def held(client: Client, run_id: str, call_id: str) -> Call:
    """The call once it waits for a person."""

    def look() -> Call | None:
        call = client.get_call(run_id, call_id, wait_secs=0)
        assert call.status in (Status.WORKING, Status.PENDING), call
        return call if call.status is Status.PENDING else None

    return until(look)


def waiting_for_person(reviewer: Client, marker: str) -> PendingCall:
    """The call held for a person whose input holds `marker` (each test's own), once it is:
    for a call whose ids the test cannot know while its framework waits for it."""

    def look() -> PendingCall | None:
        cursor = None
        while True:
            page = reviewer.pending(limit=500, cursor=cursor)
            for call in page.approvals:
                if marker in json.dumps(call.input):
                    return call
            if page.next_cursor is None:
                return None
            cursor = page.next_cursor

    return until(look)


def receipt_checked(gateway: Gateway, call: Call) -> Checked:
    """The call's receipt, checked as its tool would check it: signed by the gateway's key,
    for this call, and for exactly the input it ran with."""
    assert call.tool is not None
    verifier = Verifier(gateway.jwks_url, call.tool, gateway.url, MemoryJtis())
    headers = call.receipt_headers()
    return verifier.check(
        headers["Countersign-Receipt"],
        tool=call.tool,
        idempotency_key=headers["Idempotency-Key"],
        body=json.dumps(call.input).encode(),
    )


def brief_agent(gateway: Gateway) -> str:
    """`desk-brief`, written into the runner's agents folder (the runner reloads it within a
    second), once the gateway and the worker both have it: a call of it is let through."""
    written = gateway.log.parent / "agents" / f"{BRIEF_AGENT}.toml"
    if not written.exists():
        written.write_text(BRIEF_AGENT_FILE)

    def loaded() -> bool | None:
        with gateway.client() as client:
            try:
                call = client.ask(
                    BRIEF_AGENT,
                    "note_customer",
                    {"customer": "probe", "note": "is the agent loaded?"},
                    idempotency_key=f"probe-{uuid.uuid4()}",
                    wait_secs=5,
                )
            except NotFound:
                return None
        return True if call.status is Status.ALLOWED else None

    until(loaded)
    return BRIEF_AGENT
