//! Signing keys and the published key set. A signing key is an Ed25519 key in PKCS#8 (as a
//! PEM file, the form operators handle); its public half is published as an OKP JWK
//! (RFC 8037) under its `kid`.

use crate::Claims;
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::{Deserialize, Serialize};

/// Why a key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("not an Ed25519 private key in PKCS#8 PEM: {0}")]
    Pem(String),
    #[error("a kid must be 1 to 64 ASCII letters, digits, '-', '_' or '.'")]
    Kid,
}

/// The gateway's key: it signs receipts.
pub struct Signer {
    kid: String,
    key: EncodingKey,
    public: PublicKey,
}

impl Signer {
    /// A new key and its PKCS#8 PEM, to be kept as a secret (the local runner writes it).
    pub fn generate(kid: &str) -> Result<(Self, String), KeyError> {
        let der = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new())
            .map_err(|e| KeyError::Pem(e.to_string()))?;
        let pem = pem(der.as_ref());
        Ok((Self::from_pem(kid, &pem)?, pem))
    }

    /// The key of a PKCS#8 PEM file.
    pub fn from_pem(kid: &str, pem: &str) -> Result<Self, KeyError> {
        if !(1..=64).contains(&kid.len())
            || !kid
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(KeyError::Kid);
        }
        let der = der(pem)?;
        let pair = Ed25519KeyPair::from_pkcs8(&der).map_err(|e| KeyError::Pem(e.to_string()))?;
        Ok(Self {
            kid: kid.to_string(),
            key: EncodingKey::from_ed_der(&der),
            public: PublicKey {
                kid: kid.to_string(),
                x: URL_SAFE_NO_PAD.encode(pair.public_key().as_ref()),
            },
        })
    }

    /// The receipt: `claims` signed, with this key's `kid` in the header.
    pub fn sign(&self, claims: &Claims) -> String {
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.key).expect("an Ed25519 key signs")
    }

    /// Its public half, as published.
    pub fn public(&self) -> &PublicKey {
        &self.public
    }
}

/// A public key as a JWK: `{"kty":"OKP","crv":"Ed25519","alg":"EdDSA","use":"sig",kid,x}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Jwk", into = "Jwk")]
pub struct PublicKey {
    pub kid: String,
    /// The 32-byte public key, base64url without padding.
    pub x: String,
}

#[derive(Serialize, Deserialize)]
struct Jwk {
    kty: String,
    crv: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    alg: Option<String>,
    #[serde(default, rename = "use", skip_serializing_if = "Option::is_none")]
    use_: Option<String>,
    kid: String,
    x: String,
}

impl From<PublicKey> for Jwk {
    fn from(key: PublicKey) -> Self {
        Self {
            kty: "OKP".into(),
            crv: "Ed25519".into(),
            alg: Some("EdDSA".into()),
            use_: Some("sig".into()),
            kid: key.kid,
            x: key.x,
        }
    }
}

impl TryFrom<Jwk> for PublicKey {
    type Error = String;
    fn try_from(jwk: Jwk) -> Result<Self, String> {
        if jwk.kty != "OKP" || jwk.crv != "Ed25519" {
            return Err(format!("key {} is not an Ed25519 OKP key", jwk.kid));
        }
        Ok(Self {
            kid: jwk.kid,
            x: jwk.x,
        })
    }
}

/// The keys receipts are checked with: `GET /.well-known/jwks.json` serves it, the current
/// key and the retired ones still accepted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeySet {
    pub keys: Vec<PublicKey>,
}

impl KeySet {
    pub fn find(&self, kid: &str) -> Option<&PublicKey> {
        self.keys.iter().find(|k| k.kid == kid)
    }
}

fn pem(der: &[u8]) -> String {
    pem::encode(&pem::Pem::new(PEM_TAG, der))
}

fn der(text: &str) -> Result<Vec<u8>, KeyError> {
    let block = pem::parse(text).map_err(|e| KeyError::Pem(e.to_string()))?;
    if block.tag() != PEM_TAG {
        return Err(KeyError::Pem(format!(
            "a {} block, not {PEM_TAG}",
            block.tag()
        )));
    }
    Ok(block.into_contents())
}

/// The PEM label of a PKCS#8 private key (RFC 7468).
const PEM_TAG: &str = "PRIVATE KEY";
