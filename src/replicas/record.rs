//! The record of having had replicas across restarts: [`STATE_FILE`] in the server's working
//! directory, with the count of replicas online at the master's last look; kept in step by
//! [`keep_record`] (found, written, recounted, deleted), read at load by [`recall`].

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::guard::{FILE_COUNTS, HEALTH, SEEN_LIVE};
use super::health::Health;

/// The file, in the server's working directory, that says this server has had replicas as a
/// master (the auto rule's memory across restarts).
pub const STATE_FILE: &str = "rlock-had-replicas";

/// What [`STATE_FILE`] says, for the file's readers, before its count line ([`state_text`]).
const STATE_TEXT: &str = "This Redis server, as a master, has had replicas. After a restart, the \
                          rlock module's replica guard grants nothing for rlock.replica-max-lag + \
                          1.5 s, nor until as many replicas as the line below counts (online \
                          before the restart) are in sync again (rlock.min-replicas 0 turns the \
                          guard off).\nDelete this file to run it standalone again.\n";

/// The line of [`STATE_FILE`] that counts the replicas online at the master's last look.
const COUNT_PREFIX: &str = "replicas ";

/// The text of [`STATE_FILE`] recording `count` replicas.
#[must_use]
pub fn state_text(count: u32) -> String {
    format!("{STATE_TEXT}{COUNT_PREFIX}{count}\n")
}

/// The count [`STATE_FILE`]'s text records: 1 when it has none (written by an older version,
/// or planted), as a file alone always meant one replica.
#[must_use]
pub fn parse_count(text: &str) -> u32 {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(COUNT_PREFIX)?.trim().parse::<u32>().ok())
        .unwrap_or(1)
        .max(1)
}

/// Where [`STATE_FILE`] stands, as the module last saw it.
#[derive(Debug, Default)]
struct Record {
    /// The working directory the file was last found or written in (`None`: not known there).
    dir: Option<PathBuf>,
    /// The count the file in `dir` holds (`None`: not read yet).
    count: Option<u32>,
    /// A write failed in this directory (logged once; tried again at each look, once a second).
    failed_in: Option<PathBuf>,
    /// When the file was last looked at (Unix ms; 0: never).
    looked_at: i64,
}

thread_local! {
    static RECORD: RefCell<Record> = RefCell::new(Record::default());
}

/// How often [`keep_record`] looks at the file (ms).
const LOOK_EVERY_MS: i64 = 1_000;

/// What [`keep_record`] did, for the log.
#[derive(Debug)]
pub enum RecordNews {
    Nothing,
    /// The file was written (first replica online, or a new `dir`), with this count.
    Written(PathBuf, u32),
    /// The file's count changed (replicas came or went).
    Counted(PathBuf, u32),
    /// It could not be written: a restart will not remember the replicas.
    WriteFailed(PathBuf, std::io::Error),
    /// It was found at run time (planted, or in a new `dir`): grants now need that many
    /// replicas.
    Found(PathBuf, u32),
    /// It was deleted at run time: the server runs standalone until a replica is online.
    Deleted(PathBuf),
}

/// The file at `dir`.
fn file_in(dir: &Path) -> PathBuf {
    dir.join(STATE_FILE)
}

/// The count of the file in the working directory (1 if unreadable: it exists).
fn read_count() -> u32 {
    std::fs::read_to_string(STATE_FILE).map_or(1, |text| parse_count(&text))
}

/// Writes the file in the working directory whole or not at all (a temporary file renamed over
/// it): a crash mid-write leaves the old count, never a truncated file.
fn write_count(count: u32) -> std::io::Result<()> {
    let tmp = format!("{STATE_FILE}.tmp");
    std::fs::write(&tmp, state_text(count))?;
    std::fs::rename(&tmp, STATE_FILE)
}

/// Keeps [`STATE_FILE`] in step (a master's cron): at most once a second, or at once when a
/// replica has been seen and the file is not known written or counts fewer replicas than are
/// online, it looks at the file in the working directory: written there if this master has had
/// replicas and it is missing from a directory it was never known in (a first replica, `CONFIG
/// SET dir`), rewritten when its count differs from [`Health::to_record`]; found there, it
/// counts (see the module docs); gone from the directory it was known in, it was deleted: the
/// master forgets its replicas. Costs one `stat` (and rarely a write) a second.
pub fn keep_record(now: i64) -> RecordNews {
    let health = HEALTH.get();
    let due = RECORD.with(|r| {
        let r = r.borrow();
        let behind = r.count.is_some_and(|c| c < health.to_record());
        now.saturating_sub(r.looked_at) >= LOOK_EVERY_MS
            || (health.seen && (r.dir.is_none() || behind) && r.failed_in.is_none())
    });
    if !due {
        return RecordNews::Nothing;
    }
    let Ok(cwd) = std::env::current_dir() else { return RecordNews::Nothing };
    let present = Path::new(STATE_FILE).exists();
    RECORD.with(|r| {
        let mut r = r.borrow_mut();
        r.looked_at = now;
        if present {
            if r.dir.as_deref() != Some(cwd.as_path()) || r.count.is_none() {
                r.dir = Some(cwd.clone());
                r.count = Some(read_count());
            }
            let count = r.count.unwrap_or(1);
            if !health.seen && FILE_COUNTS.load(Ordering::Relaxed) {
                HEALTH.set(Health { seen: true, before_restart: count, ..health });
                return RecordNews::Found(file_in(&cwd), count);
            }
            if health.seen && count != health.to_record() {
                return write(&mut r, &cwd, health.to_record(), false);
            }
            RecordNews::Nothing
        } else if r.dir.as_deref() == Some(cwd.as_path()) {
            r.dir = None;
            r.count = None;
            r.failed_in = None;
            SEEN_LIVE.store(false, Ordering::Relaxed);
            HEALTH.set(Health { seen: false, before_restart: 0, ..health });
            RecordNews::Deleted(file_in(&cwd))
        } else if health.seen {
            write(&mut r, &cwd, health.to_record(), true)
        } else {
            RecordNews::Nothing
        }
    })
}

/// Writes the file with `count` in `cwd` (`first`: it was not there).
fn write(r: &mut Record, cwd: &Path, count: u32, first: bool) -> RecordNews {
    match write_count(count) {
        Ok(()) => {
            r.dir = Some(cwd.to_path_buf());
            r.count = Some(count);
            r.failed_in = None;
            if first {
                RecordNews::Written(file_in(cwd), count)
            } else {
                RecordNews::Counted(file_in(cwd), count)
            }
        }
        Err(e) => {
            let new = r.failed_in.as_deref() != Some(cwd);
            r.failed_in = Some(cwd.to_path_buf());
            if new {
                RecordNews::WriteFailed(file_in(cwd), e)
            } else {
                RecordNews::Nothing
            }
        }
    }
}

/// The log line for [`STATE_FILE`] found at `path` (at load or at run time), counting `count`
/// replicas.
#[must_use]
pub fn found_message(path: &Path, count: u32) -> String {
    format!(
        "rlock: found {}: this master has had {count} replica(s) online: it grants nothing \
         until {count} are in sync again (and, after a restart, not for rlock.replica-max-lag + \
         1.5 s); delete the file, or set rlock.min-replicas 0, to run it standalone",
        path.display()
    )
}

/// Where [`STATE_FILE`] was last found or written (`INFO rlock`); `None`: nowhere known.
#[must_use]
pub fn record_path() -> Option<PathBuf> {
    RECORD.with(|r| r.try_borrow().ok().and_then(|r| r.dir.as_deref().map(file_in)))
}

/// At load: a master that finds [`STATE_FILE`] has had replicas before its restart, as many
/// online as the file counts: it needs them back in sync before it grants, and (`restart`: at
/// the server's start, not a `MODULE LOAD` into a running server) starts in a quarantine at
/// its first check. Returns the file's path and count then, for the log.
pub fn recall(restart: bool) -> Option<(PathBuf, u32)> {
    if !Path::new(STATE_FILE).exists() {
        return None;
    }
    let cwd = std::env::current_dir().ok()?;
    let count = read_count();
    HEALTH.set(Health::restarted(count, restart));
    RECORD.with(|r| {
        let mut r = r.borrow_mut();
        r.dir = Some(cwd.clone());
        r.count = Some(count);
    });
    Some((file_in(&cwd), count))
}

/// At load: a reloaded module may find its old statics.
pub(super) fn reset() {
    RECORD.with(|r| *r.borrow_mut() = Record::default());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_files_count_reads_back_and_defaults_to_one() {
        for count in [1, 2, 7, 1000] {
            assert_eq!(parse_count(&state_text(count)), count);
        }
        assert_eq!(parse_count("planted"), 1, "no count line: one replica, as before");
        assert_eq!(parse_count(STATE_TEXT), 1, "an older version's file");
        assert_eq!(parse_count("replicas 0\n"), 1, "never below one");
        assert_eq!(parse_count("replicas x\n"), 1);
        assert!(state_text(3).starts_with(STATE_TEXT));
    }
}
