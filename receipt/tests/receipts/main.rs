//! The receipt check as a tool makes it: the claims against the request (`checks`), the keys
//! fetched from a gateway over HTTP (`jwks`), and the tower layer in front of a tool's handler
//! (`layer`). One binary, one link.

mod checks;
mod jwks;
mod layer;
mod support;
