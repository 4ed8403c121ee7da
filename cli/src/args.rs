//! The command line's grammar. Everything here is what a person types; what each command does
//! is in `commands/`.

use clap::{Args, Parser, Subcommand};
use countersign_model::span::Span;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "countersign",
    version,
    about = "Start agent runs, work the approval queue and check audit trails through a countersign gateway.",
    after_help = "Exit codes: 0 done; 1 a check failed (a broken audit chain, a call that is not \
                  pending, a decision of `--from` refused); 2 usage or configuration error; 3 the gateway refused the request; \
                  4 the gateway could not be reached or did not answer as a gateway does."
)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Args)]
pub(crate) struct Global {
    /// The gateway's base URL [default: the config file's `url`, else http://127.0.0.1:8080]
    #[arg(long, global = true, env = "COUNTERSIGN_URL")]
    pub url: Option<String>,
    /// The API key (prefer the environment variable: a flag shows in the process list)
    #[arg(
        long,
        global = true,
        env = "COUNTERSIGN_API_KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
    /// A config file with `url` and `api_key` [default: $XDG_CONFIG_HOME/countersign/config.toml,
    /// else ~/.config/countersign/config.toml, if it exists]
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    /// Print the gateway's JSON instead of tables
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Start, read and cancel runs
    #[command(subcommand)]
    Runs(RunsCommand),
    /// The calls waiting for a decision, most urgent first
    Pending(PendingArgs),
    /// A run as a reviewer sees it: each waiting call with its input and digest
    Show {
        /// The run's id
        run: String,
    },
    /// Approve a call as it is, or each call `pending --json` listed (`--from`)
    #[command(
        override_usage = "countersign approve (RUN CALL --digest D | --from FILE|-) [OPTIONS]"
    )]
    Approve(Chosen),
    /// Reject a call, or each call `pending --json` listed (`--from`), with a reason the agent
    /// is told
    #[command(
        override_usage = "countersign reject (RUN CALL --digest D | --from FILE|-) --reason R [OPTIONS]"
    )]
    Reject {
        #[command(flatten)]
        call: Chosen,
        /// Why (required): the agent is told
        #[arg(long)]
        reason: Option<String>,
    },
    /// Run a call with changed input
    Edit(EditArgs),
    /// Follow runs as things happen to them, until interrupted
    Watch(WatchArgs),
    /// Approve a call and let a standing grant approve later calls like it
    #[command(
        override_usage = "countersign grant (RUN CALL --digest D | --from FILE|-) --when CEL --uses N --for SPAN [OPTIONS]"
    )]
    Grant(GrantArgs),
    /// Standing grants, newest first, or one grant with the calls it approved
    Grants(GrantsArgs),
    /// End a standing grant: from the gateway's answer on, it approves nothing
    Revoke {
        /// The grant's id (`grt_…`)
        grant: String,
        /// Why, for the record
        #[arg(long)]
        reason: Option<String>,
        /// The person revoking, when the key may speak for others
        #[arg(long, value_name = "WHO")]
        revoked_by: Option<String>,
    },
    /// Hand your approvals (or, as an admin, someone's) to another person for a while
    Delegate(DelegateArgs),
    /// Delegations you made or received (all, for an admin), or one with what it decided
    Delegations(DelegationsArgs),
    /// End a delegation: from the gateway's answer on, nothing is decided under it
    Undelegate {
        /// The delegation's id (`dlg_…`)
        delegation: String,
        /// Why, for the record
        #[arg(long)]
        reason: Option<String>,
        /// The person ending it, when the key may speak for others
        #[arg(long, value_name = "WHO")]
        by: Option<String>,
    },
    /// Agent policies: what a change would do before it ships
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// A run's audit trail
    Audit {
        /// The run's id
        run: String,
        /// Recompute the hash chain here, and exit 1 if it is broken
        #[arg(long)]
        verify: bool,
    },
}

#[derive(Subcommand)]
pub(crate) enum PolicyCommand {
    /// Sort an agent's recorded calls, and those waiting now, by its live policies and by a
    /// candidate file's: per tool, how many would newly be held, newly released or held by
    /// other approvers; the approvals a day each approver group would be asked for; examples;
    /// and what would become of the calls waiting now. Reads, never writes (admin key).
    Replay {
        /// The agent's name
        agent: String,
        /// The candidate agent file
        #[arg(long, value_name = "FILE")]
        candidate: std::path::PathBuf,
        /// How far back (`24h`, `7d`)
        #[arg(long, default_value = "7d")]
        since: String,
    },
    /// Read an agent's recorded decisions and suggest conditions that would have asked
    /// fewer questions without changing any outcome a person chose: per tool and numeric
    /// argument, the largest value people approved below every call they rejected or
    /// edited, with its evidence and its replay over the same window. Reads, never writes
    /// (admin key); `--write` saves a suggestion's candidate file for a person to review.
    Suggest {
        /// The agent's name
        agent: String,
        /// How far back (`24h`, `30d`)
        #[arg(long, default_value = "30d")]
        since: String,
        /// Approvals within a bound a suggestion needs, at least
        #[arg(long, default_value_t = 10)]
        min_calls: usize,
        /// Distinct people among their approvers, at least
        #[arg(long, default_value_t = 2)]
        min_deciders: usize,
        /// Write the candidate agent file of suggestion number `--pick` here
        #[arg(long, value_name = "FILE")]
        write: Option<std::path::PathBuf>,
        /// Which suggestion `--write` saves (1 is the first listed)
        #[arg(long, default_value_t = 1)]
        pick: usize,
    },
    /// How the agent's reviewer models agreed with its people: per tool, their verdicts, how
    /// people settled the calls each verdict was about, the calls a model would have
    /// approved that a person rejected or edited (listed first), and what a verdict took.
    /// With --replay, the models are asked now about the calls people settled. Writes
    /// nothing (admin key).
    Reviewer {
        /// The agent's name
        agent: String,
        /// How far back (`24h`, `30d`)
        #[arg(long, default_value = "30d")]
        since: String,
        /// Ask each tool's reviewer model now about the calls people settled in the window
        /// (each a paid request to its provider), instead of reading the verdicts recorded
        #[arg(long)]
        replay: bool,
        /// With --replay, the most calls asked about, the most recent first
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
}

#[derive(Subcommand)]
pub(crate) enum RunsCommand {
    /// Start a run of an agent
    Start {
        /// The agent's name
        agent: String,
        /// What the user asks the agent, the first message of the conversation
        #[arg(long)]
        input: String,
        /// Whom the run is for, when the key speaks for others [default: the key's principal]
        #[arg(long)]
        requested_by: Option<String>,
        /// Metadata for the run's policies, a JSON object
        #[arg(long)]
        metadata: Option<String>,
        /// A retry with the same key returns the same run instead of starting another
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// A run's status, answer or error
    Get {
        /// The run's id
        run: String,
    },
    /// Ask a run to stop
    Cancel {
        /// The run's id
        run: String,
        /// Why, for the audit trail and the people watching
        #[arg(long)]
        reason: Option<String>,
    },
}

#[derive(Args)]
pub(crate) struct PendingArgs {
    /// Only this agent's calls
    #[arg(long)]
    pub agent: Option<String>,
    /// Only calls of this tool
    #[arg(long)]
    pub tool: Option<String>,
    /// Only calls of runs this person asked for
    #[arg(long, value_name = "WHO")]
    pub requested_by: Option<String>,
    /// Only calls whose input meets this CEL condition, e.g. 'input.amount < 50'
    #[arg(long = "where", value_name = "CEL")]
    pub condition: Option<String>,
}

/// One call, and what it was shown as.
#[derive(Args)]
pub(crate) struct Shown {
    /// The run's id
    pub run: String,
    /// The call's id, as `countersign show RUN` lists it
    pub call: String,
    /// The digest `countersign show RUN` displayed for the call (required: a decision is bound
    /// to what you saw, so a call that changed since is refused)
    #[arg(long)]
    pub digest: Option<String>,
}

/// The call a decision is about, and who decides.
#[derive(Args)]
pub(crate) struct Decide {
    #[command(flatten)]
    pub shown: Shown,
    /// The person deciding, when the key may speak for others
    #[arg(long)]
    pub decided_by: Option<String>,
}

/// The call an approval or rejection is about, or a listing of calls to decide each.
#[derive(Args)]
pub(crate) struct Chosen {
    #[command(flatten)]
    pub shown: Option<Shown>,
    /// Decide each call of this `countersign pending --json` output (a file, or - for standard
    /// input), quoting the digest it lists for the call
    #[arg(
        long,
        value_name = "FILE|-",
        conflicts_with = "Shown",
        required_unless_present = "Shown"
    )]
    pub from: Option<String>,
    /// The person deciding, when the key may speak for others
    #[arg(long)]
    pub decided_by: Option<String>,
}

#[derive(Args)]
pub(crate) struct EditArgs {
    #[command(flatten)]
    pub call: Decide,
    /// The whole new input, as JSON
    #[arg(long, conflicts_with = "set")]
    pub input: Option<String>,
    /// Change one field of the input shown: FIELD=VALUE, VALUE read as JSON if it parses
    /// (`amount=20`), else as text (`order_id=A-1001`); repeatable
    #[arg(long, value_name = "FIELD=VALUE")]
    pub set: Vec<String>,
    /// What changed and why (required): the agent is told
    #[arg(long)]
    pub note: Option<String>,
}

#[derive(Args)]
pub(crate) struct GrantArgs {
    /// The call, or a listing of exactly one call (`--from`)
    #[command(flatten)]
    pub call: Chosen,
    /// The calls it covers: a CEL condition on their input that this call meets, e.g.
    /// 'input.amount <= 50.0'
    #[arg(long = "when", value_name = "CEL")]
    pub condition: String,
    /// How many later calls it may approve
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub uses: u32,
    /// How long it lasts: 90s, 30m, 8h, 7d
    #[arg(long = "for", value_name = "SPAN")]
    pub expires_in: Span,
    /// Only calls of runs requested by whoever requested this one
    #[arg(long)]
    pub same_requester: bool,
    /// A cap on what the calls it approves add up to: what each adds, in CEL (e.g.
    /// 'input.amount'); with --max-total
    #[arg(long, value_name = "CEL", requires = "max_total")]
    pub total_of: Option<String>,
    /// The most the calls it approves may add up to; with --total-of
    #[arg(long, value_name = "N", requires = "total_of")]
    pub max_total: Option<f64>,
}

#[derive(Args)]
pub(crate) struct GrantsArgs {
    /// One grant's id: its terms and every call it approved
    pub grant: Option<String>,
    /// Only grants that still approve calls
    #[arg(long, conflicts_with = "grant")]
    pub active: bool,
    /// Only this agent's grants
    #[arg(long, conflicts_with = "grant")]
    pub agent: Option<String>,
    /// Only grants on this tool
    #[arg(long, conflicts_with = "grant")]
    pub tool: Option<String>,
}

#[derive(Args)]
pub(crate) struct WatchArgs {
    /// Follow only this run, live (the model's text as it is written), and stop when it ends
    #[arg(long)]
    pub run: Option<String>,
    /// How often to ask the gateway (with --run: to try again while it is away), in
    /// milliseconds
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..))]
    pub interval_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every usage line, the top one's and each subcommand's, as `--help` and a usage error
    /// print it.
    fn usages(command: &mut clap::Command, out: &mut Vec<String>) {
        out.push(command.render_usage().to_string());
        for sub in command.get_subcommands_mut() {
            usages(sub, out);
        }
    }

    #[test]
    fn the_grammar_is_consistent() {
        Cli::command().debug_assert();
    }

    /// The gateway and the key can come from the environment or the config file, so no usage
    /// line may say they must be typed (they once did, as required flags).
    #[test]
    fn no_usage_line_asks_for_the_url_or_the_api_key() {
        let mut cli = Cli::command();
        cli.build();
        let mut lines = Vec::new();
        usages(&mut cli, &mut lines);
        assert!(lines.len() > 10, "{lines:?}");
        for line in &lines {
            assert!(
                !line.contains("--url") && !line.contains("--api-key"),
                "{line}"
            );
        }
        for global in ["url", "api_key"] {
            let arg = cli.get_arguments().find(|a| a.get_id() == global).unwrap();
            assert!(!arg.is_required_set(), "--{global} is required");
        }
        assert!(Cli::try_parse_from(["countersign", "pending"]).is_ok());
    }
}

#[derive(Args)]
pub(crate) struct DelegateArgs {
    /// The person who may decide in your place
    pub to: String,
    /// For how long from now (`8h`, `14d`; at most 90 days)
    #[arg(long = "for", value_name = "SPAN")]
    pub lasts: String,
    /// Why, for the record
    #[arg(long)]
    pub reason: Option<String>,
    /// Whose approvals (an admin may hand anyone's); default yours
    #[arg(long, value_name = "WHO")]
    pub from: Option<String>,
    /// The person making it, when the key may speak for others
    #[arg(long, value_name = "WHO")]
    pub by: Option<String>,
}

#[derive(Args)]
pub(crate) struct DelegationsArgs {
    /// One delegation's id: its terms and every call decided under it
    pub delegation: Option<String>,
    /// Only delegations standing now
    #[arg(long, conflicts_with = "delegation")]
    pub active: bool,
    /// Whose delegations, when the key may speak for others
    #[arg(long, value_name = "WHO", conflicts_with = "delegation")]
    pub person: Option<String>,
}
