//! Where the gateway is and which key to use: a flag, else its environment variable (clap
//! reads both), else the config file, else the default URL. The file is TOML:
//!
//! ```toml
//! url = "https://countersign.example.com"
//! api_key = "..."
//! ```

use crate::args::Global;
use crate::error::CliError;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The gateway the local runner and a default gateway listen on.
pub(crate) const DEFAULT_URL: &str = "http://127.0.0.1:8080";

pub(crate) struct Config {
    pub url: String,
    pub api_key: String,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    url: Option<String>,
    api_key: Option<String>,
}

impl Config {
    pub(crate) fn resolve(global: &Global) -> Result<Self, CliError> {
        let file = match &global.config {
            Some(path) => read(path)?,
            None => match default_path().filter(|p| p.exists()) {
                Some(path) => read(&path)?,
                None => File::default(),
            },
        };
        // An empty value, such as `COUNTERSIGN_API_KEY=`, counts as none.
        let given = |value: &Option<String>| value.clone().filter(|v| !v.is_empty());
        let url = given(&global.url)
            .or(file.url)
            .unwrap_or_else(|| DEFAULT_URL.to_string());
        let api_key = given(&global.api_key).or(file.api_key).ok_or_else(|| {
            CliError::Usage(
                "no API key: set COUNTERSIGN_API_KEY, pass --api-key, or put `api_key = \"...\"` \
                 in the config file (~/.config/countersign/config.toml or --config PATH)"
                    .into(),
            )
        })?;
        Ok(Self { url, api_key })
    }
}

/// `$XDG_CONFIG_HOME/countersign/config.toml`, else `~/.config/countersign/config.toml`.
fn default_path() -> Option<PathBuf> {
    let non_empty = |var| std::env::var_os(var).filter(|v| !v.is_empty());
    let base = non_empty("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| non_empty("HOME").map(|home| PathBuf::from(home).join(".config")))?;
    Some(base.join("countersign").join("config.toml"))
}

fn read(path: &Path) -> Result<File, CliError> {
    let bad = |why: String| CliError::Usage(format!("config file {}: {why}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    toml::from_str(&text).map_err(|e| bad(e.message().to_string()))
}
