//! The README's examples, pasted as a newcomer pastes them: every ```` ```sh demo ```` block of
//! README.md, in order, typed into one shell against a local runner started as "Run it" says,
//! with the `countersign` command line this build made on its `PATH`. Between blocks the test
//! waits, as a person reading the next paragraph does, until every run seen so far has paused
//! for a person or ended. Then each example did what the README says it does: the walkthrough's
//! refund was approved and paid, the batch approved the two refunds under $50 and left the $80
//! one, the grant approved that one and then the $60 refund with nobody asked, and no run has a
//! failed call.
//!
//! What the test changes in a block, and why: the gateway's address, `127.0.0.1:8080`, is the
//! test runner's (it runs on its own ports, beside other tests), and `cargo install --path cli`
//! is left out (the command line the test built is already on the `PATH`).

use super::local_runner::{free_offset, fresh_dir, start};
use countersign_tests::wait_for;
use regex::Regex;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

const README: &str = include_str!("../../../README.md");
/// The reviewer's key the README signs in with.
const DEMO_KEY: &str = "local-demo-key-0000";
/// How long one block may take (a `watch` follows its run to the end).
const BLOCK_WITHIN: Duration = Duration::from_secs(60);
/// What the shell prints after each block, with the block's exit status.
const DONE: &str = "__readme_block_done__";

/// The README's runnable blocks, in order: the fenced blocks whose info string is `sh demo`.
fn demo_blocks(readme: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut open: Option<String> = None;
    for line in readme.lines() {
        match (&mut open, line.trim_end()) {
            (None, "```sh demo") => open = Some(String::new()),
            (Some(block), "```") => {
                blocks.push(std::mem::take(block));
                open = None;
            }
            (Some(block), line) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

/// A block as this test pastes it (see the module's comment).
fn as_pasted(block: &str, gateway: &str) -> String {
    let host = gateway.trim_start_matches("http://");
    block
        .lines()
        .filter(|line| !line.starts_with("cargo install --path cli"))
        .map(|line| line.replace("127.0.0.1:8080", host))
        .collect::<Vec<_>>()
        .join("\n")
}

/// One bash, fed blocks on its standard input as a terminal is typed into.
struct Shell {
    child: Child,
    out: Lines<BufReader<ChildStdout>>,
}

impl Shell {
    fn start(bin: &Path) -> Self {
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
        let mut child = Command::new("bash")
            .args(["--noprofile", "--norc"])
            .env("PATH", path)
            .env_remove("COUNTERSIGN_URL")
            .env_remove("COUNTERSIGN_API_KEY")
            .env("XDG_CONFIG_HOME", bin.join("no-config"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap()).lines();
        Self { child, out }
    }

    /// Types `block`, and gives what it printed (its error output too) once it is done, and
    /// the shell's `$RUN` then; fails the test unless its last command succeeded.
    async fn run(&mut self, block: &str) -> (String, String) {
        // A pipeline fails if any of its commands does: `pending … | approve --from -`
        // refusing a call is a failure of the example.
        // The line after the block says its status, and the run it named, if any: `RUN=$(…)`
        // prints no id, and the test waits for that run too before the next block.
        let typed = format!("exec 2>&1; set -o pipefail\n{block}\necho \"{DONE} $? ${{RUN-}}\"\n");
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(typed.as_bytes()).await.unwrap();
        stdin.flush().await.unwrap();
        let mut printed = String::new();
        let done = tokio::time::timeout(BLOCK_WITHIN, async {
            while let Some(line) = self.out.next_line().await.unwrap() {
                if let Some(done) = line.strip_prefix(DONE) {
                    return done.trim().to_string();
                }
                printed.push_str(&line);
                printed.push('\n');
            }
            "the shell ended".to_string()
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the block did not finish within {BLOCK_WITHIN:?}:\n{block}\nit printed:\n{printed}"
            )
        });
        let (status, run) = done.split_once(' ').unwrap_or((&done, ""));
        assert_eq!(
            status, "0",
            "the block failed:\n{block}\nit printed:\n{printed}"
        );
        (printed, run.to_string())
    }
}

/// A run as the gateway answers `GET /v1/runs/{id}` to the README's reviewer.
async fn run_of(http: &reqwest::Client, gateway: &str, id: &str) -> Option<Value> {
    let answer = http
        .get(format!("{gateway}/v1/runs/{id}"))
        .bearer_auth(DEMO_KEY)
        .send()
        .await
        .ok()?;
    answer.json().await.ok()
}

/// Whether a run waits for nobody but a person: it ended, or a call of it is undecided.
fn settled(run: &Value) -> bool {
    let undecided = run["pending"]
        .as_array()
        .is_some_and(|calls| calls.iter().any(|c| c["decision"].is_null()));
    match run["status"].as_str() {
        Some("completed" | "failed" | "cancelled") => true,
        Some("awaiting_approval") => undecided,
        _ => false,
    }
}

/// The run whose first message is `asked`, among `runs`.
fn asked<'a>(runs: &'a [Value], asked: &str) -> &'a Value {
    runs.iter()
        .find(|run| run["messages"][0]["content"][0]["text"] == asked)
        .unwrap_or_else(|| panic!("no run asked {asked:?}"))
}

/// The input of the refund a run's conversation called, and how it ended.
fn refund(run: &Value) -> (Value, Option<String>) {
    let blocks: Vec<&Value> = run["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().unwrap())
        .collect();
    let call = blocks
        .iter()
        .find(|b| b["name"] == "issue_refund")
        .unwrap_or_else(|| panic!("no refund in {run:#}"));
    let outcome = blocks
        .iter()
        .find(|b| b["tool_use_id"] == call["id"])
        .and_then(|b| b["outcome"].as_str().map(String::from));
    (call["input"].clone(), outcome)
}

#[tokio::test]
async fn every_readme_example_works_as_pasted_against_the_local_runner() {
    let blocks = demo_blocks(README);
    assert!(
        blocks.len() >= 8,
        "the README has {} `sh demo` blocks",
        blocks.len()
    );
    let dir = fresh_dir();
    let (runner, _) = start(&dir, free_offset()).await;
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_countersign_cli"),
        bin.join("countersign"),
    )
    .unwrap();

    let mut shell = Shell::start(&bin);
    let http = reqwest::Client::new();
    let ids = Regex::new(r"run_[0-9a-f]{32}").unwrap();
    let mut seen = BTreeSet::new();
    let mut printed = Vec::new();
    for block in &blocks {
        let (out, run) = shell.run(&as_pasted(block, &runner.gateway)).await;
        seen.extend(
            ids.find_iter(&format!("{out} {run}"))
                .map(|m| m.as_str().to_string()),
        );
        wait_for(
            "every run seen so far to pause for a person or end",
            Duration::from_secs(30),
            || async {
                for id in &seen {
                    if !settled(&run_of(&http, &runner.gateway, id).await?) {
                        return None;
                    }
                }
                Some(())
            },
        )
        .await;
        printed.push(out);
    }
    let printed = printed.join("");

    let mut runs = Vec::new();
    for id in &seen {
        runs.push(run_of(&http, &runner.gateway, id).await.unwrap());
    }
    assert_eq!(runs.len(), 5, "the runs the README starts:\n{printed}");
    for run in &runs {
        assert_eq!(run["status"], "completed", "{run:#}");
        assert_eq!(run["failed_calls"], serde_json::json!([]), "{run:#}");
    }
    // Each order got its own refund, approved by the reviewer, the batch or the grant.
    for (request, order, amount, outcome) in [
        (
            "Order A-1001 arrived broken. Please refund it.",
            "A-1001",
            129,
            "approved",
        ),
        ("Please refund order A-1003.", "A-1003", 30, "approved"),
        ("Please refund order A-1004.", "A-1004", 45, "approved"),
        ("Please refund order A-1005.", "A-1005", 80, "approved"),
        ("Please refund order A-1006.", "A-1006", 60, "approved"),
    ] {
        let (input, ran) = refund(asked(&runs, request));
        assert_eq!(input["order_id"], order, "{request}");
        assert_eq!(input["amount"], amount, "{request}");
        assert_eq!(ran.as_deref(), Some(outcome), "{request}");
    }
    for said in [
        "Refund $129 for order A-1001",
        "decide: countersign approve",
        "call_1_0: approved by you, recorded",
        "chain: verified here",
        "event: run.completed",
        "and made grant grt_",
        "active  1/10",
    ] {
        assert!(printed.contains(said), "{said:?} missing from:\n{printed}");
    }
    // The batch decided the two refunds under $50, not the $80 one.
    assert_eq!(
        printed.matches(": approved by you, recorded").count(),
        3,
        "{printed}"
    );
    runner.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
