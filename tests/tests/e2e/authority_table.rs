//! The one rule of who may act, held against the decision script: every door a principal can
//! arrive through (each gives them a role), every policy shape (open, listed or escalated
//! approvers, quorum, self-approval, a cancel requested), every action. For each combination a fresh run
//! is paused in a real Redis and the decision is sent to the script as that door would send
//! it; what the script accepts must be exactly what `authority::may_decide` allows, what a
//! surface made for one person offers (`actions_for`) exactly what it accepts, and what a
//! shared surface offers (`offered`) exactly what someone may do.

use approval_gateway::config::{ApiKey, Config, Person, Role};
use countersign_model::approval::Reviewers;
use countersign_model::audit::{AuditEntry, AuditKind};
use countersign_model::authority::{self, ALL_ACTIONS, Principal, RunFacts};
use countersign_model::grant::Grant;
use countersign_model::reviewer::ModelApproval;
use countersign_model::run::{Action, Cancellation, Decision, HeldCall, Run, RunId, TurnCall};
use countersign_runtime::metrics::Metrics;
use countersign_runtime::names::Names;
use countersign_store::{
    Announcement, Claim, DecideOutcome, DecideRequest, DecisionSource, Proposal, RefusalCode, Save,
    Store,
};
use countersign_tests::infra::Infra;
use serde_json::json;
use std::collections::BTreeSet;
use std::time::Duration;

/// The run's requester in every case.
const REQUESTER: &str = "rita";
/// The approvers a listed policy names.
const LISTED: [&str; 2] = ["alice", "rita"];
/// Whom its escalation adds.
const ESCALATED_TO: &str = "admin";

/// Who decides a call: anyone whose role decides, the listed approvers, or those and whom
/// an escalation added.
#[derive(Clone, Copy, Debug)]
enum Approvers {
    Open,
    Listed,
    Escalated,
}

/// The gateway's configuration the doors read roles from: alice and bob are people without
/// keys, rhea a person whose only key reads, quinn a person whose key starts runs, rita the
/// requester with a reviewer key, and the admin's key.
fn config() -> Config {
    let person = |id: &str, role: Option<Role>| Person {
        id: id.into(),
        roles: vec!["finance".into()],
        slack_user: Some(format!("U_{id}")),
        email: Some(format!("{id}@example.com")),
        role,
    };
    let key = |principal: &str, role| ApiKey {
        key: format!("{principal}-key-0123456789").as_str().into(),
        role,
        principal: principal.into(),
        speaks_for: Vec::new(),
    };
    Config {
        people: vec![
            person("alice", None),
            person("bob", Some(Role::Reader)),
            person("rhea", None),
            person("quinn", None),
            person("rita", None),
        ],
        api_keys: vec![
            key("rhea", Role::Reader),
            key("quinn", Role::Requester),
            key("rita", Role::Reviewer),
            key("admin", Role::Admin),
        ],
        ..Config::default()
    }
}

/// Who arrives through which door, and the role that door gives them.
fn arrivals(config: &Config) -> Vec<(String, String, Role)> {
    let mut out = Vec::new();
    for key in &config.api_keys {
        out.push((
            format!("{} key", key.principal),
            key.principal.clone(),
            key.role,
        ));
    }
    for person in &config.people {
        // Slack, an email link and a session from an emailed link all name the person.
        let role = config.person_role(&person.id).unwrap();
        out.push((
            format!("{} by Slack or email", person.id),
            person.id.clone(),
            role,
        ));
    }
    // A signed sender decides as itself, with the reviewer role.
    out.push(("ops signed sender".into(), "ops".into(), Role::Reviewer));
    out
}

#[derive(Clone, Copy, Debug)]
struct Policy {
    approvers: Approvers,
    quorum: u32,
    self_ok: bool,
    cancelling: bool,
}

fn policies() -> Vec<Policy> {
    let mut out = Vec::new();
    for approvers in [Approvers::Open, Approvers::Listed, Approvers::Escalated] {
        for quorum in [1, 2] {
            for self_ok in [false, true] {
                for cancelling in [false, true] {
                    out.push(Policy {
                        approvers,
                        quorum,
                        self_ok,
                        cancelling,
                    });
                }
            }
        }
    }
    out
}

fn held_call(policy: Policy) -> HeldCall {
    HeldCall {
        call_id: "toolu_1".into(),
        tool: "issue_refund".into(),
        input: json!({"order_id": "A-1", "amount": 129}),
        digest: format!("sha256:{}", "a".repeat(64)),
        policy_version: String::new(),
        summary: "Refund $129".into(),
        reason: "over the limit".into(),
        reviewers: Reviewers {
            quorum: policy.quorum,
            allow_self_approval: policy.self_ok,
            ..Reviewers::default()
        },
        deciders: match policy.approvers {
            Approvers::Open => None,
            Approvers::Listed => Some(LISTED.map(String::from).to_vec()),
            Approvers::Escalated => Some(
                LISTED
                    .iter()
                    .chain([&ESCALATED_TO])
                    .map(std::string::ToString::to_string)
                    .collect(),
            ),
        },
        // Held calls always have a deadline; this one is an hour away.
        deadline: Some(countersign_model::now_ms() + 3_600_000),
        remind_at: None,
        escalated: matches!(policy.approvers, Approvers::Escalated),
        recheck: None,
        risk: None,
        windows: Vec::new(),
        stage: None,
        model_approval: None,
    }
}

/// A run paused on `call`, and cancelled if the policy says so.
async fn paused(store: &Store, call: &HeldCall, policy: Policy) -> RunId {
    let id = RunId::new();
    let mut run = Run::new(
        id.clone(),
        "refunds".into(),
        "v1".into(),
        "Refund A-1.".into(),
        Some(REQUESTER.into()),
        json!({}),
    );
    let (gateway, worker) = (store.clone().gateway(), store.clone().worker());
    assert!(gateway.create(&run).await.unwrap());
    let lease = Duration::from_secs(30);
    assert!(matches!(
        worker.claim(&id, "table", lease).await.unwrap(),
        Claim::Claimed(_)
    ));
    run.turns = 1;
    run.paused_turn = vec![TurnCall {
        call_id: call.call_id.clone(),
        model_call_id: None,
        tool: call.tool.clone(),
        input: call.input.clone(),
        result: None,
        held: Some(call.clone()),
    }];
    worker
        .save(&run, "table", lease, Save::Pause, &Default::default())
        .await
        .unwrap();
    if policy.cancelling {
        let cancel = Cancellation {
            by: REQUESTER.into(),
            reason: None,
            at: 0,
        };
        let entry = AuditEntry::new(&id, AuditKind::CancelRequested);
        let nudge = Announcement::new(
            format!("cancel:{id}"),
            "table.nudge".into(),
            countersign_model::events::Event::RunCancelled {
                run_id: id.clone(),
                cancelled_by: REQUESTER.into(),
                reason: None,
            },
        );
        gateway.cancel(&id, &cancel, &entry, &nudge).await.unwrap();
    }
    id
}

/// Servers of the test's own, and a store on them under a namespace of its own.
async fn store() -> (Infra, Store) {
    let infra = Infra::start().await;
    let namespace = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let store = Store::connect(
        &infra.connections_without_login(&namespace),
        Names::new(&namespace).unwrap(),
        Metrics::default(),
    )
    .await
    .unwrap();
    (infra, store)
}

/// Whether the script records `action` by `principal` (whose door gave them `role`), as a
/// person or, with `by` `Model`, as a reviewer model.
async fn script_accepts(
    store: &Store,
    id: &RunId,
    call: &HeldCall,
    (principal, role, by): (&str, Role, DecisionSource),
    action: Action,
) -> bool {
    let input = (action == Action::Edit).then(|| json!({"order_id": "A-1", "amount": 50}));
    let reason = (action == Action::Reject).then(|| "no".to_string());
    let decision = Decision {
        call_id: call.call_id.clone(),
        digest: call.digest.clone(),
        action,
        input: input.clone(),
        note: None,
        reason: reason.clone(),
        decided_by: principal.into(),
        door: "api".into(),
        decided_at: 0,
        fingerprint: Decision::fingerprint_of(action, input.as_ref(), None, reason.as_deref()),
        expired: false,
        superseded: false,
        receipt: None,
        grant: None,
        under_grant: None,
        delegation: None,
    };
    let mut entry = AuditEntry::new(id, AuditKind::Decided);
    entry.actor = Some(principal.into());
    let request = DecideRequest {
        principal,
        door: "api",
        by,
        link: None,
        role_decides: role.decides(),
        receipts: false,
        grant: None,
        delegation: None,
        proposals: vec![Proposal {
            decision,
            checked_digest: (action == Action::Edit).then(|| call.digest.clone()),
            entry,
            receipt_for: String::new(),
        }],
    };
    match store.clone().gateway().decide(id, &request).await.unwrap() {
        DecideOutcome::Decided { .. } => true,
        DecideOutcome::Refused(_) => false,
        other => panic!("the script answered {other:?}"),
    }
}

#[tokio::test]
async fn every_door_principal_action_and_policy_is_accepted_by_the_script_exactly_when_the_rule_allows_it()
 {
    let (_infra, store) = store().await;
    let config = config();
    let arrivals = arrivals(&config);
    let (mut cases, mut accepted) = (0, 0);
    let mut reasons = BTreeSet::new();
    for policy in policies() {
        let call = held_call(policy);
        let facts = RunFacts {
            requested_by: Some(REQUESTER),
            cancelling: policy.cancelling,
        };
        let mut anyone = BTreeSet::new();
        for (door, principal, role) in &arrivals {
            let who = Principal {
                id: principal,
                role: *role,
            };
            let mut took = Vec::new();
            for action in ALL_ACTIONS {
                let id = paused(&store, &call, policy).await;
                let rule = authority::may_decide(who, action, &call, facts);
                if let Err(refused) = rule {
                    reasons.insert(format!("{refused:?}"));
                }
                let allowed = rule.is_ok();
                let by = (principal.as_str(), *role, DecisionSource::Person);
                let recorded = script_accepts(&store, &id, &call, by, action).await;
                assert_eq!(
                    recorded, allowed,
                    "{door} ({role:?}) {action:?} under {policy:?}: the script recorded {recorded}, the rule allows {allowed}"
                );
                cases += 1;
                if recorded {
                    accepted += 1;
                    took.push(action);
                    anyone.insert(format!("{action:?}"));
                }
            }
            assert_eq!(
                authority::actions_for(who, &call, facts),
                took,
                "{door} ({role:?}) under {policy:?}: the forms and links offered"
            );
        }
        let offered: BTreeSet<String> = authority::offered(&call, facts)
            .iter()
            .map(|a| format!("{a:?}"))
            .collect();
        assert_eq!(
            offered, anyone,
            "the buttons shown to everyone under {policy:?}"
        );
    }
    println!(
        "{cases} cases ({} doors and principals, {} policies, 3 actions): {accepted} recorded",
        arrivals.len(),
        policies().len()
    );
    // The table is not vacuous: both outcomes occur, and each refusal reason is reached.
    assert!(accepted > 0 && accepted < cases);
    assert_eq!(reasons.len(), 5, "{reasons:?}");
}

/// A reviewer model reaches the script in its own name, from the approval its verdict stored
/// on the call: the script records exactly what `authority::may_model_approve` allows (only
/// an approval, only by the model the call names, never on a run being cancelled, whoever
/// the call's approvers are), and a person's decision in a model's name nowhere.
#[tokio::test]
async fn a_model_decides_exactly_what_the_rule_allows_and_nobody_decides_in_its_name() {
    let (_infra, store) = store().await;
    const MODEL: &str = "model:haiku@v1";
    let (mut cases, mut accepted) = (0, 0);
    for policy in policies().into_iter().filter(|p| p.quorum == 1) {
        for approved_by in [None, Some(MODEL), Some("model:haiku@v0")] {
            let mut call = held_call(policy);
            call.model_approval = approved_by.map(|by| ModelApproval {
                by: by.into(),
                reason: "routine".into(),
            });
            let facts = RunFacts {
                requested_by: Some(REQUESTER),
                cancelling: policy.cancelling,
            };
            for action in ALL_ACTIONS {
                let id = paused(&store, &call, policy).await;
                let allowed = authority::may_model_approve(MODEL, action, &call, facts).is_ok();
                let by = (MODEL, Role::Reviewer, DecisionSource::Model);
                let recorded = script_accepts(&store, &id, &call, by, action).await;
                assert_eq!(
                    recorded, allowed,
                    "{action:?} by {MODEL} of a call approved by {approved_by:?} under {policy:?}"
                );
                // The same name through any door a person uses is refused by both.
                let who = Principal {
                    id: MODEL,
                    role: Role::Admin,
                };
                assert!(authority::may_decide(who, action, &call, facts).is_err());
                let id = paused(&store, &call, policy).await;
                let by = (MODEL, Role::Admin, DecisionSource::Person);
                assert!(!script_accepts(&store, &id, &call, by, action).await);
                cases += 1;
                accepted += usize::from(recorded);
            }
        }
    }
    println!("{cases} model cases: {accepted} recorded");
    assert!(accepted > 0 && accepted < cases);
}

/// What the script answers `grant` deciding `call` of run `id` (approving it).
async fn decided_under(store: &Store, id: &RunId, call: &HeldCall, grant: &Grant) -> DecideOutcome {
    let principal = grant.decided_by();
    let decision = Decision {
        call_id: call.call_id.clone(),
        digest: call.digest.clone(),
        action: Action::Approve,
        input: None,
        note: None,
        reason: None,
        decided_by: principal.clone(),
        door: "grant".into(),
        decided_at: 0,
        fingerprint: Decision::fingerprint_of(Action::Approve, None, None, None),
        expired: false,
        superseded: false,
        receipt: None,
        grant: None,
        under_grant: Some(grant.id.clone()),
        delegation: None,
    };
    let mut entry = AuditEntry::new(id, AuditKind::Decided);
    entry.actor = Some(principal.clone());
    let request = DecideRequest {
        principal: &principal,
        door: "grant",
        by: countersign_store::DecisionSource::Person,
        link: None,
        role_decides: true,
        receipts: false,
        grant: Some(grant),
        delegation: None,
        proposals: vec![Proposal {
            decision,
            checked_digest: None,
            entry,
            receipt_for: String::new(),
        }],
    };
    store.clone().gateway().decide(id, &request).await.unwrap()
}

/// A grant reaches the script from whatever the gateway was told of the call (an event on
/// NATS, which a worker's NATS user could forge); the script holds it to the run and the call
/// as stored: another agent, tool, policy version or requester decides nothing.
#[tokio::test]
async fn the_script_decides_under_a_grant_only_the_calls_its_terms_name_as_stored() {
    let (_infra, store) = store().await;
    let policy = Policy {
        approvers: Approvers::Open,
        quorum: 1,
        self_ok: false,
        cancelling: false,
    };
    let call = held_call(policy);
    let grant = Grant {
        id: Grant::id_for("run_elsewhere", "toolu_9"),
        agent: "refunds".into(),
        tool: call.tool.clone(),
        policy_version: call.policy_version.clone(),
        condition: "true".into(),
        requester: Some(REQUESTER.into()),
        max_uses: 5,
        granted_by: vec!["alice".into()],
        channel: "api".into(),
        run_id: "run_elsewhere".into(),
        call_id: "toolu_9".into(),
        run_requested_by: Some(REQUESTER.into()),
        created_at: 0,
        expires_at: i64::MAX,
        uses: 0,
        total: None,
        spent: 0.0,
        revoked: None,
    };
    let id = paused(&store, &call, policy).await;
    type Change = fn(&mut Grant);
    let variants: [(&str, Change); 4] = [
        ("agent", |g| g.agent = "payouts".into()),
        ("tool", |g| g.tool = "delete_account".into()),
        ("policy version", |g| g.policy_version = "v9".into()),
        ("requester", |g| g.requester = Some("bob".into())),
    ];
    for (term, change) in variants {
        let mut other = grant.clone();
        change(&mut other);
        match decided_under(&store, &id, &call, &other).await {
            DecideOutcome::Refused(refusal) => {
                assert_eq!(refusal.code, RefusalCode::GrantMismatch, "{term}");
                assert_eq!(refusal.detail, term);
            }
            outcome => panic!("a grant of another {term} was answered {outcome:?}"),
        }
    }
    let outcome = decided_under(&store, &id, &call, &grant).await;
    assert!(
        matches!(outcome, DecideOutcome::Decided { .. }),
        "{outcome:?}"
    );
}
