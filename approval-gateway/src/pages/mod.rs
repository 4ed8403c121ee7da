//! What a reviewer is shown, whichever door they came through (the inbox, an email link): the
//! page layout, a held call as a request to decide, the decision forms, and who is looking
//! (the session, and the check that a form was sent from the gateway's own pages). No routes:
//! the doors serve these.

pub(crate) mod forms;
pub(crate) mod layout;
pub(crate) mod request_view;
pub(crate) mod same_origin;
pub(crate) mod session;

use std::collections::HashMap;

/// A form body's fields; a body that is not a form has none.
pub(crate) fn form_fields(body: &[u8]) -> HashMap<String, String> {
    serde_urlencoded::from_bytes(body).unwrap_or_default()
}
