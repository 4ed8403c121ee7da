//! A span of time as people write it in configuration and requests: `90s`, `30m`, `24h` or
//! `7d`.

use serde::{Deserialize, Serialize};

/// A span of time written `90s`, `30m`, `24h` or `7d`, parsed once, when the agent is loaded
/// (a bad one refuses the file); it is written back as it was given.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    text: String,
    /// The span as a duration.
    pub duration: std::time::Duration,
}

impl Serialize for Span {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

impl std::str::FromStr for Span {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let duration = parse_duration(text)
            .ok_or_else(|| format!("{text:?} is not like 90s, 30m, 24h or 7d"))?;
        Ok(Self {
            text: text.to_string(),
            duration,
        })
    }
}

impl Span {
    /// `secs` (more than none) as people write it: in days, hours or minutes where it
    /// divides, else in seconds (`1800` is `30m`).
    pub fn of_secs(secs: u64) -> Self {
        let text = match secs {
            s if s % 86_400 == 0 => format!("{}d", s / 86_400),
            s if s % 3_600 == 0 => format!("{}h", s / 3_600),
            s if s % 60 == 0 => format!("{}m", s / 60),
            s => format!("{s}s"),
        };
        Self {
            text,
            duration: std::time::Duration::from_secs(secs),
        }
    }
}

impl std::fmt::Display for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// Parses `90s`, `30m`, `24h` or `7d`.
fn parse_duration(text: &str) -> Option<std::time::Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().ok()?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86400,
        _ => return None,
    };
    (secs > 0).then(|| std::time::Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_people_write_them() {
        assert_eq!(
            parse_duration("90s"),
            Some(std::time::Duration::from_secs(90))
        );
        assert_eq!(
            parse_duration("24h"),
            Some(std::time::Duration::from_secs(86400))
        );
        assert_eq!(
            parse_duration("7d"),
            Some(std::time::Duration::from_secs(604800))
        );
        assert_eq!(parse_duration("0s"), None);
        assert_eq!(parse_duration("10 years"), None);
    }
}
