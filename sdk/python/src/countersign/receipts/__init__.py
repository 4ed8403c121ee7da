"""Checking countersignature receipts in a tool written in Python (docs/security.md
"Checking a receipt in your tool").

    from countersign.receipts import FileJtis, Verifier

    verifier = Verifier(
        "https://approvals.example.com/.well-known/jwks.json",
        audience="issue_refund",
        issuer="https://approvals.example.com",
        jti_store=FileJtis("/var/lib/refunds/receipts-run.jsonl"),
    )
    checked = verifier.check(
        request.headers.get("Countersign-Receipt"),
        tool="issue_refund",
        idempotency_key=request.headers.get("Idempotency-Key"),
        body=raw_body,
    )

A refused receipt raises a `Refusal` whose `code` is the Rust verifier's word for it.
"""

from .digest import body_digest, has_inexact_integer, input_digest
from .jtis import FileJtis, JtiStore, JtiStoreError, MemoryJtis, Seen
from .keys import Jwks, KeysError
from .refusals import (
    BadSignature,
    Expired,
    InexactNumber,
    InputChanged,
    JtiStoreUnavailable,
    KeysUnavailable,
    Malformed,
    Missing,
    ModelApproved,
    OtherCall,
    OtherIssuer,
    OtherTool,
    Refusal,
    Reused,
    UnknownKey,
)
from .verify import LEEWAY_SECS, RECEIPT_HEADER, Checked, Claims, Verifier

__all__ = [
    "LEEWAY_SECS",
    "RECEIPT_HEADER",
    "BadSignature",
    "Checked",
    "Claims",
    "Expired",
    "FileJtis",
    "InexactNumber",
    "InputChanged",
    "JtiStore",
    "JtiStoreError",
    "JtiStoreUnavailable",
    "Jwks",
    "KeysError",
    "KeysUnavailable",
    "Malformed",
    "MemoryJtis",
    "Missing",
    "ModelApproved",
    "OtherCall",
    "OtherIssuer",
    "OtherTool",
    "Refusal",
    "Reused",
    "Seen",
    "UnknownKey",
    "Verifier",
    "body_digest",
    "has_inexact_integer",
    "input_digest",
]
