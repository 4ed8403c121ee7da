//! One mail out through the configured SMTP transport, as text and HTML together
//! (`multipart/alternative`), with the headers clients and filters expect (`MIME-Version`,
//! `Message-ID`, `Date`).

use crate::channels::delivery::DeliveryError;
use crate::state::AppState;
use lettre::message::MultiPart;
use lettre::{AsyncTransport, Message};

/// Mails `to`; a transport failure is worth a retry, a bad address or no `[email]` is not.
pub(crate) async fn send(
    state: &AppState,
    to: &str,
    subject: &str,
    text: String,
    html: String,
) -> Result<(), DeliveryError> {
    let (Some(config), Some(mailer)) = (&state.config.email, &state.mailer) else {
        return Err(DeliveryError::GiveUp("no [email] is configured".into()));
    };
    let message = Message::builder()
        .from(
            config
                .from
                .parse()
                .map_err(|e| DeliveryError::GiveUp(format!("from: {e}")))?,
        )
        .to(to
            .parse()
            .map_err(|e| DeliveryError::GiveUp(format!("to {to}: {e}")))?)
        .subject(subject)
        .message_id(None)
        .multipart(MultiPart::alternative_plain_html(text, html))
        .map_err(|e| DeliveryError::GiveUp(e.to_string()))?;
    mailer
        .send(message)
        .await
        .map_err(|e| DeliveryError::Retry(e.to_string()))?;
    Ok(())
}
