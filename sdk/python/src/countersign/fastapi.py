"""Requiring a countersignature receipt in a FastAPI tool:

    from typing import Annotated
    from fastapi import Depends, FastAPI
    from countersign.fastapi import RequireReceipt
    from countersign.receipts import Checked, FileJtis, Verifier

    verifier = Verifier(JWKS_URL, "issue_refund", GATEWAY, FileJtis(PATH))
    receipt = RequireReceipt(verifier, tool="issue_refund")

    @app.post("/refunds")
    def refund(order: Order, checked: Annotated[Checked, Depends(receipt)]) -> dict: ...

The dependency reads the receipt from the `Countersign-Receipt` header, the
`Idempotency-Key` header and the raw JSON body, and checks them together. The handler runs
only for a receipt that lets the call run; when `checked.again`, it is the same request again
and should answer as it did the first time, running nothing.

A refusal is answered as the Rust `RequireReceipt` layer answers it, so the worker reads a
Python tool and a Rust one the same way: 401 with `WWW-Authenticate: Countersign-Receipt
error="<code>"` (the worker then tells the model the call failed and flags the run for a
person), or 503 when the keys or the jti store cannot be reached. The body, in FastAPI's
`detail`, says what is wrong and its code. A body over 1 MiB is answered 413.
"""

from __future__ import annotations

from fastapi import HTTPException, Request
from starlette.concurrency import run_in_threadpool

from .receipts import RECEIPT_HEADER, Checked, Refusal, Verifier

#: The largest body read, in bytes, as the Rust layer's `BODY_LIMIT`.
BODY_LIMIT = 1 << 20


class RequireReceipt:
    """A dependency that gives the `Checked` receipt of the request, or answers the refusal."""

    def __init__(self, verifier: Verifier, tool: str) -> None:
        self.verifier = verifier
        #: The tool's name in the agent file, as receipts name it.
        self.tool = tool

    async def __call__(self, request: Request) -> Checked:
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > BODY_LIMIT:
            raise _too_large()
        # Starlette keeps the body it read, so the route's own body parameter still has it.
        body = await request.body()
        if len(body) > BODY_LIMIT:
            raise _too_large()
        try:
            # The check may fetch keys and sync the jti file: off the event loop.
            return await run_in_threadpool(
                self.verifier.check,
                request.headers.get(RECEIPT_HEADER),
                tool=self.tool,
                idempotency_key=request.headers.get("idempotency-key"),
                body=body,
            )
        except Refusal as refusal:
            raise refused(refusal) from refusal


def refused(refusal: Refusal) -> HTTPException:
    """The answer to a refused receipt, for a route that calls `Verifier.check` itself."""
    headers = None
    if refusal.status == 401:
        # A 401 names the way to authenticate (RFC 9110, 15.5.2), and here why it failed.
        headers = {"WWW-Authenticate": f'Countersign-Receipt error="{refusal.code}"'}
    return HTTPException(
        refusal.status, detail={"error": str(refusal), "code": refusal.code}, headers=headers
    )


def _too_large() -> HTTPException:
    return HTTPException(
        413, detail={"error": "the request body is larger than 1 MiB", "code": "body_too_large"}
    )
