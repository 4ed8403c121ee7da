//! Countersignature receipts as the gateway issues them (the format and the tool's check are
//! `countersign-receipt`'s). A receipt is signed before the decision script runs and stored by
//! it with the decision, in the same step, so a refused decision leaves none; the keys tools
//! check receipts with are served at `GET /.well-known/jwks.json`.

use crate::config::{Config, ReceiptsConfig};
use anyhow::Context;
use countersign_model::agent::ToolDef;
use countersign_model::run::{Action, HeldCall, Run};
use countersign_receipt::{Claims, KeySet, Signer, StageClaim, WindowClaim, input_digest};
use serde_json::Value;

/// The signing key, if configured, and the keys published for verification.
pub(crate) struct Receipts {
    signer: Option<Signer>,
    /// The published JWK Set, serialized once: it changes only with the configuration.
    published: String,
    /// The same keys, to read the receipts decisions keep.
    keys: KeySet,
    issuer: String,
    ttl_secs: i64,
}

/// A receipt just signed, with what the audit entry names it by.
pub(crate) struct Issued {
    pub(crate) token: String,
    pub(crate) jti: String,
    pub(crate) kid: String,
}

/// Who a receipt says decided: everyone whose approval the decision needed, and the standing
/// grant they decided it under, if any.
pub(crate) struct DecidedBy<'a> {
    pub(crate) names: Vec<String>,
    pub(crate) grant: Option<&'a str>,
}

impl Receipts {
    pub(crate) fn load(config: &Config) -> anyhow::Result<Self> {
        let ReceiptsConfig {
            key_file,
            kid,
            retired_keys_file,
            issuer,
            ttl_secs,
        } = &config.receipts;
        let signer = key_file
            .as_ref()
            .map(|path| {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading receipts.key_file {}", path.display()))?;
                Signer::from_secret(&text, kid.as_deref())
                    .with_context(|| format!("receipts.key_file {}", path.display()))
            })
            .transpose()?;
        let mut published = match retired_keys_file {
            Some(path) => {
                let text = std::fs::read_to_string(path).with_context(|| {
                    format!("reading receipts.retired_keys_file {}", path.display())
                })?;
                serde_json::from_str::<KeySet>(&text).with_context(|| {
                    format!(
                        "receipts.retired_keys_file {} is not a JWK Set of Ed25519 keys",
                        path.display()
                    )
                })?
            }
            None => KeySet::default(),
        };
        if let Some(signer) = &signer {
            published.keys.retain(|k| k.kid != signer.public().kid);
            published.keys.insert(0, signer.public().clone());
        } else {
            tracing::warn!(
                "receipts.key_file is not set: approved calls carry no receipt, and tools that verify receipts will refuse them"
            );
        }
        let issuer = issuer
            .clone()
            .or_else(|| config.public_base_url().map(str::to_string))
            .unwrap_or_else(|| "countersign".into());
        Ok(Self {
            signer,
            published: serde_json::to_string(&published)?,
            keys: published,
            issuer,
            ttl_secs: i64::try_from(*ttl_secs).context("receipts.ttl_secs is too large")?,
        })
    }

    /// The public keys as a JWK Set: the signing key first, then the retired ones still
    /// accepted.
    pub(crate) fn published(&self) -> &str {
        &self.published
    }

    /// The `jti` of `receipt`, a receipt a decision keeps, if one of the published keys
    /// signed it (whatever its age: the call it let run may be long done).
    pub(crate) fn jti(&self, receipt: &str) -> Option<String> {
        countersign_receipt::signed_by(receipt, &self.keys)
            .map(|claims| claims.jti)
            .ok()
    }

    /// Whether approved calls get receipts (a signing key is configured).
    pub(crate) fn signs(&self) -> bool {
        self.signer.is_some()
    }

    /// The receipt of `call` decided `action` with `input` (the edited input after an edit)
    /// by `decided_by`, or None without a signing key.
    pub(crate) fn issue(
        &self,
        run: &Run,
        call: &HeldCall,
        tool: Option<&ToolDef>,
        action: Action,
        input: &Value,
        decided_by: DecidedBy<'_>,
    ) -> Option<Issued> {
        let signer = self.signer.as_ref()?;
        let iat = countersign_model::now_ms() / 1000;
        // The tool as the service that runs it knows it (an MCP tool exposed under its
        // server's prefix is called by its own name), which is what it checks.
        let called = tool.map_or(call.tool.as_str(), ToolDef::called);
        let claims = Claims {
            iss: self.issuer.clone(),
            aud: tool
                .and_then(|t| t.audience.clone())
                .unwrap_or_else(|| called.to_string()),
            iat,
            exp: iat + self.ttl_secs,
            jti: format!("rct_{}", uuid::Uuid::new_v4().simple()),
            run_id: run.run_id.to_string(),
            // The turn the call is held in, which the worker's `Idempotency-Key` names.
            turn: run.turns,
            call_id: call.call_id.clone(),
            tool: called.to_string(),
            input_digest: input_digest(input),
            action: action.as_str().into(),
            decided_by: decided_by.names,
            policy_version: call.policy_version.clone(),
            grant: decided_by.grant.map(str::to_string),
            risk: call.risk.map(|r| r.as_str().to_string()),
            stages: call.stage.as_ref().map_or_else(Vec::new, |stage| {
                stage
                    .approved
                    .iter()
                    .map(|a| StageClaim {
                        stage: a.number,
                        decided_by: a.decided_by.clone(),
                    })
                    .collect()
            }),
            windows: call
                .windows
                .iter()
                .map(|w| WindowClaim {
                    name: w.name.clone(),
                    key: w.key.clone(),
                    over: w.over.clone(),
                    before: w.before,
                    amount: w.amount,
                })
                .collect(),
        };
        Some(Issued {
            token: signer.sign(&claims),
            jti: claims.jti,
            kid: signer.public().kid.clone(),
        })
    }
}
