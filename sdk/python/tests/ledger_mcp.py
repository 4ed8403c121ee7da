"""An upstream MCP server written with the official MCP Python SDK (FastMCP), which the
`desk-ledger` proxy agent fronts: what it answers (structured content, an image) must reach
the proxy's clients as it gave it, and its calls carry countersign's `_meta`."""

from __future__ import annotations

import base64
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypedDict

import uvicorn
from mcp.server.fastmcp import Context, FastMCP, Image
from mcp.types import ToolAnnotations

#: A 1x1 PNG, which the `chart` tool answers.
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
RECEIPT = "countersign.dev/receipt"


class Balance(TypedDict):
    customer: str
    cents: int


class WriteOff(TypedDict):
    customer: str
    cents: int
    receipt: bool
    """Whether the call came with a countersign receipt in its `_meta`."""


def ledger() -> FastMCP:
    server = FastMCP("ledger", log_level="WARNING")

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def balance(customer: str) -> Balance:
        """A customer's balance."""
        return {"customer": customer, "cents": 1250}

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def chart(customer: str) -> Image:
        """A customer's balance as a chart."""
        return Image(data=PIXEL, format="png")

    @server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True))
    def write_off(customer: str, cents: int, ctx: Context[Any, Any, Any]) -> WriteOff:
        """Writes off part of a customer's debt."""
        meta = ctx.request_context.meta
        extra = meta.model_extra if meta is not None else None
        return {"customer": customer, "cents": cents, "receipt": bool((extra or {}).get(RECEIPT))}

    return server


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def serving() -> Iterator[str]:
    """The ledger served over Streamable HTTP on a port of its own; its MCP endpoint's URL."""
    port = _free_port()
    config = uvicorn.Config(
        ledger().streamable_http_app(), host="127.0.0.1", port=port, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the ledger did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
