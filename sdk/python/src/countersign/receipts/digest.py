"""The digest a receipt binds: `sha256:` and the lowercase hex SHA-256 of the RFC 8785 (JSON
Canonicalization Scheme) form of the exact JSON body the tool receives, as the gateway and
the Rust verifier compute it (receipt/src/lib.rs, `input_digest`).

RFC 8785 reads every number as an IEEE 754 double, so past +-(2^53 - 1) two integers share
one form and the digest does not tell them apart: a body that writes such an integer is
refused (`InexactNumber`), found in the body's text since a parser may already have rounded
it (docs/security.md "Numbers in digests").
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import rfc8785

from .refusals import InexactNumber, InputChanged

#: The largest integer a double, and so the digest, holds exactly.
MAX_EXACT_INTEGER = 2**53 - 1


def input_digest(value: Any) -> str:
    """The digest of a JSON value (as `json.loads` gives it)."""
    return "sha256:" + hashlib.sha256(rfc8785.dumps(value)).hexdigest()


def body_digest(body: bytes) -> str:
    """The digest of a request body, or the refusal it earns: `InputChanged` for a body that
    is not JSON (it cannot be the input anyone approved), `InexactNumber` for one writing an
    integer the digest cannot bind."""
    try:
        value = json.loads(body.decode("utf-8"), parse_constant=_not_json)
    except ValueError:  # bad UTF-8 and bad JSON alike
        raise InputChanged() from None
    if has_inexact_integer(body):
        raise InexactNumber()
    try:
        return input_digest(value)
    except ValueError:  # rfc8785's own errors are ValueErrors
        # A number JSON allows but a double does not hold (1e400), or a lone surrogate:
        # nothing the gateway could have signed.
        raise InputChanged() from None


def _not_json(constant: str) -> Any:
    """`NaN` and `Infinity`, which Python's parser takes and JSON does not."""
    raise ValueError(f"{constant} is not JSON")


def has_inexact_integer(body: bytes) -> bool:
    """Whether the JSON text `body` writes an integer (no fraction, no exponent) past
    +-(2^53 - 1). Strings are skipped, escapes included, so digits inside them never count."""
    i = 0
    in_string = False
    length = len(body)
    while i < length:
        byte = body[i]
        if in_string:
            if byte == 0x5C:  # a backslash: the next byte is escaped
                i += 1
            elif byte == 0x22:
                in_string = False
            i += 1
            continue
        if byte == 0x22:
            in_string = True
            i += 1
        elif byte == 0x2D or 0x30 <= byte <= 0x39:  # '-' or a digit starts a number
            start = i + (byte == 0x2D)
            end = start
            while end < length and 0x30 <= body[end] <= 0x39:
                end += 1
            integer = end >= length or body[end] not in b".eE"
            if integer and end - start >= 16 and int(body[start:end] or b"0") > MAX_EXACT_INTEGER:
                return True
            # A fraction or exponent that follows is read on as it comes.
            i = max(end, i + 1)
        else:
            i += 1
    return False
