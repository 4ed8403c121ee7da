//! What can go wrong, each with its own exit code so scripts can tell a mistake in the command
//! from a refusal by the gateway from a gateway that cannot be reached.

use serde_json::Value;
use std::fmt;
use std::process::ExitCode;

#[derive(Debug)]
pub(crate) enum CliError {
    /// A check the command makes did not hold: a broken audit chain, a call that is not
    /// pending. Exit 1.
    Failed(String),
    /// The command or its configuration is wrong; nothing was sent. Exit 2 (clap's own usage
    /// errors exit 2 as well).
    Usage(String),
    /// The gateway answered with an error. Exit 3.
    Refused(Refusal),
    /// No answer from the gateway, or one that is not the gateway's. Exit 4.
    Unreachable(String),
}

/// The gateway's error answer, `{"error": {"code", "message", "details"?}}`.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub status: u16,
    pub code: String,
    pub message: String,
    pub details: Option<Value>,
    /// What to do about it, when the command knows better than the gateway.
    pub hint: Option<String>,
}

impl CliError {
    pub(crate) fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            Self::Failed(_) => 1,
            Self::Usage(_) => 2,
            Self::Refused(_) => 3,
            Self::Unreachable(_) => 4,
        })
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Failed(message) | Self::Usage(message) => f.write_str(message),
            Self::Unreachable(message) => write!(f, "could not talk to the gateway: {message}"),
            Self::Refused(refusal) => refusal.fmt(f),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({} {})", self.message, self.status, self.code)?;
        // A schema's complaints (422) are listed, one a line.
        let listed = self.details.as_ref().and_then(|d| d["errors"].as_array());
        for item in listed.into_iter().flatten() {
            match item.as_str() {
                Some(text) => write!(f, "\n  {text}")?,
                None => write!(f, "\n  {item}")?,
            }
        }
        if let Some(hint) = &self.hint {
            write!(f, "\n{hint}")?;
        }
        Ok(())
    }
}
