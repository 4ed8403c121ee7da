"""A FastAPI tool that requires receipts (`countersign.fastapi.RequireReceipt`), sent
receipts the real gateway signed for calls a person approved."""

# No `from __future__ import annotations` here: FastAPI reads the route's annotations, and a
# dependency held in a local variable is only found while they are evaluated at once.

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import httpx
import pytest
from fastapi import Depends, FastAPI
from pydantic import BaseModel

from countersign import Client
from countersign.fastapi import RequireReceipt, refused
from countersign.receipts import Checked, FileJtis, Reused, Verifier

from .conftest import Gateway
from .support import approved_email


class Email(BaseModel):
    to: str
    body: str


def email_tool(gateway: Gateway, jtis: FileJtis) -> tuple[FastAPI, list[Email]]:
    """An email tool as its author would write it: it sends each approved email once, and
    answers a request that comes again as it answered it, which it can only while it holds
    that answer (not after a restart)."""
    verifier = Verifier(gateway.jwks_url, "send_email", gateway.url, jtis)
    receipt = RequireReceipt(verifier, tool="send_email")
    app = FastAPI()
    sent: list[Email] = []
    answers: dict[str, dict[str, Any]] = {}

    @app.post("/send")
    def send(email: Email, checked: Annotated[Checked, Depends(receipt)]) -> dict[str, Any]:
        key = checked.claims.idempotency_key
        if checked.again:
            if key not in answers:
                raise refused(Reused())
            return answers[key]
        sent.append(email)
        answers[key] = {"sent": len(sent), "to": email.to}
        return answers[key]

    return app, sent


def served(app: FastAPI) -> httpx.AsyncClient:
    """A client of the tool, served in this process."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tool")


@pytest.mark.asyncio
async def test_a_tool_runs_an_approved_call_once_and_refuses_what_was_not_approved(
    gateway: Gateway, client: Client, reviewer: Client, key: Callable[[], str], tmp_path: Path
) -> None:
    call = approved_email(client, reviewer, key())
    headers = {**call.receipt_headers(), "Content-Type": "application/json"}
    body = json.dumps(call.input)
    jtis = FileJtis(tmp_path / "receipts-run.jsonl")
    app, sent = email_tool(gateway, jtis)

    async with served(app) as tool:
        first = await tool.post("/send", content=body, headers=headers)
        again = await tool.post("/send", content=body, headers=headers)
        changed = await tool.post(
            "/send", content=json.dumps({**call.input, "body": "Send me $500."}), headers=headers
        )
        unsigned = await tool.post(
            "/send", content=body, headers={"Content-Type": "application/json"}
        )

    assert first.status_code == 200, first.text
    assert first.json() == {"sent": 1, "to": "ana@example.com"}
    assert (again.status_code, again.json()) == (200, first.json())
    for answer, code in ((changed, "input_changed"), (unsigned, "missing")):
        assert answer.status_code == 401
        assert answer.headers["www-authenticate"] == f'Countersign-Receipt error="{code}"'
        assert answer.json()["detail"]["code"] == code
    assert [email.body for email in sent] == [call.input["body"]]


@pytest.mark.asyncio
async def test_after_a_restart_the_same_receipt_is_refused_as_reused(
    gateway: Gateway, client: Client, reviewer: Client, key: Callable[[], str], tmp_path: Path
) -> None:
    call = approved_email(client, reviewer, key())
    headers = {**call.receipt_headers(), "Content-Type": "application/json"}
    body = json.dumps(call.input)
    path = tmp_path / "receipts-run.jsonl"
    jtis = FileJtis(path)
    before, _ = email_tool(gateway, jtis)
    async with served(before) as tool:
        assert (await tool.post("/send", content=body, headers=headers)).status_code == 200
    jtis.close()

    after, sent = email_tool(gateway, FileJtis(path))
    async with served(after) as tool:
        reused = await tool.post("/send", content=body, headers=headers)

    assert reused.status_code == 401
    assert reused.headers["www-authenticate"] == 'Countersign-Receipt error="reused"'
    assert reused.json()["detail"] == {
        "error": "the receipt was used before, by another request",
        "code": "reused",
    }
    assert sent == []
