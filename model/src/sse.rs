//! Server-sent events, read as the HTML standard's "Interpreting an event stream" says: the
//! model providers' streamed answers, and the gateway's own event stream read by the command
//! line and the tests. A decoder is fed the bytes as they arrive, split anywhere, and gives
//! back the events completed so far; no I/O.
//!
//! An event still open when the stream ends is never dispatched (the standard discards it),
//! so a reader that needs a last event (`message_stop`, `[DONE]`) can tell a stream that
//! was cut from one that finished.

/// One dispatched event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Its type: the last `event` field, `message` when there was none.
    pub event: String,
    /// Its `data` lines, joined with "\n".
    pub data: String,
    /// The stream's last event id when it was dispatched: it carries over to later events
    /// until another `id` field changes it.
    pub id: Option<String>,
}

/// Turns a stream's bytes into its events.
#[derive(Debug, Default)]
pub struct Decoder {
    /// The bytes of the line being received. Lines are split as bytes and decoded whole, so a
    /// UTF-8 character split between two pushes is decoded once both halves are in.
    line: Vec<u8>,
    /// The last byte seen was a CR: an LF right after it ends no second line.
    after_cr: bool,
    /// The first line has ended (only it may start with a byte order mark).
    past_first_line: bool,
    /// The data buffer: each `data` line and an LF.
    data: String,
    event_type: String,
    last_id: Option<String>,
}

const BOM: &[u8] = "\u{feff}".as_bytes();

impl Decoder {
    /// A decoder at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads `bytes`, the next part of the stream, and returns the events they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Event> {
        let mut events = Vec::new();
        for &byte in bytes {
            match byte {
                b'\n' if self.after_cr => self.after_cr = false,
                b'\r' | b'\n' => {
                    self.after_cr = byte == b'\r';
                    let line = std::mem::take(&mut self.line);
                    self.end_line(&line, &mut events);
                }
                _ => {
                    self.after_cr = false;
                    self.line.push(byte);
                }
            }
        }
        events
    }

    fn end_line(&mut self, line: &[u8], events: &mut Vec<Event>) {
        let first = !std::mem::replace(&mut self.past_first_line, true);
        let line = if first {
            line.strip_prefix(BOM).unwrap_or(line)
        } else {
            line
        };
        let line = String::from_utf8_lossy(line);
        if line.is_empty() {
            events.extend(self.dispatch());
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (&*line, ""),
        };
        match field {
            "event" => self.event_type = value.to_string(),
            "data" => {
                self.data.push_str(value);
                self.data.push('\n');
            }
            "id" if !value.contains('\0') => self.last_id = Some(value.to_string()),
            // `retry` is a reconnection delay; the callers decide themselves whether and when
            // to ask again. Other fields mean nothing.
            _ => {}
        }
    }

    /// The event a blank line ends, if it has data; either way a new event begins.
    fn dispatch(&mut self) -> Option<Event> {
        let event_type = std::mem::take(&mut self.event_type);
        let mut data = std::mem::take(&mut self.data);
        if data.is_empty() {
            return None;
        }
        data.pop();
        Some(Event {
            event: if event_type.is_empty() {
                "message".into()
            } else {
                event_type
            },
            data,
            id: self.last_id.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(event: &str, data: &str, id: Option<&str>) -> Event {
        Event {
            event: event.into(),
            data: data.into(),
            id: id.map(Into::into),
        }
    }

    /// Every rule at once: a BOM, the three line endings, comments, fields without a colon
    /// or a space, multi-line data, ids that carry over, an event without data, `retry`.
    const STREAM: &str = "\u{feff}: a comment first\r\n\
        event: start\r\n\
        data: {\"a\": 1}\r\n\
        id: 7\r\n\
        \r\n\
        data:first line\rdata:  second, after a space that stays\r\r\
        event: no data, so nothing\nretry: 1000\nid: 8\n\n\
        data\nunknown: field\n:data: a comment too\ndata: caf\u{e9} \u{20ac}\n\n\
        id: with\0nul\nevent: last\ndata: x\n\n\
        data: open when the stream ends";

    fn expected() -> Vec<Event> {
        vec![
            event("start", "{\"a\": 1}", Some("7")),
            event(
                "message",
                "first line\n second, after a space that stays",
                Some("7"),
            ),
            event("message", "\ncaf\u{e9} \u{20ac}", Some("8")),
            event("last", "x", Some("8")),
        ]
    }

    #[test]
    fn a_stream_decodes_per_the_standard() {
        assert_eq!(Decoder::new().push(STREAM.as_bytes()), expected());
    }

    #[test]
    fn a_stream_split_at_any_byte_decodes_the_same() {
        let bytes = STREAM.as_bytes();
        for at in 0..=bytes.len() {
            let mut decoder = Decoder::new();
            let mut events = decoder.push(&bytes[..at]);
            events.extend(decoder.push(&[]));
            events.extend(decoder.push(&bytes[at..]));
            assert_eq!(events, expected(), "split at byte {at}");
        }
        let mut decoder = Decoder::new();
        let events: Vec<Event> = bytes.iter().flat_map(|b| decoder.push(&[*b])).collect();
        assert_eq!(events, expected(), "one byte at a time");
    }

    #[test]
    fn a_cr_then_an_lf_in_the_next_push_end_one_line() {
        let mut decoder = Decoder::new();
        assert!(decoder.push(b"data: a\r").is_empty());
        assert!(decoder.push(b"\n").is_empty(), "CRLF is one line ending");
        assert_eq!(decoder.push(b"\r"), vec![event("message", "a", None)]);
    }

    #[test]
    fn only_a_bom_at_the_very_start_is_dropped() {
        let events = Decoder::new().push("data: \u{feff}x\n\n\u{feff}data: y\n\n".as_bytes());
        assert_eq!(events, vec![event("message", "\u{feff}x", None)]);
    }
}
