"""Error answers the real gateway does not give on demand (a proxy's page, a cap's 429), and
the refusal codes, which must stay the Rust code's words."""

from __future__ import annotations

import re

import httpx

from countersign import CountersignError, RefusalCode, Refused, TooManyRequests
from countersign.errors import error_from_response
from countersign.receipts import Refusal

from .conftest import REPOSITORY


def test_an_answer_without_the_apis_shape_is_said_in_the_statuss_words() -> None:
    page = httpx.Response(502, text="<html>Bad Gateway</html>")

    error = error_from_response(page)

    assert type(error) is CountersignError
    assert (error.status, error.code, error.message) == (
        502,
        "http_502",
        "<html>Bad Gateway</html>",
    )


def test_a_cap_says_when_to_come_back() -> None:
    capped = httpx.Response(
        429,
        headers={"Retry-After": "3"},
        json={"error": {"code": "too_many_streams", "message": "16 streams per principal"}},
    )

    error = error_from_response(capped)

    assert isinstance(error, TooManyRequests)
    assert (error.code, error.retry_after) == ("too_many_streams", 3.0)


def test_a_refusal_this_sdk_does_not_know_yet_keeps_its_word() -> None:
    refused = httpx.Response(
        409, json={"error": {"code": "x", "message": "m", "refusal": "a_new_reason"}}
    )
    known = httpx.Response(
        410, json={"error": {"code": "expired", "message": "m", "refusal": "past_deadline"}}
    )

    assert error_from_response(refused).refusal == "a_new_reason"
    error = error_from_response(known)
    assert isinstance(error, Refused) and error.refusal is RefusalCode.PAST_DEADLINE
    assert error.status == 410


def rust_codes(path: str, function: str) -> set[str]:
    """The codes a Rust `match` in `function` of `path` (in this repository) returns."""
    source = (REPOSITORY / path).read_text()
    body = source[source.index(f"fn {function}(") :]
    body = body[: body.index("\n    }\n")]
    return set(re.findall(r'=> "([a-z_]+)"', body))


def test_the_refusal_codes_are_the_decision_scripts() -> None:
    codes = rust_codes("model/src/refusal.rs", "as_str")

    assert {code.value for code in RefusalCode} == codes
    assert len(codes) == 19


def test_the_receipt_refusals_are_the_rust_verifiers() -> None:
    codes = rust_codes("receipt/src/verify.rs", "code")

    assert {refusal.code for refusal in Refusal.__subclasses__()} == codes
