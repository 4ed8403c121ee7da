//! Mailing the people an `email:` channel reaches. A request and each reminder are mailed
//! once per channel (a mark in the run's slot says so, set after the last mail went); once a
//! call is decided, expired or cancelled the links' pages say so and nobody is mailed. A call
//! a standing grant approved was never mailed: a short notice says so, once, in the same way.

use super::grant::{Grant, new_token};
use super::message::{Notice, Request};
use crate::channels::delivery::{Ask, Deliver, DeliveryError, Ending};
use crate::channels::granted::Granted;
use crate::config::{EmailConfig, Person};
use crate::mail::send;
use crate::state::AppState;
use countersign_model::approval::Channel;
use countersign_model::authority::{self, Principal, RunFacts};
use countersign_model::digest::sha256_hex;
use countersign_model::run::{Action, RunId};
use std::time::Duration;

/// An `email:` channel: an address, or `approvers`.
pub(crate) struct Email<'a> {
    state: &'a AppState,
    config: &'a EmailConfig,
    address: &'a str,
    /// The channel as the policy names it, which keys what was sent.
    channel: String,
}

impl<'a> Email<'a> {
    pub(crate) fn open(
        state: &'a AppState,
        address: &'a str,
        channel: &Channel,
    ) -> Result<Self, DeliveryError> {
        let (Some(config), Some(_)) = (&state.config.email, &state.mailer) else {
            return Err(DeliveryError::GiveUp("no [email] is configured".into()));
        };
        Ok(Self {
            state,
            config,
            address,
            channel: channel.to_string(),
        })
    }

    /// The people the channel reaches for a call, each with what they may do with it (never
    /// nothing): the person with that address, or with `email:approvers`, every configured
    /// person with an address who may decide it; and the people `also` names.
    fn recipients(&self, ask: &Ask<'_>, also: &[String]) -> Vec<(&'a Person, Vec<Action>)> {
        let run = RunFacts {
            requested_by: ask.requested_by,
            cancelling: false,
        };
        self.state
            .config
            .people
            .iter()
            .filter(|p| p.email.is_some())
            .filter(|p| match self.address {
                "approvers" => true,
                address => p.email.as_deref() == Some(address) || also.contains(&p.id),
            })
            .map(|p| {
                let who = Principal {
                    id: &p.id,
                    role: self.state.person_role(&p.id),
                };
                (p, authority::actions_for(who, ask.call, run))
            })
            .filter(|(_, actions)| !actions.is_empty())
            .collect()
    }

    /// Who is told of a call a grant approved: the channel's address, or with
    /// `email:approvers`, the grant's makers (in whose names it was approved) who have one.
    fn told_of(&self, granted: &Granted) -> Vec<String> {
        match self.address {
            "approvers" => granted
                .makers
                .iter()
                .filter_map(|m| self.state.people.person(m)?.email.clone())
                .collect(),
            address => vec![address.to_string()],
        }
    }

    /// Mails `people` once for `sent_key`; `prefix` goes before the subject and first line.
    async fn ask(
        &self,
        ask: &Ask<'_>,
        prefix: &str,
        people: Vec<(&Person, Vec<Action>)>,
        sent_key: &str,
    ) -> Result<(), DeliveryError> {
        let store = &self.state.store;
        let call_id = ask.call.call_id.as_str();
        if store
            .channel_ref(ask.run_id, call_id, sent_key)
            .await?
            .is_some()
        {
            return Ok(());
        }
        if people.is_empty() {
            return Err(DeliveryError::GiveUp(format!(
                "no configured person who may decide the call is reached by email:{}",
                self.address
            )));
        }
        for (person, actions) in people {
            self.mail(ask, prefix, person, &actions).await?;
        }
        Ok(store
            .set_channel_ref(ask.run_id, call_id, sent_key, "sent")
            .await?)
    }

    /// Mails one person fresh links for the call.
    async fn mail(
        &self,
        ask: &Ask<'_>,
        prefix: &str,
        person: &Person,
        actions: &[Action],
    ) -> Result<(), DeliveryError> {
        // The requester may turn their own request down; approving it is the policy's to allow.
        let own =
            ask.requested_by == Some(person.id.as_str()) && !actions.contains(&Action::Approve);
        let links = self.links(ask, person, actions).await?;
        let request = Request {
            ask,
            prefix,
            links: &links,
            own,
        };
        let to = person.email.as_deref().unwrap_or_default();
        send(
            self.state,
            to,
            &request.subject(),
            request.text(),
            request.html(),
        )
        .await?;
        Ok(())
    }

    /// One stored single-use link per action.
    async fn links(
        &self,
        ask: &Ask<'_>,
        person: &Person,
        actions: &[Action],
    ) -> Result<Vec<(Action, String)>, DeliveryError> {
        let ttl = Duration::from_secs(self.config.link_ttl_secs);
        let mut links = Vec::new();
        for &action in actions {
            let token = new_token(ask.run_id);
            let grant = Grant {
                run_id: ask.run_id.clone(),
                call_id: ask.call.call_id.clone(),
                digest: ask.call.digest.clone(),
                principal: person.id.clone(),
                action,
            };
            let grant = serde_json::to_string(&grant).expect("grants serialize");
            self.state
                .store
                .put_link_token(ask.run_id, &sha256_hex(&token), &grant, ttl)
                .await?;
            let link = format!(
                "{}/approvals/email/{token}",
                self.config.public_base_url.trim_end_matches('/')
            );
            links.push((action, link));
        }
        Ok(links)
    }
}

impl Deliver for Email<'_> {
    async fn request(&self, ask: &Ask<'_>) -> Result<(), DeliveryError> {
        self.ask(ask, "", self.recipients(ask, &[]), &self.channel)
            .await
    }

    async fn remind(&self, ask: &Ask<'_>, escalated: bool) -> Result<(), DeliveryError> {
        // The people escalated to are asked whatever address the channel names.
        let added = match escalated {
            true => self
                .state
                .people
                .resolve(&ask.call.reviewers.escalate_to)
                .unwrap_or_default(),
            false => Vec::new(),
        };
        let people = self.recipients(ask, &added);
        let prefix = if escalated {
            "Escalated: "
        } else {
            "Reminder: "
        };
        let sent_key = format!("{}|{prefix}", self.channel);
        self.ask(ask, prefix, people, &sent_key).await
    }

    /// The links' pages say how a call people were asked about ended; no further mail. A
    /// call a standing grant approved was mailed to nobody: a short notice says it ran.
    async fn ended(
        &self,
        run_id: &RunId,
        call_id: &str,
        ending: Ending<'_>,
    ) -> Result<(), DeliveryError> {
        let Ending::Decided {
            action: Action::Approve,
            under_grant: Some(id),
            ..
        } = ending
        else {
            return Ok(());
        };
        let store = &self.state.store;
        let sent_key = format!("{}|granted", self.channel);
        if store
            .channel_ref(run_id, call_id, &sent_key)
            .await?
            .is_some()
        {
            return Ok(());
        }
        let granted = Granted::load(self.state, run_id, call_id, id).await?;
        let notice = Notice {
            granted: &granted,
            run_id,
            call_id,
        };
        for to in self.told_of(&granted) {
            send(
                self.state,
                &to,
                &notice.subject(),
                notice.text(),
                notice.html(),
            )
            .await?;
        }
        Ok(store
            .set_channel_ref(run_id, call_id, &sent_key, "sent")
            .await?)
    }
}
