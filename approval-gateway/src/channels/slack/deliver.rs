//! Posting to Slack. Each held call is posted as its own message, once (where it was posted
//! is kept in the run's slot, so a redelivered request posts nothing twice); reminders and
//! escalations are replies in its thread; how it ended replaces the message, buttons gone
//! (and says what standing grant an approval made). A call a standing grant decided was never
//! posted, since nobody was asked: it is posted once, decided, naming the grant.
//!
//! Should Slack refuse a request's blocks, a short message (summary, run id, buttons) is
//! posted instead, so the call can be decided from Slack all the same. A rate limit (HTTP
//! 429) is waited out as Slack asks when that is short, and otherwise handed back to the
//! delivery queue's backoff.

use super::api::{self, SlackError};
use super::blocks::{self, Request, Target};
use crate::channels::delivery::{Ask, Deliver, DeliveryError, Ending};
use crate::channels::granted::Granted;
use crate::config::SlackConfig;
use crate::pages::request_view::CallView;
use crate::state::AppState;
use countersign_model::approval::Channel;
use countersign_model::authority::names_a_model;
use countersign_model::grant::{Grant, GrantLimits};
use countersign_model::run::{Action, HeldCall, RunId};
use serde_json::{Value, json};
use tracing::warn;

impl From<SlackError> for DeliveryError {
    fn from(e: SlackError) -> Self {
        match e {
            SlackError::Unavailable(why) => DeliveryError::Retry(why),
            SlackError::RateLimited { .. } => DeliveryError::Retry(e.to_string()),
            SlackError::Refused { .. } => DeliveryError::GiveUp(e.to_string()),
        }
    }
}

/// A `slack:` channel.
pub(crate) struct Slack<'a> {
    state: &'a AppState,
    config: &'a SlackConfig,
    /// The Slack channel, `#name` or an id.
    name: &'a str,
    /// The channel as the policy names it, which keys where each call was posted.
    channel: String,
}

impl<'a> Slack<'a> {
    pub(crate) fn open(
        state: &'a AppState,
        name: &'a str,
        channel: &Channel,
    ) -> Result<Self, DeliveryError> {
        let Some(config) = &state.config.slack else {
            return Err(DeliveryError::GiveUp("no [slack] is configured".into()));
        };
        Ok(Self {
            state,
            config,
            name,
            channel: channel.to_string(),
        })
    }

    async fn call(&self, method: &str, message: &Value) -> Result<Value, SlackError> {
        api::call_patiently(&self.state.http, self.config, method, message).await
    }

    /// Posts the request, or, should Slack refuse its content, the short message.
    async fn post_request(
        &self,
        message: &Value,
        ask: &Ask<'_>,
        target: &Target,
    ) -> Result<Value, DeliveryError> {
        match self.call("chat.postMessage", message).await {
            Ok(answer) => Ok(answer),
            Err(e) => {
                let Some(why) = e.refused_content() else {
                    return Err(e.into());
                };
                let (run_id, call_id) = (ask.run_id, &ask.call.call_id);
                warn!(%run_id, call_id, error = %e, "Slack refused the request; posting it in short");
                let limits = self.grant_limits(ask.agent, ask.call);
                let short = blocks::short_request_message(self.name, ask.call, target, limits, why);
                Ok(self.call("chat.postMessage", &short).await?)
            }
        }
    }

    /// Where the call's message was posted; a retry until it has been.
    async fn posted(&self, run_id: &RunId, call_id: &str) -> Result<Value, DeliveryError> {
        let reference = self
            .state
            .store
            .channel_ref(run_id, call_id, &self.channel)
            .await?
            .ok_or_else(|| DeliveryError::Retry("the request is not posted yet".into()))?;
        serde_json::from_str(&reference).map_err(|e| DeliveryError::GiveUp(e.to_string()))
    }

    /// Notes on the call's message reference that it was escalated, for its final update.
    async fn mark_escalated(&self, run_id: &RunId, call_id: &str) -> Result<(), DeliveryError> {
        let mut reference = self.posted(run_id, call_id).await?;
        reference["escalated"] = true.into();
        let reference = reference.to_string();
        let store = &self.state.store;
        Ok(store
            .set_channel_ref(run_id, call_id, &self.channel, &reference)
            .await?)
    }

    /// What the policy of the call's tool allows of standing grants; None for a tool its
    /// agent no longer has.
    fn grant_limits(&self, agent: &str, call: &HeldCall) -> Option<GrantLimits> {
        let agent = self.state.catalog().get(agent)?;
        agent
            .tool(&call.tool)
            .map(countersign_model::agent::ToolDef::grant_limits)
    }

    /// The escalation's reply, which mentions the people added: for configured Slack users,
    /// the one mention meant to ping.
    fn escalation(&self, call: &HeldCall) -> String {
        let mentions: Vec<String> = call
            .reviewers
            .escalate_to
            .iter()
            .map(|who| {
                let person = self.state.people.person(who);
                match person.and_then(|p| p.slack_user.as_deref()) {
                    Some(user) => format!("<@{user}>"),
                    None => blocks::escaped(who, blocks::NAME_CHARS),
                }
            })
            .collect();
        format!(
            "Escalated: nobody decided in time, so {} may now decide too; {}.",
            mentions.join(", "),
            blocks::deadline(call)
        )
    }

    /// Who decided the call, how and when, in the message's words; with the standing grant
    /// an approval made, if it made one.
    async fn decided_words(
        &self,
        run_id: &RunId,
        call_id: &str,
        action: Action,
        by: &str,
        when: &str,
    ) -> Result<String, DeliveryError> {
        let verb = match action {
            Action::Approve => "Approved",
            Action::Edit => "Approved with edits",
            Action::Reject => "Rejected",
        };
        let by = blocks::escaped(by, blocks::NAME_CHARS);
        let decided = format!("{verb} by {by} at {when}.");
        // An approval may have made a standing grant (made before the approval was
        // announced): the message says what it now lets through.
        let made = match action {
            Action::Approve => {
                let id = Grant::id_for(run_id.as_str(), call_id);
                self.state.store.grant(&id).await?
            }
            _ => None,
        };
        Ok(match made {
            Some(grant) => format!("{decided} {}", blocks::grant_made(&grant)),
            None => decided,
        })
    }

    /// Posts a call nobody was asked about, already decided, once: where it went is kept like
    /// a request's, so a redelivery finds it and posts nothing again.
    async fn post_decided(
        &self,
        run_id: &RunId,
        call_id: &str,
        summary: &str,
        outcome: &str,
    ) -> Result<(), DeliveryError> {
        let store = &self.state.store;
        if store
            .channel_ref(run_id, call_id, &self.channel)
            .await?
            .is_some()
        {
            return Ok(());
        }
        let message = blocks::ended_message(self.name, summary, outcome);
        let answer = self.call("chat.postMessage", &message).await?;
        let reference = json!({
            "channel": answer["channel"], "ts": answer["ts"], "summary": summary,
        });
        Ok(store
            .set_channel_ref(run_id, call_id, &self.channel, &reference.to_string())
            .await?)
    }
}

impl Deliver for Slack<'_> {
    async fn request(&self, ask: &Ask<'_>) -> Result<(), DeliveryError> {
        let (run_id, call) = (ask.run_id, ask.call);
        // Posted before, and the ack was lost: post nothing twice.
        let store = &self.state.store;
        if store
            .channel_ref(run_id, &call.call_id, &self.channel)
            .await?
            .is_some()
        {
            return Ok(());
        }
        let target = Target {
            run_id: run_id.to_string(),
            call_id: call.call_id.clone(),
            digest: call.digest.clone(),
        };
        let message = blocks::request_message(&Request {
            channel: self.name,
            agent: ask.agent,
            requested_by: ask.requested_by,
            text: ask.text,
            call,
            evidence: ask.evidence,
            target: &target,
            grant_limits: self.grant_limits(ask.agent, call),
        });
        let answer = self.post_request(&message, ask, &target).await?;
        let reference = json!({
            "channel": answer["channel"], "ts": answer["ts"], "summary": call.summary,
        });
        Ok(store
            .set_channel_ref(run_id, &call.call_id, &self.channel, &reference.to_string())
            .await?)
    }

    /// A reply in the call's thread.
    async fn remind(&self, ask: &Ask<'_>, escalated: bool) -> Result<(), DeliveryError> {
        let (run_id, call) = (ask.run_id, ask.call);
        let text = if escalated {
            // Marked first: marking again is harmless, replying twice is not.
            self.mark_escalated(run_id, &call.call_id).await?;
            self.escalation(call)
        } else {
            format!(
                "Reminder: this still waits for a decision; {}.",
                blocks::deadline(call)
            )
        };
        let reference = self.posted(run_id, &call.call_id).await?;
        let message =
            json!({"channel": reference["channel"], "thread_ts": reference["ts"], "text": text});
        self.call("chat.postMessage", &message).await?;
        Ok(())
    }

    /// Rewrites the call's message to say how it ended, without buttons. A call decided under
    /// a standing grant, or by a reviewer model, was never posted: it is posted now, already
    /// decided.
    async fn ended(
        &self,
        run_id: &RunId,
        call_id: &str,
        ending: Ending<'_>,
    ) -> Result<(), DeliveryError> {
        let when = blocks::slack_date(chrono::Utc::now().timestamp_millis());
        let outcome = match ending {
            Ending::Decided {
                under_grant: Some(id),
                ..
            } => {
                let granted = Granted::load(self.state, run_id, call_id, id).await?;
                let outcome = format!(
                    "{} at {when}.",
                    blocks::escaped(&granted.headline(), blocks::NAME_CHARS * 2)
                );
                return self
                    .post_decided(run_id, call_id, &granted.summary, &outcome)
                    .await;
            }
            Ending::Decided { by, .. } if names_a_model(by) => {
                let summary = CallView::load(self.state, run_id.as_str(), call_id)
                    .await
                    .map_err(|e| DeliveryError::Retry(e.message))?
                    .map(|view| view.summary)
                    .unwrap_or_default();
                let outcome = format!(
                    "Approved by {}, a reviewer model, inside the envelope its policy sets, at {when}.",
                    blocks::escaped(by, blocks::NAME_CHARS)
                );
                return self.post_decided(run_id, call_id, &summary, &outcome).await;
            }
            Ending::Decided { action, by, .. } => {
                self.decided_words(run_id, call_id, action, by, &when)
                    .await?
            }
            Ending::Expired { deadline } => format!(
                "Expired: nobody decided by {}, so it did not run.",
                blocks::slack_date(deadline)
            ),
            Ending::Cancelled { by } => format!(
                "Cancelled: {} stopped the run, so it did not run.",
                blocks::escaped(by, blocks::NAME_CHARS)
            ),
            Ending::Superseded => format!(
                "Closed at {when}: the tool's policy changed, so the call is checked again under the new one (and asked about anew if it still needs a person)."
            ),
        };
        let reference = self.posted(run_id, call_id).await?;
        let outcome = if reference["escalated"] == true {
            format!("{outcome} It had been escalated.")
        } else {
            outcome
        };
        let message = blocks::decided_message(
            reference["channel"].as_str().unwrap_or_default(),
            reference["ts"].as_str().unwrap_or_default(),
            reference["summary"].as_str().unwrap_or_default(),
            &outcome,
        );
        self.call("chat.update", &message).await?;
        Ok(())
    }
}
