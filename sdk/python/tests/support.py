"""What several tests do: ask for a call that waits for a person, and have it decided."""

from __future__ import annotations

import time

from countersign import Call, Client, Status

AGENT = "desk"
#: The MCP proxy in front of the demo service's MCP endpoint.
MCP_AGENT = "desk-mcp"
#: The MCP proxy in front of a server written with the official MCP Python SDK.
LEDGER_AGENT = "desk-ledger"
#: How long a test waits for the system to do something it does in well under a second.
WITHIN_SECS = 30.0


def until_sorted(client: Client, call: Call, within: float = WITHIN_SECS) -> Call:
    """The call once its policy has sorted it (no longer `working`): the long poll waits for
    an outcome, which a held call does not have, so this looks until it is held instead."""
    deadline = time.monotonic() + within
    while call.status is Status.WORKING:
        assert time.monotonic() < deadline, f"still working after {within}s: {call}"
        time.sleep(0.05)
        call = client.get_call(call.run_id, call.call_id, wait_secs=0)
    return call


def held_email(client: Client, key: str, body: str = "Your refund is on its way.") -> Call:
    """A `send_email` call, held for a person."""
    call = client.ask(
        AGENT,
        "send_email",
        {"to": "ana@example.com", "body": body},
        idempotency_key=key,
        message="The customer asked to be told.",
        wait_secs=0,
    )
    call = until_sorted(client, call)
    assert call.status is Status.PENDING, call
    return call


def approved_email(client: Client, reviewer: Client, key: str) -> Call:
    """A `send_email` call a person approved, released to the agent with its receipt."""
    held = held_email(client, key)
    reviewer.approve(held)
    call = client.wait(held, timeout=WITHIN_SECS)
    assert call.status is Status.APPROVED, call
    return call


def released_note(client: Client, key: str) -> Call:
    """A `note_customer` call, which nobody needs to approve: released to the agent at once."""
    call = client.ask(
        AGENT, "note_customer", {"customer": "ana", "note": "prefers email"}, idempotency_key=key
    )
    call = client.wait(call, timeout=WITHIN_SECS)
    assert call.status is Status.ALLOWED, call
    return call
