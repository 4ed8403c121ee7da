//! A secret from the configuration (an API key, a bot token, a password): it prints as
//! `<redacted>`, so no `Debug` of a config or log line can show it by accident; the code that
//! needs the value asks for it by name.

use serde::Deserialize;
use std::fmt;

/// A secret from the configuration; prints as `<redacted>`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// The value itself, for the code that must send it; never to be logged.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Self(s.to_string())
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Self(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_never_prints() {
        let s = Secret::from("xoxb-123");
        assert_eq!(format!("{s:?}"), "<redacted>");
        assert_eq!(s.expose(), "xoxb-123");
    }
}
