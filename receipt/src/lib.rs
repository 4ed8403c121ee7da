//! Countersignature receipts. When a person's decision approves a call, the gateway signs a
//! receipt for it: a JWS in compact form (a JWT) with `alg: EdDSA` (Ed25519) and a `kid`,
//! whose claims name the issuer, the tool it is for (`aud`), the run, turn and call, the digest of
//! the exact input the tool will receive, the action, who decided and the policy version. The
//! call carries it to the tool, which checks it ([`Verifier::check`], or the tower layer
//! [`RequireReceipt`] in front of the tool's handler) against the request it came with, so a
//! call nobody approved cannot run even if everything between the decision and the tool is
//! wrong.
//!
//! The public keys are published as a JWK Set ([`KeySet`]), retired keys included for as long
//! as receipts they signed may still arrive, so a key can be rotated without failing those;
//! a tool fetches and follows them with [`Jwks`].

mod jtis;
mod jwks;
mod keys;
mod layer;
pub mod mcp;
mod verify;

#[cfg(feature = "redis")]
pub use jtis::RedisJtis;
pub use jtis::{FileJtis, JtiStore, JtiStoreError, Seen, SeenJtis};
pub use jwks::{Jwks, JwksError, Refresh};
pub use keys::{KeySet, PublicKey, Signer};
pub use layer::{BODY_LIMIT, RECEIPT_HEADER, RequireReceipt, RequireReceiptService, refused};
pub use verify::{Checked, Refusal, Verifier, idempotency_key, signed_by};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What a receipt says. Names follow JWT (RFC 7519) where it has one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Claims {
    /// The gateway's public base URL.
    pub iss: String,
    /// The tool the call is for, as that tool names itself.
    pub aud: String,
    /// Issued at, seconds since the epoch.
    pub iat: i64,
    /// Expires at, seconds since the epoch.
    pub exp: i64,
    /// Unique per receipt: a tool runs a receipt once.
    pub jti: String,
    /// The run the call belongs to.
    pub run_id: String,
    /// The turn of the run the call was asked in: with `run_id` and `call_id`, the
    /// `Idempotency-Key` the worker sends the call with (`RUN:TURN:CALL`), and the only one
    /// the receipt is spent under.
    pub turn: u32,
    /// The call approved, its id in the run.
    pub call_id: String,
    /// The tool's name in the agent's definition.
    pub tool: String,
    /// [`input_digest`] of the input the tool receives (the edited input after an edit).
    pub input_digest: String,
    /// `approve` or `edit`.
    pub action: String,
    /// Everyone whose approval the decision needed, a quorum's all. A reviewer model that
    /// approved the call is named `model:NAME@POLICY_VERSION` ([`MODEL_PREFIX`]), a name no
    /// person may have.
    pub decided_by: Vec<String>,
    /// The tool's policy version the call was held and decided under.
    pub policy_version: String,
    /// The standing grant the call was approved under, when nobody was asked for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<String>,
    /// What the call does to the world, as its tool's policy declares it (`read_only`,
    /// `reversible`, `costly`, `destructive`), when it declares it: what the deciders were
    /// shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk: Option<String>,
    /// With approvals in stages, who approved each stage before the last (whose deciders are
    /// `decided_by`), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<StageClaim>,
    /// With a policy that reads windows, each window's total before the call and the call's
    /// share, as the deciders were shown them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<WindowClaim>,
}

/// The prefix of the name a reviewer model approves in, in `decided_by`.
pub const MODEL_PREFIX: &str = "model:";

impl Claims {
    /// Whether a reviewer model approved the call (nobody but a model is named
    /// `model:…`): what a tool that takes only people's approvals refuses
    /// ([`Verifier::people_only`]).
    pub fn approved_by_model(&self) -> bool {
        let names = self.decided_by.iter();
        names
            .chain(self.stages.iter().map(|s| &s.decided_by))
            .any(|name| name.starts_with(MODEL_PREFIX))
    }
}

/// One window a call was counted in, as its deciders were shown it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WindowClaim {
    /// The window's name in the policy.
    pub name: String,
    /// Its key for this call (empty without `by`).
    pub key: String,
    /// How far back it reaches, as the policy wrote it.
    pub over: String,
    /// Its total before the call.
    pub before: f64,
    /// What the call adds.
    pub amount: f64,
}

/// Who approved one stage of a call approved in stages.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageClaim {
    /// The stage, from 1.
    pub stage: u32,
    /// Who approved it, as the decision names them.
    pub decided_by: String,
}

/// The digest of a JSON input as anyone can recompute it: `sha256:` and the lowercase hex
/// SHA-256 of its RFC 8785 (JSON Canonicalization Scheme) form.
pub fn input_digest(input: &serde_json::Value) -> String {
    let canonical = serde_json_canonicalizer::to_vec(input).expect("JSON values serialize");
    format!("sha256:{}", hex::encode(Sha256::digest(canonical)))
}
