//! Receipts over MCP. An MCP `tools/call` has no headers of its own, so countersign carries
//! what an HTTP call sends as headers in the request's `_meta`, under the `countersign.dev/`
//! prefix (the MCP specification reserves `_meta` keys with prefixes naming MCP itself and
//! leaves others to their owners): the run and call ids, the idempotency key
//! (`RUN:TURN:CALL`, as in `Idempotency-Key`) and, for an approved call, the receipt. A tool
//! that refuses a receipt answers an error result naming the refusal in its own `_meta`.

use crate::{Checked, Refusal, Verifier};
use serde_json::{Map, Value};

/// The run the call belongs to.
pub const META_RUN_ID: &str = "countersign.dev/run_id";
/// The call's id within the run.
pub const META_CALL_ID: &str = "countersign.dev/call_id";
/// `RUN:TURN:CALL`: a tool that remembers it applies one call once.
pub const META_IDEMPOTENCY_KEY: &str = "countersign.dev/idempotency_key";
/// The countersignature receipt of the decision that approved the call.
pub const META_RECEIPT: &str = "countersign.dev/receipt";
/// In the MCP proxy's answer to a call that ran under a receipt: the receipt's `jti`, which
/// names the receipt the upstream tool received (the receipt itself, a bearer token, stays
/// with the decision).
pub const META_RECEIPT_JTI: &str = "countersign.dev/receipt_jti";
/// In a refused call's result (`isError`): the [`Refusal`] code, the MCP counterpart of an
/// HTTP tool's `WWW-Authenticate: Countersign-Receipt error="..."`.
pub const META_RECEIPT_REFUSED: &str = "countersign.dev/receipt_refused";

impl<R: crate::JtiStore> Verifier<R> {
    /// [`Verifier::check`] for an MCP `tools/call` of `tool` with these `arguments` and this
    /// `_meta`.
    pub async fn check_mcp(
        &self,
        meta: &Map<String, Value>,
        tool: &str,
        arguments: &Value,
    ) -> Result<Checked, Refusal> {
        let text = |key: &str| meta.get(key).and_then(Value::as_str);
        let body = serde_json::to_vec(arguments).expect("JSON values serialize");
        self.check(text(META_RECEIPT), tool, text(META_IDEMPOTENCY_KEY), &body)
            .await
    }
}
