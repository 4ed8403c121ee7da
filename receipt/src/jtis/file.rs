//! [`JtiStore`] in a file, for a tool on one host that must remember the receipts it ran across
//! restarts. The file is append-only JSON lines, one per first use: `{"jti", "key", "until"}`.
//! A use is answered [`Seen::First`] only once its line is written and flushed to disk
//! (`fsync`), so a tool that crashes after running a receipt finds it on its next start; a
//! line half written by a crash is a use that was never answered, and is dropped. Opening
//! the file reads it all into memory and, when some lines have expired (or one is torn),
//! writes the rest to a new file that replaces it, so the file holds only receipts that may
//! still verify. One process only: two processes appending to one file do not see each
//! other's uses (use `RedisJtis` for several).

use super::{JtiStore, JtiStoreError, Remembered, Seen};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// One line of the file.
#[derive(Serialize, Deserialize)]
struct Line {
    jti: String,
    /// The first request's `Idempotency-Key`.
    key: String,
    /// When the receipt stops verifying, in seconds since the epoch.
    until: i64,
}

/// [`JtiStore`] in an append-only file, `fsync`ed on each first use.
pub struct FileJtis(Arc<Mutex<Store>>);

struct Store {
    file: File,
    remembered: Remembered,
    /// A failed write could not be taken back: the file may end in a torn line, after which
    /// no line is appended (it would be unreadable); the store answers errors until reopened.
    broken: bool,
}

impl FileJtis {
    /// Opens the jti file at `path`, creating it (not its folder) if missing, with every
    /// receipt it records as used still counted.
    pub fn open(path: impl AsRef<Path>) -> std::io::Result<Self> {
        let path = path.as_ref();
        let now = jsonwebtoken::get_current_timestamp() as i64;
        let mut lines = Vec::new();
        let mut dropped = false;
        match File::open(path) {
            Ok(file) => {
                let mut reader = BufReader::new(file);
                let mut text = String::new();
                let mut number = 0;
                while reader.read_line(&mut text)? > 0 {
                    number += 1;
                    let parsed = serde_json::from_str::<Line>(text.trim_end());
                    match parsed {
                        Ok(line) if text.ends_with('\n') && line.until >= now => lines.push(line),
                        // Expired, or torn by a crash while it was written (then it is the
                        // last line, and its use was never answered).
                        Ok(_) => dropped = true,
                        Err(_) if !text.ends_with('\n') => dropped = true,
                        Err(e) => {
                            return Err(std::io::Error::new(
                                std::io::ErrorKind::InvalidData,
                                format!("{} line {number}: {e}", path.display()),
                            ));
                        }
                    }
                    text.clear();
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        if dropped {
            rewrite(path, &lines)?;
        }
        let mut remembered = Remembered::default();
        for line in &lines {
            remembered.record(&line.jti, &line.key, line.until);
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        if let Some(folder) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            // The file's name itself must survive a crash.
            File::open(folder)?.sync_all()?;
        }
        Ok(Self(Arc::new(Mutex::new(Store {
            file,
            remembered,
            broken: false,
        }))))
    }
}

/// Replaces the file at `path` with `lines`, atomically: a crash leaves the old file or the
/// new one.
fn rewrite(path: &Path, lines: &[Line]) -> std::io::Result<()> {
    let mut fresh = PathBuf::from(path);
    fresh.as_mut_os_string().push(".new");
    let mut file = File::create(&fresh)?;
    for line in lines {
        file.write_all(&to_line(line))?;
    }
    file.sync_all()?;
    std::fs::rename(&fresh, path)
}

fn to_line(line: &Line) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(line).expect("a line serializes");
    bytes.push(b'\n');
    bytes
}

impl JtiStore for FileJtis {
    async fn first_use(
        &self,
        jti: &str,
        idempotency_key: &str,
        until: i64,
    ) -> Result<Seen, JtiStoreError> {
        let store = self.0.clone();
        let line = Line {
            jti: jti.to_string(),
            key: idempotency_key.to_string(),
            until,
        };
        // Writing and syncing block: off the async workers.
        tokio::task::spawn_blocking(move || {
            let mut store = store.lock().expect("lock poisoned");
            store
                .remembered
                .forget_before(jsonwebtoken::get_current_timestamp() as i64);
            if let Some(seen) = store.remembered.seen(&line.jti, &line.key) {
                return Ok(seen);
            }
            if store.broken {
                return Err(JtiStoreError(
                    "an earlier write to the jti file failed; reopen it".into(),
                ));
            }
            // Recorded in memory only once it is on disk: a use whose line may be lost is
            // never answered `First`.
            let before = store
                .file
                .metadata()
                .map_err(|e| JtiStoreError(e.into()))?
                .len();
            let written = store
                .file
                .write_all(&to_line(&line))
                .and_then(|()| store.file.sync_data());
            if let Err(e) = written {
                // Take back what part of the line was written, so the next one starts clean.
                store.broken = store
                    .file
                    .set_len(before)
                    .and_then(|()| store.file.sync_data())
                    .is_err();
                return Err(JtiStoreError(e.into()));
            }
            store.remembered.record(&line.jti, &line.key, line.until);
            Ok(Seen::First)
        })
        .await
        .map_err(|e| JtiStoreError(e.into()))?
    }
}
