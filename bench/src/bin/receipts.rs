//! `cargo run --release -p countersign-bench --bin receipts [N]`: what a countersignature
//! receipt costs. Signs N receipts of the demo refund as the gateway does, checks each as the
//! demo refunds service does (signature, claims, the RFC 8785 digest of the body, single use
//! in memory), and prints the receipt's size and each step's latency percentiles.

use countersign_receipt::{Claims, Jwks, KeySet, SeenJtis, Signer, Verifier, input_digest};
use std::time::{Duration, Instant};

fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args().nth(1).map_or(Ok(20_000), |a| a.parse())?;
    if cfg!(debug_assertions) {
        eprintln!("warning: a debug build; figures want --release");
    }
    let (signer, _) = Signer::generate("bench")?;
    let keys = KeySet {
        keys: vec![signer.public().clone()],
    };
    let verifier = Verifier::new(
        Jwks::fixed(keys),
        "https://approvals.example.com",
        "issue_refund",
        SeenJtis::default(),
    );
    let input =
        serde_json::json!({"order_id": "A-1001", "amount": 129, "reason": "arrived broken"});
    let body = serde_json::to_vec(&input)?;
    let now = chrono::Utc::now().timestamp();
    let (mut digest, mut sign, mut check) = (Vec::new(), Vec::new(), Vec::new());
    let mut size = 0;
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    for i in 0..n {
        let started = Instant::now();
        let input_digest = input_digest(&input);
        digest.push(started.elapsed());
        let claims = Claims {
            iss: "https://approvals.example.com".into(),
            aud: "issue_refund".into(),
            iat: now,
            exp: now + 7 * 24 * 3600,
            jti: format!("rct_{i:032}"),
            run_id: "run_01JZ8X9K2M3N4P5Q6R7S8T9V0W".into(),
            turn: 1,
            call_id: "toolu_2".into(),
            tool: "issue_refund".into(),
            input_digest,
            action: "approve".into(),
            decided_by: vec!["alice".into()],
            policy_version: "3f2a9c1b7d4e5f60".into(),
            grant: None,
            risk: None,
            stages: Vec::new(),
            windows: Vec::new(),
        };
        let started = Instant::now();
        let token = signer.sign(&claims);
        sign.push(started.elapsed());
        size = token.len();
        let started = Instant::now();
        let checked = runtime.block_on(verifier.check(
            Some(&token),
            "issue_refund",
            Some("run_01JZ8X9K2M3N4P5Q6R7S8T9V0W:1:toolu_2"),
            &body,
        ));
        check.push(started.elapsed());
        anyhow::ensure!(checked.is_ok(), "a receipt did not check: {checked:?}");
    }
    println!("receipts: {n}, {size} bytes each (the Countersign-Receipt header's value)");
    println!(
        "{:<34} {:>8} {:>8} {:>8}",
        "step", "p50 µs", "p99 µs", "max µs"
    );
    for (step, times) in [
        ("input digest (RFC 8785 + SHA-256)", &mut digest),
        ("sign (gateway)", &mut sign),
        ("check (tool, in-memory jtis)", &mut check),
    ] {
        times.sort();
        let at = |q: f64| micros(times[((times.len() - 1) as f64 * q) as usize]);
        println!(
            "{step:<34} {:>8.1} {:>8.1} {:>8.1}",
            at(0.5),
            at(0.99),
            at(1.0)
        );
    }
    Ok(())
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
