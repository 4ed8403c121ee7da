//! The run document as stored in the run hash's `doc` field: the [`Run`] as JSON, compressed
//! with LZ4 behind a one-byte tag. LZ4 halves a refund run's document (1,534 B of JSON to
//! 820) for about 1.5 µs to write and 0.3 µs to read; deflate would save a little more
//! but cost about 110 µs a write (`BENCHMARKS.md`, "A compact run document").
//!
//! A document stored before the tag existed is plain JSON, which starts with `{`, never
//! with the tag, so it still reads.

use crate::StoreError;
use countersign_model::run::Run;
use std::borrow::Cow;

/// The tag of a document compressed with LZ4 (block format, its length before it).
const LZ4: u8 = 1;

/// The run as its document is stored.
pub(crate) fn encode(run: &Run) -> Result<Vec<u8>, StoreError> {
    let json = serde_json::to_vec(run).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let mut stored = Vec::with_capacity(json.len() / 2 + 8);
    stored.push(LZ4);
    stored.extend_from_slice(&lz4_flex::compress_prepend_size(&json));
    Ok(stored)
}

/// The run a stored document holds, compressed or not.
pub(crate) fn decode(stored: &[u8]) -> Result<Run, StoreError> {
    let corrupt = |e: &dyn std::fmt::Display| StoreError::Corrupt(format!("run document: {e}"));
    let json: Cow<[u8]> = match stored.split_first() {
        Some((&LZ4, packed)) => {
            Cow::Owned(lz4_flex::decompress_size_prepended(packed).map_err(|e| corrupt(&e))?)
        }
        Some((b'{', _)) => Cow::Borrowed(stored),
        _ => return Err(corrupt(&"neither JSON nor tagged")),
    };
    serde_json::from_slice(&json).map_err(|e| corrupt(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use countersign_model::run::RunId;
    use serde_json::json;

    fn run() -> Run {
        Run::new(
            RunId::new(),
            "refunds".into(),
            "v1".into(),
            "Order A-1001 arrived broken. Please refund it.".into(),
            Some("support-desk".into()),
            json!({"ticket": "T-9"}),
        )
    }

    #[test]
    fn a_document_reads_back_as_it_was_written_and_smaller() {
        let run = run();
        let stored = encode(&run).unwrap();
        assert_eq!(stored[0], LZ4);
        assert_eq!(decode(&stored).unwrap(), run);
        let plain = serde_json::to_vec(&run).unwrap();
        assert!(
            stored.len() < plain.len(),
            "{} >= {}",
            stored.len(),
            plain.len()
        );
    }

    #[test]
    fn a_document_stored_as_plain_json_still_reads() {
        let run = run();
        let plain = serde_json::to_vec(&run).unwrap();
        assert_eq!(decode(&plain).unwrap(), run);
    }

    #[test]
    fn a_damaged_document_is_an_error_not_a_run() {
        let mut stored = encode(&run()).unwrap();
        let cut = stored.len() / 2;
        stored.truncate(cut);
        for bad in [&stored[..], b"", b"\x02abc", b"not json"] {
            let err = decode(bad).unwrap_err().to_string();
            assert!(err.contains("run document"), "{err}");
        }
    }
}
