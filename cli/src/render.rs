//! Plain-text output: aligned tables, moments and durations as people read them, and JSON
//! pretty-printed for `--json`.

use chrono::{DateTime, Utc};
use serde_json::Value;

/// A table with a header row, each column as wide as its widest cell, two spaces apart.
pub(crate) struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new(header: &[&str]) -> Self {
        Self {
            rows: vec![
                header
                    .iter()
                    .map(std::string::ToString::to_string)
                    .collect(),
            ],
        }
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rows.len() == 1
    }
}

impl std::fmt::Display for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let columns = self.rows[0].len();
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                let cell = |row: &Vec<String>| row.get(c).map_or(0, |s| s.chars().count());
                self.rows.iter().map(cell).max().unwrap_or(0)
            })
            .collect();
        for row in &self.rows {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                line.push_str(cell);
                if c + 1 < row.len() {
                    let pad = widths[c] - cell.chars().count() + 2;
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            writeln!(f, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

/// Labelled values, one a line, the values lined up; empty values are left out.
pub(crate) fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs
        .iter()
        .map(|(l, _)| l.chars().count())
        .max()
        .unwrap_or(0);
    pairs
        .iter()
        .filter(|(_, value)| !value.is_empty())
        .map(|(label, value)| format!("{label:width$}  {value}\n"))
        .collect()
}

/// Every line of `text` two spaces in (and each line ending in a newline).
pub(crate) fn indent(text: &str) -> String {
    text.lines().map(|line| format!("  {line}\n")).collect()
}

/// `text` on one line and at most `max` characters, cut with an ellipsis.
pub(crate) fn clip(text: &str, max: usize) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= max {
        return line;
    }
    let mut cut: String = line.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// Milliseconds since the epoch as `2026-12-01 03:50:12 UTC`.
pub(crate) fn moment(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|| ms.to_string())
}

/// An RFC 3339 moment from the API, in milliseconds since the epoch.
pub(crate) fn parse_moment(text: &str) -> Option<i64> {
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.timestamp_millis())
}

/// How long until `deadline` (ms): `3h 20m left`, or `expired` once it has passed.
pub(crate) fn time_left(deadline: i64) -> String {
    let left = deadline - countersign_model::now_ms();
    if left <= 0 {
        "expired".to_string()
    } else {
        format!("{} left", span(left))
    }
}

/// How long something has waited since `since` (ms): `waiting 12m 5s`.
pub(crate) fn waiting(since: i64) -> String {
    format!(
        "waiting {}",
        span((countersign_model::now_ms() - since).max(0))
    )
}

/// A duration in ms at the two coarsest units that matter: `2d 3h`, `3h 20m`, `4m 10s`, `9s`.
fn span(ms: i64) -> String {
    let secs = ms / 1000;
    let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s}s"),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{d}d {h}h"),
    }
}

/// The gateway's JSON for `--json`, indented.
pub(crate) fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).expect("JSON values print")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_whatever_the_cells_hold() {
        let mut table = Table::new(&["A", "B", "C"]);
        table.row(vec!["long cell".into(), "é".into(), "x".into()]);
        table.row(vec!["s".into(), "bb".into(), String::new()]);
        assert_eq!(
            table.to_string(),
            "A          B   C\nlong cell  é   x\ns          bb\n"
        );
    }

    #[test]
    fn long_text_is_cut_on_one_line() {
        assert_eq!(clip("a\nb  c", 10), "a b c");
        assert_eq!(clip("abcdefghij", 5), "abcd…");
    }

    #[test]
    fn spans_show_their_two_coarsest_units() {
        assert_eq!(span(9_500), "9s");
        assert_eq!(span(250_000), "4m 10s");
        assert_eq!(span(12_000_000), "3h 20m");
        assert_eq!(span(183_600_000), "2d 3h");
    }
}
