//! One mail out through the configured SMTP transport, as text and HTML together
//! (`multipart/alternative`), with the headers clients and filters expect (`MIME-Version`,
//! `Message-ID`, `Date`).

use crate::state::AppState;
use lettre::message::MultiPart;
use lettre::{AsyncTransport, Message};

/// Why a mail was not sent.
#[derive(Debug)]
pub(crate) enum MailError {
    /// Worth trying again later (the transport failed, the store was away).
    Retry(String),
    /// Will never work (a bad address, no `[email]` configured).
    GiveUp(String),
}

impl From<countersign_store::StoreError> for MailError {
    fn from(e: countersign_store::StoreError) -> Self {
        Self::Retry(e.to_string())
    }
}

/// Mails `to`; a transport failure is worth a retry, a bad address or no `[email]` is not.
pub(crate) async fn send(
    state: &AppState,
    to: &str,
    subject: &str,
    text: String,
    html: String,
) -> Result<(), MailError> {
    let (Some(config), Some(mailer)) = (&state.config.email, &state.mailer) else {
        return Err(MailError::GiveUp("no [email] is configured".into()));
    };
    let message = Message::builder()
        .from(
            config
                .from
                .parse()
                .map_err(|e| MailError::GiveUp(format!("from: {e}")))?,
        )
        .to(to
            .parse()
            .map_err(|e| MailError::GiveUp(format!("to {to}: {e}")))?)
        .subject(subject)
        .message_id(None)
        .multipart(MultiPart::alternative_plain_html(text, html))
        .map_err(|e| MailError::GiveUp(e.to_string()))?;
    mailer
        .send(message)
        .await
        .map_err(|e| MailError::Retry(e.to_string()))?;
    Ok(())
}
