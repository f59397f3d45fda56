//! The run's transcript: every step, with the keys it touched, so a failure can show the steps
//! that led to it (those on its keys, and the disturbances between them).

use std::fmt::Write as _;
use std::time::Instant;

/// One step of the run.
struct Entry {
    step: usize,
    at_ms: u128,
    keys: Vec<String>,
    text: String,
}

/// Every step of the run.
pub struct Journal {
    start: Instant,
    entries: Vec<Entry>,
}

impl Default for Journal {
    fn default() -> Self {
        Self { start: Instant::now(), entries: Vec::new() }
    }
}

impl Journal {
    /// Notes step `step` touching `keys` (`server/key`; none: a disturbance of everything).
    pub fn note(&mut self, step: usize, keys: &[String], text: String) {
        let at_ms = self.start.elapsed().as_millis();
        self.entries.push(Entry { step, at_ms, keys: keys.to_vec(), text });
    }

    fn line(e: &Entry) -> String {
        format!("#{:<5} {:>7} ms  {}", e.step, e.at_ms, e.text)
    }

    /// The last `max` steps that touched one of `keys`, or everything (a kill, a stall).
    #[must_use]
    pub fn excerpt(&self, keys: &[String], max: usize) -> String {
        let wanted: Vec<&Entry> = self
            .entries
            .iter()
            .filter(|e| e.keys.is_empty() || e.keys.iter().any(|k| keys.contains(k)))
            .collect();
        let skip = wanted.len().saturating_sub(max);
        let mut out = String::new();
        if skip > 0 {
            let _ = writeln!(out, "  ... {skip} earlier step(s) left out");
        }
        for e in &wanted[skip..] {
            let _ = writeln!(out, "  {}", Self::line(e));
        }
        out
    }

    /// Every step, one per line.
    #[must_use]
    pub fn all(&self) -> String {
        self.entries.iter().map(|e| Self::line(e) + "\n").collect()
    }
}
