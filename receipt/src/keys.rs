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
use sha2::{Digest, Sha256};

/// Why a key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("not an Ed25519 private key in PKCS#8 PEM: {0}")]
    Pem(String),
    #[error("not an Ed25519 private JWK: {0}")]
    Jwk(String),
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

    /// The key of a secret file as operators keep one: a PKCS#8 PEM, or a private OKP JWK
    /// (`{"kty":"OKP","crv":"Ed25519","d":...,"x":...}`). Its `kid` is `kid`, else the JWK's
    /// own, else the key's RFC 7638 thumbprint (so every gateway sharing the file agrees).
    pub fn from_secret(text: &str, kid: Option<&str>) -> Result<Self, KeyError> {
        let text = text.trim();
        if !text.starts_with('{') {
            let der = der(text)?;
            let kid = match kid {
                Some(kid) => kid.to_string(),
                None => Self::from_der("-", &der)?.public.thumbprint(),
            };
            return Self::from_der(&kid, &der);
        }
        let jwk: PrivateJwk =
            serde_json::from_str(text).map_err(|e| KeyError::Jwk(e.to_string()))?;
        if jwk.kty != "OKP" || jwk.crv != "Ed25519" {
            return Err(KeyError::Jwk("not an Ed25519 OKP key".into()));
        }
        let decode = |field: &str| {
            URL_SAFE_NO_PAD
                .decode(field)
                .map_err(|e| KeyError::Jwk(e.to_string()))
        };
        let pair = Ed25519KeyPair::from_seed_and_public_key(&decode(&jwk.d)?, &decode(&jwk.x)?)
            .map_err(|e| KeyError::Jwk(e.to_string()))?;
        let der = pair.to_pkcs8().map_err(|e| KeyError::Jwk(e.to_string()))?;
        let public = PublicKey {
            kid: String::new(),
            x: jwk.x,
        };
        let kid = kid
            .map(str::to_string)
            .or(jwk.kid)
            .unwrap_or_else(|| public.thumbprint());
        Self::from_der(&kid, der.as_ref())
    }

    /// The key of a PKCS#8 PEM file.
    pub fn from_pem(kid: &str, pem: &str) -> Result<Self, KeyError> {
        Self::from_der(kid, &der(pem)?)
    }

    fn from_der(kid: &str, der: &[u8]) -> Result<Self, KeyError> {
        if !(1..=64).contains(&kid.len())
            || !kid
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(KeyError::Kid);
        }
        let pair = Ed25519KeyPair::from_pkcs8(der).map_err(|e| KeyError::Pem(e.to_string()))?;
        Ok(Self {
            kid: kid.to_string(),
            key: EncodingKey::from_ed_der(der),
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
    /// The key's id (`kid`), which a receipt's header names.
    pub kid: String,
    /// The 32-byte public key, base64url without padding.
    pub x: String,
}

impl PublicKey {
    /// The key's JWK thumbprint (RFC 7638): the base64url SHA-256 of its required members in
    /// lexicographic order, a `kid` anyone can recompute from the key alone.
    pub fn thumbprint(&self) -> String {
        let members = serde_json::json!({"crv": "Ed25519", "kty": "OKP", "x": self.x});
        URL_SAFE_NO_PAD.encode(Sha256::digest(members.to_string()))
    }
}

/// A private key as a JWK (RFC 8037): the public members and `d`, the 32-byte seed.
#[derive(Deserialize)]
struct PrivateJwk {
    kty: String,
    crv: String,
    #[serde(default)]
    kid: Option<String>,
    x: String,
    d: String,
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
    /// The keys, the one that signs now and the retired ones still accepted.
    pub keys: Vec<PublicKey>,
}

impl KeySet {
    /// The key whose id is `kid`, if the set has it.
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

#[cfg(test)]
mod tests {
    use super::*;

    // The Ed25519 key of RFC 8037, appendix A.1, and its thumbprint from appendix A.3.
    const RFC_D: &str = "nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A";
    const RFC_X: &str = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";
    const RFC_THUMBPRINT: &str = "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k";

    #[test]
    fn a_private_jwk_signs_and_its_kid_is_the_rfc_7638_thumbprint() {
        let jwk = format!(r#"{{"kty":"OKP","crv":"Ed25519","d":"{RFC_D}","x":"{RFC_X}"}}"#);
        let signer = Signer::from_secret(&jwk, None).unwrap();
        assert_eq!(signer.public().x, RFC_X);
        assert_eq!(signer.public().kid, RFC_THUMBPRINT);
        // A PEM of the same key gets the same kid.
        let der = Ed25519KeyPair::from_seed_and_public_key(
            &URL_SAFE_NO_PAD.decode(RFC_D).unwrap(),
            &URL_SAFE_NO_PAD.decode(RFC_X).unwrap(),
        )
        .unwrap()
        .to_pkcs8()
        .unwrap();
        let from_pem = Signer::from_secret(&pem(der.as_ref()), None).unwrap();
        assert_eq!(from_pem.public(), signer.public());
        assert_eq!(
            Signer::from_secret(&jwk, Some("k2")).unwrap().public().kid,
            "k2"
        );
    }

    #[test]
    fn a_pkcs8_v1_key_as_openssl_writes_it_signs() {
        let pair = Ed25519KeyPair::generate().unwrap();
        let v1 = pair.to_pkcs8v1().unwrap();
        let signer = Signer::from_secret(&pem(v1.as_ref()), None).unwrap();
        let token = signer.sign(&crate::Claims {
            iss: "i".into(),
            aud: "a".into(),
            iat: 0,
            exp: 1,
            jti: "j".into(),
            run_id: "r".into(),
            turn: 1,
            call_id: "c".into(),
            tool: "t".into(),
            input_digest: "d".into(),
            action: "approve".into(),
            decided_by: vec!["p".into()],
            policy_version: "v".into(),
            grant: None,
            risk: None,
            stages: Vec::new(),
            windows: Vec::new(),
        });
        let keys = KeySet {
            keys: vec![signer.public().clone()],
        };
        assert_eq!(crate::signed_by(&token, &keys).unwrap().jti, "j");
    }

    #[test]
    fn a_key_of_another_kind_is_refused_with_what_is_wrong() {
        let p256 = r#"{"kty":"EC","crv":"P-256","d":"AA","x":"AA"}"#;
        assert!(matches!(
            Signer::from_secret(p256, None),
            Err(KeyError::Jwk(_))
        ));
        assert!(matches!(
            Signer::from_secret("not a key", None),
            Err(KeyError::Pem(_))
        ));
    }
}
