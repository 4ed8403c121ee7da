//! How moments are written in answers and pages.

/// Milliseconds since the epoch as RFC 3339, in UTC with milliseconds.
pub(crate) fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Milliseconds since the epoch as a person reads it: `2026-12-01 10:42 UTC`.
pub(crate) fn readable(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .format("%Y-%m-%d %H:%M UTC")
        .to_string()
}

/// How long until `deadline` (ms since the epoch) from `now`, roughly: `3 h 5 min left`.
pub(crate) fn time_left(deadline: i64, now: i64) -> String {
    if deadline <= now {
        return "past its deadline".to_string();
    }
    format!("{} left", span(deadline - now))
}

/// How long since `since` (ms since the epoch) at `now`, roughly: `waited 12 min`.
pub(crate) fn waited(since: i64, now: i64) -> String {
    format!("waited {}", span((now - since).max(0)))
}

/// A span of milliseconds, roughly: `less than a minute`, `25 min`, `2 h 5 min`, `3 days`.
fn span(ms: i64) -> String {
    match ms / 60_000 {
        0 => "less than a minute".to_string(),
        m if m < 60 => format!("{m} min"),
        m if m < 48 * 60 => format!("{} h {} min", m / 60, m % 60),
        m => format!("{} days", m / (24 * 60)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_left_reads_at_a_glance() {
        let min = 60_000;
        assert_eq!(time_left(0, 1), "past its deadline");
        assert_eq!(time_left(30_000, 0), "less than a minute left");
        assert_eq!(time_left(25 * min, 0), "25 min left");
        assert_eq!(time_left(125 * min, 0), "2 h 5 min left");
        assert_eq!(time_left(3 * 24 * 60 * min, 0), "3 days left");
        assert_eq!(waited(0, 12 * min), "waited 12 min");
    }
}
