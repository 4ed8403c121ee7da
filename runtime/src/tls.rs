//! TLS for the services' clients of NATS and Redis, which both use rustls.

/// Two rustls crypto providers are compiled in (through different crates), so rustls cannot
/// pick one by itself and would panic at the first TLS connection; every client calls this
/// before it connects. A second call finds the provider installed and changes nothing.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}
