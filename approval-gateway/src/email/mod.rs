//! Email approvals. Each reviewer of a held call gets an email with one link per action
//! (approve, reject, edit; the run's requester gets only reject unless the policy lets them
//! approve their own request). Each link carries its own random single-use token, prefixed
//! by the run id (`{run_id}.{random}`) so it is stored in the run's slot; only its SHA-256 is
//! stored, bound to the reviewer, the run, the call and the digest, and it expires. The
//! decision script spends it in the same step that records the decision. Mail scanners open
//! every link, so opening one only shows a confirmation page; the form on that page decides
//! (see `routes::email`).

use crate::config::{EmailConfig, SmtpTls};
use crate::notify::{Delivery, DeliveryError};
use crate::state::AppState;
use countersign_shared::digest::sha256_hex;
use countersign_shared::events::{Event, Evidence};
use countersign_shared::run::{Action, PendingCall, RunId};
use lettre::message::header::ContentType;
use lettre::transport::smtp::authentication::Credentials;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use serde::{Deserialize, Serialize};
use std::time::Duration;

pub type Mailer = AsyncSmtpTransport<Tokio1Executor>;

/// What one link token lets one person do.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Grant {
    pub run_id: RunId,
    pub call_id: String,
    pub digest: String,
    pub principal: String,
    pub action: Action,
}

pub fn mailer(config: &EmailConfig) -> anyhow::Result<Mailer> {
    let host = config.smtp_host.as_str();
    let builder = match config.smtp_tls {
        SmtpTls::None => Mailer::builder_dangerous(host),
        SmtpTls::Starttls => Mailer::starttls_relay(host)?,
        SmtpTls::Tls => Mailer::relay(host)?,
    };
    let builder = builder.port(config.smtp_port);
    let builder = match (&config.smtp_username, &config.smtp_password) {
        (Some(user), Some(password)) => builder.credentials(Credentials::new(
            user.clone(),
            password.expose().to_string(),
        )),
        _ => builder,
    };
    Ok(builder.build())
}

/// A fresh token for a run's link: the run id, then 244 random bits from two UUIDv4s as hex.
fn new_token(run: &RunId) -> String {
    format!(
        "{run}.{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// The run a link token belongs to, and the hash its grant is stored under.
pub fn parse_token(token: &str) -> Option<(RunId, String)> {
    let (run, _) = token.split_once('.')?;
    Some((RunId::parse(run)?, sha256_hex(token)))
}

/// The people an `email:` channel reaches for a call: the person with that address, or with
/// `email:approvers`, every configured person with an address who may decide it.
fn recipients<'a>(
    state: &'a AppState,
    address: &str,
    call: &PendingCall,
) -> Vec<&'a crate::config::Person> {
    state
        .config
        .people
        .iter()
        .filter(|p| p.email.is_some())
        .filter(|p| match address {
            "approvers" => call.deciders.as_ref().is_none_or(|d| d.contains(&p.id)),
            address => p.email.as_deref() == Some(address),
        })
        .collect()
}

/// What a mail asks for.
struct Asking<'a> {
    run_id: &'a RunId,
    agent: &'a str,
    text: &'a str,
    call: &'a PendingCall,
    evidence: &'a [Evidence],
    requested_by: Option<&'a str>,
    /// Put before the subject and the first line: `Reminder: `, `Escalated: ` or nothing.
    prefix: &'a str,
}

pub async fn deliver(
    state: &AppState,
    address: &str,
    delivery: &Delivery,
) -> Result<(), DeliveryError> {
    let call_id = delivery.call_id.as_deref().unwrap_or_default();
    let (asking, people, sent_key) = match &delivery.event.event {
        Event::ApprovalRequested {
            run_id,
            agent,
            text,
            calls,
            evidence,
            requested_by,
            ..
        } => {
            let Some(call) = calls.iter().find(|c| c.call_id == call_id) else {
                return Err(DeliveryError::GiveUp(format!(
                    "no call {call_id} in the request"
                )));
            };
            let asking = Asking {
                run_id,
                agent,
                text,
                call,
                evidence,
                requested_by: requested_by.as_deref(),
                prefix: "",
            };
            (
                asking,
                recipients(state, address, call),
                delivery.channel.clone(),
            )
        }
        Event::ApprovalReminder {
            run_id,
            agent,
            text,
            call,
            escalated,
            requested_by,
        } => {
            let mut people = recipients(state, address, call);
            if *escalated {
                // The people escalated to are asked whatever address the channel names.
                let added = state
                    .people
                    .resolve(&call.reviewers.escalate_to)
                    .unwrap_or_default();
                for person in state.config.people.iter().filter(|p| p.email.is_some()) {
                    if added.contains(&person.id) && !people.iter().any(|p| p.id == person.id) {
                        people.push(person);
                    }
                }
            }
            let prefix = if *escalated {
                "Escalated: "
            } else {
                "Reminder: "
            };
            let asking = Asking {
                run_id,
                agent,
                text,
                call,
                evidence: &[],
                requested_by: requested_by.as_deref(),
                prefix,
            };
            (asking, people, format!("{}|{prefix}", delivery.channel))
        }
        // Once decided or expired, the links' pages say so; no further mail.
        _ => return Ok(()),
    };
    let store_err = |e: countersign_shared::store::StoreError| DeliveryError::Retry(e.to_string());
    if state
        .store
        .channel_ref(asking.run_id, call_id, &sent_key)
        .await
        .map_err(store_err)?
        .is_some()
    {
        return Ok(());
    }
    if people.is_empty() {
        return Err(DeliveryError::GiveUp(format!(
            "no configured person is reached by email:{address}"
        )));
    }
    for person in people {
        send(state, &asking, person).await?;
    }
    state
        .store
        .set_channel_ref(asking.run_id, call_id, &sent_key, "sent")
        .await
        .map_err(store_err)
}

/// Mails one person fresh links for the call.
async fn send(
    state: &AppState,
    asking: &Asking<'_>,
    person: &crate::config::Person,
) -> Result<(), DeliveryError> {
    let (Some(config), Some(mailer)) = (&state.config.email, &state.mailer) else {
        return Err(DeliveryError::GiveUp("no [email] is configured".into()));
    };
    let store_err = |e: countersign_shared::store::StoreError| DeliveryError::Retry(e.to_string());
    let call = asking.call;
    let ttl = Duration::from_secs(config.link_ttl_secs);
    // The requester may turn their own request down; approving it is the policy's to allow.
    let own =
        asking.requested_by == Some(person.id.as_str()) && !call.reviewers.allow_self_approval;
    let actions: &[Action] = if own {
        &[Action::Reject]
    } else {
        &[Action::Approve, Action::Reject, Action::Edit]
    };
    let mut links = Vec::new();
    for &action in actions {
        let token = new_token(asking.run_id);
        let grant = Grant {
            run_id: asking.run_id.clone(),
            call_id: call.call_id.clone(),
            digest: call.digest.clone(),
            principal: person.id.clone(),
            action,
        };
        let grant = serde_json::to_string(&grant).expect("grants serialize");
        state
            .store
            .put_link_token(asking.run_id, &sha256_hex(&token), &grant, ttl)
            .await
            .map_err(store_err)?;
        let link = format!(
            "{}/approvals/email/{token}",
            config.public_base_url.trim_end_matches('/')
        );
        links.push(format!("{:<9}{link}", format!("{}:", title_case(action))));
    }
    let mut body = format!(
        "{}Approval needed: {}\n\nWhy: {}\n",
        asking.prefix, call.summary, call.reason
    );
    if !asking.text.is_empty() {
        body += &format!("The agent said: {}\n", asking.text);
    }
    for e in asking.evidence {
        let content: String = e.content.chars().take(500).collect();
        body += &format!("Evidence from {}: {content}\n", e.tool);
    }
    body += &format!(
        "\nAgent {}, run {}, requested by {}; {}.\n\n{}\n\n\
         Opening a link decides nothing: it shows a page where you confirm. The links work once, only for you, until the request is decided.\n",
        asking.agent,
        asking.run_id,
        asking.requested_by.unwrap_or("unknown"),
        crate::slack::blocks::deadline(call),
        links.join("\n"),
    );
    if own {
        body += "You asked for this run, so you may reject it but not approve it.\n";
    }
    let to = person.email.as_deref().unwrap_or_default();
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
        .subject(format!(
            "{}Approval needed: {}",
            asking.prefix, call.summary
        ))
        .header(ContentType::TEXT_PLAIN)
        .body(body)
        .map_err(|e| DeliveryError::GiveUp(e.to_string()))?;
    mailer
        .send(message)
        .await
        .map_err(|e| DeliveryError::Retry(e.to_string()))?;
    Ok(())
}

fn title_case(action: Action) -> &'static str {
    match action {
        Action::Approve => "Approve",
        Action::Reject => "Reject",
        Action::Edit => "Edit",
    }
}
