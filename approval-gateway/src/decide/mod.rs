//! Deciding held calls, whatever channel the decisions came through. The gateway checks
//! only what needs its configuration or is plain bad input: the shape and size of each
//! decision, and an edit's input against the tool's schema. Everything about the run (is the
//! call held in its current turn, the digest, who may decide, the requester, the quorum, the
//! deadline, an email link still unused) is checked by the decision script in the same
//! atomic step that records the decisions, appends their audit entries and queues their
//! announcements (`lua/decide.lua`); nothing read here before it runs is trusted. What the
//! script queued is published once the standing grants the approvals carry are made, and by
//! the outbox sweepers if NATS is away.

mod batch;
mod delegation;
pub(crate) mod error;
mod grant;
mod input;
mod proposal;

pub(crate) use batch::{MAX_BATCH, RunDecided, decide_batch};
pub(crate) use delegation::delegators;
pub(crate) use error::{DecideError, told};
pub(crate) use input::{Decider, MAX_TEXT, Proposed};

use crate::state::AppState;
use countersign_model::authority;
use countersign_model::edit::FieldChange;
use countersign_model::grant::GrantTerms;
use countersign_model::now_ms;
use countersign_model::run::Run;
use countersign_runtime::trace_context;
use countersign_store::{
    Announcement, CallDecided, DecideOutcome, DecideRequest, DecisionSource, RefusalCode,
};
use std::collections::HashSet;
use tracing::Instrument;

/// Checks and records the decisions of one request on `run_id`: all stand, or none does.
pub(crate) async fn decide(
    state: &AppState,
    run_id: &str,
    proposed: Vec<Proposed>,
    by: &Decider<'_>,
) -> Result<Vec<CallDecided>, DecideError> {
    if proposed.is_empty() {
        return Err(DecideError::BadInput(
            "decisions must hold at least one decision".into(),
        ));
    }
    let mut seen = HashSet::new();
    for p in &proposed {
        input::check_shape(p)?;
        if !seen.insert(p.call_id.as_str()) {
            return Err(DecideError::BadInput(format!(
                "call {:?} is decided twice",
                p.call_id
            )));
        }
    }
    // A grant approves later calls in its makers' names: it is made only in the name of
    // someone the configuration knows with a role that decides (not someone a key that
    // speaks for anyone vouches for), or it would approve nothing from the start.
    if by.grant.is_none()
        && proposed.iter().any(|p| p.grant.is_some())
        && !authority::may_make_grant(state.config.person_role(by.principal))
    {
        return Err(DecideError::GrantRefused(format!(
            "{} is not someone the configuration knows with a role that decides, and a grant approves later calls in its makers' names: nothing was recorded",
            by.principal
        )));
    }
    let run = state
        .run(run_id)
        .await?
        .ok_or_else(|| DecideError::NoRun(format!("no run {run_id:?}")))?;
    // Someone the held calls do not list may decide them in the place of someone who handed
    // them their approvals, each use of the delegation taken first (atomic with ending it).
    if by.grant.is_none() && by.delegation.is_none() && !by.model {
        let calls: Vec<&str> = proposed.iter().map(|p| p.call_id.as_str()).collect();
        if let Some(used) = delegation::take(state, &run, &calls, by.principal).await? {
            let name = used.delegation.decider_name();
            let delegated = Decider {
                principal: &name,
                delegation: Some(&used.delegation),
                ..*by
            };
            let decided = decide_run(state, run, proposed, &delegated).await;
            if let Err(DecideError::Refused { .. }) = &decided {
                used.give_back(state).await?;
            }
            return decided;
        }
    }
    decide_run(state, run, proposed, by).await
}

/// [`decide`], on `run` as read.
async fn decide_run(
    state: &AppState,
    run: Run,
    proposed: Vec<Proposed>,
    by: &Decider<'_>,
) -> Result<Vec<CallDecided>, DecideError> {
    // A span of the run's trace, whichever channel and gateway the decision came through.
    let span = tracing::info_span!("decision", run_id = %run.run_id, door = by.door, principal = by.principal);
    trace_context::adopt(&span, run.trace.as_deref());
    let grants: Vec<(String, GrantTerms)> = proposed
        .iter()
        .filter_map(|p| Some((p.call_id.clone(), p.grant.clone()?)))
        .collect();
    let (mut calls, queued) = record(state, &run, proposed, by)
        .instrument(span.clone())
        .await?;
    // The approvals are recorded; the grants they carry are made now (again, harmlessly, for
    // a repeat: a grant is made once per call), before the decisions are announced, so a
    // channel showing an approval finds the grant it made.
    let mut made = Ok(());
    for (call_id, terms) in grants {
        if let Some(call) = calls.iter_mut().find(|c| c.call_id == call_id) {
            match grant::made(state, &run, &call_id, &terms, by.door).await {
                Ok(grant) => call.grant = grant,
                Err(e) => {
                    made = Err(e);
                    break;
                }
            }
        }
    }
    // The decision stands once Redis holds it: the reviewer is answered now, whatever NATS
    // is doing, and what is not published here the outbox sweepers publish.
    let (outbox, run_id) = (state.outbox.clone(), run.run_id.clone());
    tokio::spawn(
        async move {
            if let Err(e) = outbox.publish(&run_id, &queued).await {
                tracing::warn!(%run_id, error = %e, "decision recorded; its announcement waits in the outbox");
            }
        }
        .instrument(span),
    );
    made.map(|()| calls)
}

/// The calls as recorded, and the announcements the script queued for them (to publish).
async fn record(
    state: &AppState,
    run: &Run,
    proposed: Vec<Proposed>,
    by: &Decider<'_>,
) -> Result<(Vec<CallDecided>, Vec<Announcement>), DecideError> {
    // A receipt names everyone whose approval completed its call; should another approval
    // land between reading them and recording, the script says so and the receipts are
    // signed again for who it is now.
    let mut attempts = 0;
    loop {
        attempts += 1;
        match record_once(state, run, &proposed, by).await {
            Err(DecideError::Refused { code, .. })
                if code == RefusalCode::ReceiptStale && attempts < 3 => {}
            done => return done,
        }
    }
}

/// How policies name `principal`: their id, and `role:NAME` for each role the configured
/// person of that id holds.
fn policy_entries(state: &AppState, principal: &str) -> Vec<String> {
    let roles = state.people.person(principal).map(|p| p.roles.as_slice());
    let roles = roles
        .unwrap_or_default()
        .iter()
        .map(|r| format!("role:{r}"));
    std::iter::once(principal.to_string())
        .chain(roles)
        .collect()
}

async fn record_once(
    state: &AppState,
    run: &Run,
    proposed: &[Proposed],
    by: &Decider<'_>,
) -> Result<(Vec<CallDecided>, Vec<Announcement>), DecideError> {
    let mut proposals = Vec::with_capacity(proposed.len());
    // A delegate's limits are those of the person whose place they take.
    let entries = policy_entries(state, by.delegation.map_or(by.principal, |d| &d.from));
    for p in proposed {
        let several = run
            .held_calls()
            .any(|c| c.call_id == p.call_id && c.reviewers.quorum > 1);
        let voters = match several && state.receipts.signs() {
            true => state.store.voters(&run.run_id, &p.call_id).await?,
            false => Vec::new(),
        };
        proposals.push(proposal::prepare(
            &state.catalog(),
            &state.receipts,
            run,
            p.clone(),
            (by, &entries),
            &voters,
        )?);
    }
    let request = DecideRequest {
        principal: by.principal,
        door: by.door,
        by: match by.model {
            true => DecisionSource::Model,
            false => DecisionSource::Person,
        },
        link: by.link,
        role_decides: by.role.decides(),
        receipts: state.receipts.signs(),
        grant: by.grant,
        delegation: by.delegation.map(|d| (d.from.as_str(), d.to.as_str())),
        proposals,
    };
    match state.store.decide(&run.run_id, &request).await? {
        DecideOutcome::Decided { calls, queued } => {
            let metrics = &state.metrics;
            for _ in &calls {
                metrics.decision(by.door, "recorded");
                metrics.decided_after(now_ms() - run.updated_at);
            }
            Ok((calls, queued))
        }
        DecideOutcome::Refused(refusal) => {
            state.metrics.decision(by.door, refusal.code.as_str());
            Err(DecideError::refused(
                run.run_id.as_str(),
                by.principal,
                refusal,
            ))
        }
        DecideOutcome::NoRun => Err(DecideError::NoRun(format!(
            "no run {:?}",
            run.run_id.as_str()
        ))),
        DecideOutcome::Settled(_) | DecideOutcome::NotDue => Err(DecideError::Backend(
            "the decision script answered as for an expiry".into(),
        )),
    }
}

/// What an edit would change, checked as [`decide`] checks it (its shape, and the fields and
/// schema of the tool of the held call) but recording nothing: for a channel that shows the
/// change before the reviewer sends it. `None` when `run_id` holds no such call with that
/// digest: deciding it says why, in the words of every other refusal.
pub(crate) async fn edit_preview(
    state: &AppState,
    run_id: &str,
    p: &Proposed,
) -> Result<Option<Vec<FieldChange>>, DecideError> {
    input::check_shape(p)?;
    let Some(run) = state.run(run_id).await? else {
        return Ok(None);
    };
    let held = run
        .held_calls()
        .find(|c| c.call_id == p.call_id && Some(&c.digest) == p.digest.as_ref());
    match (held, &p.input) {
        (Some(pending), Some(input)) => {
            proposal::checked_edit(&state.catalog(), &run, pending, input).map(Some)
        }
        _ => Ok(None),
    }
}

/// Checks and records one decision, as the channels other than the API make them.
pub(crate) async fn decide_one(
    state: &AppState,
    run_id: &str,
    proposed: Proposed,
    by: &Decider<'_>,
) -> Result<CallDecided, DecideError> {
    let mut calls = decide(state, run_id, vec![proposed], by).await?;
    calls
        .pop()
        .ok_or_else(|| DecideError::Backend("the decision script answered nothing".into()))
}
