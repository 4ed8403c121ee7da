//! The demo tools' ledger and the service over it, behind both doors of the demo tools
//! service: HTTP (`demo_tools`, which also puts the two together) and MCP (`demo_mcp`). A
//! call is counted, answered once per idempotency key, and its receipt checked here the same
//! way however it came; each door only reads its request and writes the outcome in its own
//! terms.

use countersign_receipt::{Checked, Claims, FileJtis, Refusal, Verifier};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// What the service received and did, which the tests read through `DemoTools`.
#[derive(Default)]
pub(crate) struct Ledger {
    /// Requests received per (path, idempotency key).
    pub(crate) received: HashMap<(String, String), u32>,
    /// The first answer per (path, idempotency key), answered again for repeats.
    answers: HashMap<(String, String), Value>,
    /// Refunds applied, in order.
    pub(crate) refunds: Vec<Value>,
    /// The receipts refunds ran with, in order.
    pub(crate) receipts: Vec<Claims>,
    /// Refunds refused for their receipt, by refusal code.
    pub(crate) refused: Vec<String>,
    /// Requests that came with a receipt, per path.
    pub(crate) carrying_receipts: HashMap<String, u32>,
}

/// The largest refund the demo runs without a person's countersignature, as the demo
/// agent's policy has it.
pub const REFUND_LIMIT: f64 = 20.0;

/// The verifier of the demo's refunds: receipts remembered in a file.
pub(crate) type DemoVerifier = Verifier<FileJtis>;

/// The ledger, and the verifier when refunds' receipts are checked.
#[derive(Clone)]
pub(crate) struct Service {
    ledger: Arc<Mutex<Ledger>>,
    verifier: Option<Arc<DemoVerifier>>,
}

/// The demo's orders: one per README example, each with its amount and what went wrong (which
/// the scripted model reads to decide its refund).
fn orders() -> HashMap<&'static str, Value> {
    [
        ("A-1001", json!(129), "arrived broken"),
        ("A-1002", json!(15.5), "arrived late"),
        ("A-1003", json!(30), "the wrong size was sent"),
        ("A-1004", json!(45), "arrived late"),
        ("A-1005", json!(80), "arrived damaged"),
        ("A-1006", json!(60), "never arrived"),
    ]
    .into_iter()
    .map(|(id, amount, problem)| {
        let order = json!({"order_id": id, "status": "delivered", "amount": amount,
                           "payments": [{"method": "card", "amount": amount}],
                           "problem": problem});
        (id, order)
    })
    .collect()
}

/// A request as the ledger sees it, however it came (HTTP or MCP).
pub(crate) struct Request<'a> {
    /// The ledger's name for what was asked: the HTTP path, or `mcp:` and the tool's name.
    pub path: &'a str,
    pub idempotency_key: Option<&'a str>,
    pub receipt: Option<&'a str>,
}

/// What the service answers a request, before HTTP or MCP puts it in its own terms.
pub(crate) enum Outcome {
    /// The tool's answer; for a repeated idempotency key, the first one again.
    Done(Value),
    /// What was asked about does not exist.
    NotFound(String),
    /// The request's receipt was refused: nothing ran.
    Refused(Refusal),
}

impl Service {
    /// A service with an empty ledger, checking receipts with `verifier` if given.
    pub(crate) fn new(verifier: Option<Arc<DemoVerifier>>) -> Self {
        Self {
            ledger: Arc::default(),
            verifier,
        }
    }

    /// What the service has received and done so far.
    pub(crate) fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap()
    }

    /// Counts the request and answers a repeated key with its first answer.
    fn once(&self, request: &Request, apply: impl FnOnce(&mut Ledger) -> Outcome) -> Outcome {
        let mut ledger = self.ledger.lock().unwrap();
        if request.receipt.is_some() {
            *ledger
                .carrying_receipts
                .entry(request.path.to_string())
                .or_default() += 1;
        }
        let key = request.idempotency_key.unwrap_or("").to_string();
        let slot = (request.path.to_string(), key);
        *ledger.received.entry(slot.clone()).or_default() += 1;
        if let Some(answer) = ledger.answers.get(&slot) {
            return Outcome::Done(answer.clone());
        }
        let outcome = apply(&mut ledger);
        if let Outcome::Done(answer) = &outcome
            && !slot.1.is_empty()
        {
            ledger.answers.insert(slot, answer.clone());
        }
        outcome
    }

    /// `get_order`: the order named by `input.order_id`.
    pub(crate) fn lookup(&self, request: &Request, input: &Value) -> Outcome {
        self.once(request, |_| {
            let id = input["order_id"].as_str().unwrap_or_default();
            match orders().remove(id) {
                Some(order) => Outcome::Done(order),
                None => Outcome::NotFound(format!("no order {id}")),
            }
        })
    }

    /// `issue_refund`: refunds `input.amount` for `input.order_id`. With a verifier, a refund
    /// over [`REFUND_LIMIT`], or one that carries a receipt, runs only if `check` (the
    /// verifier's check of the receipt against the request as it came) accepts it.
    pub(crate) async fn refund<F>(
        &self,
        request: &Request<'_>,
        input: &Value,
        check: impl FnOnce(Arc<DemoVerifier>) -> F,
    ) -> Outcome
    where
        F: Future<Output = Result<Checked, Refusal>>,
    {
        let mut receipt = None;
        let mut again = false;
        if let Some(verifier) = &self.verifier {
            let needed = input["amount"].as_f64().is_none_or(|a| a > REFUND_LIMIT);
            if needed || request.receipt.is_some() {
                match check(verifier.clone()).await {
                    Ok(checked) => {
                        again = checked.again;
                        receipt = Some(checked.claims);
                    }
                    Err(refusal) => {
                        let mut ledger = self.ledger.lock().unwrap();
                        ledger.refused.push(refusal.code().to_string());
                        return Outcome::Refused(refusal);
                    }
                }
            }
        }
        self.once(request, |ledger| {
            // A receipt run before whose answer this process does not hold (it restarted
            // since): answering would mean running it again.
            if again {
                ledger.refused.push(Refusal::Reused.code().to_string());
                return Outcome::Refused(Refusal::Reused);
            }
            let refund = json!({
                "refund_id": format!("rf_{}", ledger.refunds.len() + 1),
                "order_id": input["order_id"],
                "amount": input["amount"],
                "status": "refunded",
            });
            ledger.refunds.push(refund.clone());
            ledger.receipts.extend(receipt);
            Outcome::Done(refund)
        })
    }
}
