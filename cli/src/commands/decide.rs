//! `countersign approve | reject | edit RUN CALL --digest D`: one decision on one call. The
//! digest is the one `countersign show` displayed; it is never looked up here, since a decision
//! quotes what the person saw, and the gateway refuses it if the call changed since.
//! `approve | reject --from` decides each call of a listing instead (see `super::listed`).

use super::listed;
use super::runs::json_object;
use crate::args::{Chosen, Decide, EditArgs};
use crate::client::Gateway;
use crate::error::CliError;
use crate::render::print_json;
use crate::view::{HeldView, RunView, read};
use countersign_model::edit;
use serde_json::{Value, json};

pub(super) async fn approve(gateway: &Gateway, call: Chosen, json: bool) -> Result<(), CliError> {
    send_chosen(gateway, call, json!({"action": "approve"}), json).await
}

pub(super) async fn reject(
    gateway: &Gateway,
    call: Chosen,
    reason: Option<String>,
    json: bool,
) -> Result<(), CliError> {
    let reason = required(
        reason,
        "--reason",
        "a rejection needs a reason: the agent is told it",
    )?;
    send_chosen(
        gateway,
        call,
        json!({"action": "reject", "reason": reason}),
        json,
    )
    .await
}

/// Sends `decision` on the call named, or on each call of the `--from` listing.
async fn send_chosen(
    gateway: &Gateway,
    chosen: Chosen,
    decision: Value,
    json: bool,
) -> Result<(), CliError> {
    let decided_by = chosen.decided_by;
    match (chosen.shown, chosen.from) {
        (Some(shown), _) => send(gateway, Decide { shown, decided_by }, decision, json).await,
        (None, Some(from)) => listed::send(gateway, &from, decision, decided_by, json).await,
        (None, None) => Err(CliError::Usage(
            "name the call (RUN CALL --digest D) or a listing of calls (--from FILE)".into(),
        )),
    }
}

pub(super) async fn edit(gateway: &Gateway, args: EditArgs, json: bool) -> Result<(), CliError> {
    let note = required(
        args.note,
        "--note",
        "an edit needs a note saying what changed and why: the agent is told it",
    )?;
    digest(&args.call)?;
    let (input, changed) = match (args.input, args.set.is_empty()) {
        (Some(text), _) => (json_object("--input", &text)?, None),
        (None, false) => {
            let held = held_call(gateway, &args.call).await?;
            let before = held.call.input.clone();
            let input = with_changes(held, &args.set)?;
            let changed = edit::described(&edit::changes(&before, &input));
            (input, Some(changed))
        }
        (None, true) => {
            return Err(CliError::Usage(
                "say what the call should do instead: --input JSON, or --set FIELD=VALUE".into(),
            ));
        }
    };
    let decision = json!({"action": "edit", "input": input, "note": note});
    send(gateway, args.call, decision, json).await?;
    if let (Some(changed), false) = (changed, json) {
        println!("It runs with this change (field: before → after):");
        for line in changed.lines() {
            println!("  {line}");
        }
    }
    Ok(())
}

/// Posts `decision` on the call, quoting its digest, and says what the gateway recorded.
async fn send(
    gateway: &Gateway,
    call: Decide,
    mut decision: Value,
    json: bool,
) -> Result<(), CliError> {
    decision["call_id"] = call.shown.call.clone().into();
    decision["digest"] = digest(&call)?.into();
    let mut body = json!({"decisions": [decision]});
    if let Some(by) = &call.decided_by {
        body["decided_by"] = by.clone().into();
    }
    let shown = &call.shown;
    let url = gateway.url(&["v1", "runs", &shown.run, "decisions"]);
    let answer = gateway.post(url, &body).await.map_err(|e| match e {
        CliError::Refused(mut refusal) if refusal.code == "stale_digest" => {
            refusal.hint = Some(format!(
                "The call changed since you saw it. Look again with `countersign show {}` \
                 and decide on what it shows now.",
                shown.run
            ));
            CliError::Refused(refusal)
        }
        other => other,
    })?;
    if json {
        print_json(&answer);
        return Ok(());
    }
    let recorded = &answer["decisions"][0];
    let by = answer["decided_by"].as_str().unwrap_or_default();
    let done = match decision["action"].as_str() {
        Some("approve") => "approved",
        Some("reject") => "rejected",
        _ => "edited",
    };
    let what = match recorded["status"].as_str() {
        Some("approval_recorded") => format!(
            "{by}'s approval of call {} is recorded: {} of {} needed",
            shown.call, recorded["approvals"], recorded["quorum"]
        ),
        Some("already_recorded") => {
            format!(
                "{by} had already {done} call {}: nothing changed",
                shown.call
            )
        }
        _ => format!("{by} {done} call {}: recorded", shown.call),
    };
    println!("{what}");
    if answer["resumes"] == true {
        println!(
            "Every call of the turn is decided: run {} resumes.",
            shown.run
        );
    }
    Ok(())
}

/// The digest the person was shown, which a decision must quote.
pub(super) fn digest(call: &Decide) -> Result<&str, CliError> {
    let shown = &call.shown;
    shown.digest.as_deref().ok_or_else(|| {
        CliError::Usage(format!(
            "--digest is required: quote the digest `countersign show {}` displayed for call {}, \
             so that a call that changed since you looked is refused rather than decided unseen",
            shown.run, shown.call
        ))
    })
}

fn required(value: Option<String>, flag: &str, why: &str) -> Result<String, CliError> {
    value
        .filter(|v| !v.trim().is_empty())
        .ok_or_else(|| CliError::Usage(format!("{flag} is required: {why}")))
}

/// The held call, whose input `--set` changes. Should the call have changed since the
/// person saw it, the gateway refuses the edit: it quotes the digest they were shown.
async fn held_call(gateway: &Gateway, call: &Decide) -> Result<HeldView, CliError> {
    let shown = &call.shown;
    let run: RunView = read(
        gateway
            .get(gateway.url(&["v1", "runs", &shown.run]))
            .await?,
    )?;
    run.pending
        .into_iter()
        .find(|p| p.call.call_id == shown.call && p.decision.is_none())
        .ok_or_else(|| {
            CliError::Failed(format!(
                "run {} has no call {} waiting for a decision (see `countersign show {}`)",
                shown.run, shown.call, shown.run
            ))
        })
}

/// `FIELD=VALUE` read: a value is JSON if it parses as JSON, else text.
fn parse_change(change: &str) -> Result<(&str, Value), CliError> {
    let (field, value) = change
        .split_once('=')
        .filter(|(field, _)| !field.is_empty())
        .ok_or_else(|| CliError::Usage(format!("--set {change:?} is not FIELD=VALUE")))?;
    let value = serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.into()));
    Ok((field, value))
}

/// The held call's input with each `FIELD=VALUE` of `changes` set, once every field is one
/// its tool takes: a misspelt field would be sent beside the one meant, which keeps its old
/// value.
fn with_changes(held: HeldView, changes: &[String]) -> Result<Value, CliError> {
    let parsed = changes
        .iter()
        .map(|c| parse_change(c))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(fields) = &held.fields {
        let unknown = edit::unknown_fields(&held.call.tool, fields, parsed.iter().map(|(f, _)| *f));
        if !unknown.is_empty() {
            let lines: Vec<String> = unknown.iter().map(|p| format!("  {p}")).collect();
            return Err(CliError::Usage(format!(
                "--set names a field the tool does not take, so nothing was sent:\n{}",
                lines.join("\n")
            )));
        }
    }
    let Value::Object(mut input) = held.call.input else {
        return Err(CliError::Usage(
            "the call's input is not a JSON object, so --set cannot change a field of it; \
             give the whole input with --input"
                .into(),
        ));
    };
    for (field, value) in parsed {
        input.insert(field.to_string(), value);
    }
    Ok(Value::Object(input))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(input: Value, fields: Option<&[&str]>) -> HeldView {
        serde_json::from_value(json!({
            "call_id": "t1.1", "tool": "issue_refund", "input": input,
            "digest": "sha256:00", "summary": "s", "reason": "r",
            "fields": fields, "decision": null,
        }))
        .unwrap()
    }

    #[test]
    fn set_values_are_json_when_they_parse_and_text_otherwise() {
        let input = json!({"order_id": "A-1", "amount": 129.0});
        let changed = with_changes(
            held(input, None),
            &[
                "amount=20".into(),
                "order_id=A-1001".into(),
                "note=\"42\"".into(),
            ],
        )
        .unwrap();
        assert_eq!(
            changed,
            json!({"order_id": "A-1001", "amount": 20, "note": "42"})
        );
    }

    #[test]
    fn a_change_without_a_field_is_a_usage_error() {
        for bad in ["amount", "=5"] {
            let err = with_changes(held(json!({}), None), &[bad.into()]).unwrap_err();
            assert!(matches!(err, CliError::Usage(_)), "{bad}: {err}");
        }
    }

    #[test]
    fn a_field_the_tool_does_not_take_is_refused_by_name_before_sending() {
        let call = held(
            json!({"order_id": "A-1", "amount": 129}),
            Some(&["amount", "order_id", "reason"]),
        );
        let err = with_changes(call, &["amout=50".into()]).unwrap_err();
        assert!(matches!(err, CliError::Usage(_)), "{err}");
        assert!(
            err.to_string().contains(
                "amout: is not a field of issue_refund (its fields: amount, order_id, reason)"
            ),
            "{err}"
        );
    }
}
