//! The report: sections of figures, the targets checked, printed and written as Markdown.

use std::fmt::Write as _;

pub struct Section {
    pub title: String,
    pub note: String,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Section {
    pub fn new(title: &str, note: &str, header: &[&str]) -> Self {
        Self {
            title: title.to_owned(),
            note: note.to_owned(),
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }
}

/// A target: `value` must be at most (or at least) `limit`.
pub struct Target {
    pub what: String,
    pub value: f64,
    pub limit: f64,
    pub at_most: bool,
}

impl Target {
    pub fn at_most(what: &str, value: f64, limit: f64) -> Self {
        Self { what: what.to_owned(), value, limit, at_most: true }
    }

    pub fn at_least(what: &str, value: f64, limit: f64) -> Self {
        Self { what: what.to_owned(), value, limit, at_most: false }
    }

    pub fn met(&self) -> bool {
        if self.at_most {
            self.value <= self.limit
        } else {
            self.value >= self.limit
        }
    }
}

#[derive(Default)]
pub struct Report {
    pub sections: Vec<Section>,
    pub targets: Vec<Target>,
}

impl Report {
    /// The targets as tab-separated lines: what, value, limit, `<=` or `>=`.
    pub fn targets_tsv(&self) -> String {
        self.targets
            .iter()
            .map(|t| {
                let op = if t.at_most { "<=" } else { ">=" };
                format!("{}\t{}\t{}\t{op}\n", t.what, t.value, t.limit)
            })
            .collect()
    }
}

/// A figure with 2 significant decimals, or 3 for small values.
pub fn num(v: f64) -> String {
    if v.is_nan() {
        "-".to_owned()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

pub fn ratio(a: f64, b: f64) -> String {
    if b == 0.0 || a.is_nan() || b.is_nan() {
        "-".to_owned()
    } else {
        format!("{:.2}x", a / b)
    }
}

impl Report {
    pub fn markdown(&self, machine: &str, mode: &str) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# rlock benchmarks\n");
        let _ = writeln!(
            out,
            "Written by `make bench` ({mode}). Every figure below comes from one run on the machine \
             described here; absolute numbers on a shared 2-core machine are noisy, so the results \
             are the ratios against the baselines measured in the same run.\n"
        );
        let _ = writeln!(out, "## Machine\n\n{machine}\n");
        let _ = writeln!(out, "## Targets\n");
        let _ = writeln!(out, "| target | measured | limit | met |\n|---|---|---|---|");
        for t in &self.targets {
            let op = if t.at_most { "≤" } else { "≥" };
            let _ = writeln!(
                out,
                "| {} | {} | {op} {} | {} |",
                t.what,
                num(t.value),
                num(t.limit),
                if t.met() { "yes" } else { "**no**" }
            );
        }
        for s in &self.sections {
            let _ = writeln!(out, "\n## {}\n\n{}\n", s.title, s.note);
            let _ = writeln!(out, "| {} |", s.header.join(" | "));
            let _ = writeln!(out, "|{}", "---|".repeat(s.header.len()));
            for r in &s.rows {
                let _ = writeln!(out, "| {} |", r.join(" | "));
            }
        }
        out
    }

    pub fn text(&self) -> String {
        let mut out = String::new();
        for s in &self.sections {
            let _ = writeln!(out, "\n== {}", s.title);
            let mut widths: Vec<usize> = s.header.iter().map(String::len).collect();
            for r in &s.rows {
                for (w, c) in widths.iter_mut().zip(r) {
                    *w = (*w).max(c.chars().count());
                }
            }
            let line = |cells: &[String]| {
                cells
                    .iter()
                    .zip(&widths)
                    .map(|(c, w)| format!("{c:<w$}"))
                    .collect::<Vec<_>>()
                    .join("  ")
            };
            let _ = writeln!(out, "{}", line(&s.header));
            for r in &s.rows {
                let _ = writeln!(out, "{}", line(r));
            }
        }
        let _ = writeln!(out, "\n== Targets");
        for t in &self.targets {
            let op = if t.at_most { "<=" } else { ">=" };
            let _ = writeln!(
                out,
                "{:<4} {}: {} ({op} {})",
                if t.met() { "ok" } else { "MISS" },
                t.what,
                num(t.value),
                num(t.limit)
            );
        }
        out
    }
}
