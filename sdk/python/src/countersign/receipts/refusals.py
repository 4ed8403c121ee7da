"""Why a receipt does not let its call run, one exception per reason, each with the `code`
the Rust verifier (receipt/src/verify.rs, `Refusal::code`) gives it, so a tool in Python and
one in Rust refuse alike and the worker reads both the same way."""

from __future__ import annotations

from typing import ClassVar


class Refusal(Exception):
    """A receipt refused; nothing may run. `code` names the reason for machines, the message
    says it for people, and `status` is the HTTP status a tool answers with: 401, or 503
    when the check itself could not be made (the worker tries those again)."""

    code: ClassVar[str]
    status: ClassVar[int] = 401
    default_message: ClassVar[str]

    def __init__(self, detail: str | None = None) -> None:
        #: What exactly went wrong, where the reason has more to say (the decoder's error,
        #: the key id, why the keys or the store could not be reached).
        self.detail = detail
        super().__init__(self.describe(detail))

    @classmethod
    def describe(cls, detail: str | None) -> str:
        """What the tool answers; a detail that is for its log only is left out."""
        return cls.default_message


class Missing(Refusal):
    code = "missing"
    default_message = "the request carries no receipt"


class Malformed(Refusal):
    code = "malformed"
    default_message = "the receipt is not a JWT this tool can read"

    @classmethod
    def describe(cls, detail: str | None) -> str:
        return f"{cls.default_message}: {detail}" if detail else cls.default_message


class UnknownKey(Refusal):
    code = "unknown_key"
    default_message = "the receipt is signed with a key that is not published"

    @classmethod
    def describe(cls, detail: str | None) -> str:
        if detail is None:
            return cls.default_message
        return f"the receipt is signed with key {detail!r}, which is not published"


class BadSignature(Refusal):
    code = "bad_signature"
    default_message = "the receipt's signature does not verify"


class OtherIssuer(Refusal):
    code = "other_issuer"
    default_message = "the receipt was issued by another gateway"


class OtherTool(Refusal):
    code = "other_tool"
    default_message = "the receipt is for another tool"


class OtherCall(Refusal):
    code = "other_call"
    default_message = "the receipt is for another call than the one this request makes"


class Expired(Refusal):
    code = "expired"
    default_message = "the receipt has expired"


class InputChanged(Refusal):
    code = "input_changed"
    default_message = "the input is not the one that was approved"


class InexactNumber(Refusal):
    code = "inexact_number"
    default_message = (
        "the input holds an integer past 2^53 - 1, which the receipt's digest does not bind exactly"
    )


class ModelApproved(Refusal):
    code = "model_approved"
    default_message = (
        "the call was approved by a reviewer model, and this tool takes only people's approvals"
    )


class Reused(Refusal):
    code = "reused"
    default_message = "the receipt was used before, by another request"


class KeysUnavailable(Refusal):
    """The published keys are out of date and cannot be fetched; the message is for the
    tool's log, not for its answer."""

    code = "keys_unavailable"
    status = 503
    default_message = "the receipt's keys cannot be fetched now"


class JtiStoreUnavailable(Refusal):
    """The jti store did not answer; the message is for the tool's log."""

    code = "jti_store_unavailable"
    status = 503
    default_message = "the receipt cannot be checked for earlier use now"
