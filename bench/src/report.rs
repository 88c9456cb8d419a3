//! The results table: an aligned text table for the terminal, or (`--markdown`) a markdown table with the
//! machine, date and command, ready to paste into docs/BENCHMARKS.md.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::workloads::{Outcome, Results};

pub struct Row {
    /// "1. sequential read, 1 x 1024 MiB"
    pub title: String,
    /// Axis label of the chart: "1 seq read"
    pub short: &'static str,
    pub unit: &'static str,
    /// The raw-SDK figure; None where there is no limit (first byte).
    pub limit: Option<f64>,
    /// One per client, in `Report::clients` order.
    pub cells: Vec<Outcome>,
    pub notes: String,
}

impl Row {
    /// Client `i`'s figure as a fraction of the limit.
    pub fn ratio(&self, i: usize) -> Option<f64> {
        match (&self.cells[i], self.limit) {
            (Outcome::Value(v), Some(limit)) if limit > 0.0 => Some(v / limit),
            _ => None,
        }
    }
}

pub struct Report {
    /// "expressfs" first, then the peers.
    pub clients: Vec<&'static str>,
    pub rows: Vec<Row>,
    /// Lines printed before the table (latency profile, peer versions and options).
    pub preamble: Vec<String>,
}

/// What a workload is, for the table.
pub struct Spec {
    pub id: u8,
    pub title: String,
    pub short: &'static str,
    pub unit: &'static str,
    pub limit: Option<f64>,
}

impl Report {
    /// Puts each client's results under the workloads; a workload a client did not run shows "n/a".
    pub fn new(
        specs: Vec<Spec>,
        clients: Vec<(&'static str, Results)>,
        preamble: Vec<String>,
    ) -> Self {
        let rows = specs
            .into_iter()
            .map(|s| {
                let cells = clients
                    .iter()
                    .map(|(_, r)| {
                        r.get(&s.id)
                            .map_or(Outcome::Missing("n/a".into()), |c| c.outcome.clone())
                    })
                    .collect();
                let notes = clients
                    .iter()
                    .filter_map(|(name, r)| {
                        let note = r.get(&s.id)?.note.as_ref()?;
                        Some(format!("{name} {note}"))
                    })
                    .collect::<Vec<_>>()
                    .join("; ");
                Row {
                    title: s.title,
                    short: s.short,
                    unit: s.unit,
                    limit: s.limit,
                    cells,
                    notes,
                }
            })
            .collect();
        Report {
            clients: clients.iter().map(|(n, _)| *n).collect(),
            rows,
            preamble,
        }
    }

    fn header(&self) -> Vec<String> {
        let mut h = vec!["workload".into(), "unit".into(), "limit (raw SDK)".into()];
        for c in &self.clients {
            h.push(c.to_string());
            h.push("ratio".into());
        }
        h.push("notes".into());
        h
    }

    fn cells(&self, row: &Row) -> Vec<String> {
        let mut out = vec![
            row.title.clone(),
            row.unit.to_string(),
            row.limit.map_or("-".into(), number),
        ];
        for (i, cell) in row.cells.iter().enumerate() {
            out.push(match cell {
                Outcome::Value(v) => number(*v),
                Outcome::Missing(why) => why.clone(),
            });
            out.push(row.ratio(i).map_or("-".into(), |r| format!("{r:.2}")));
        }
        out.push(row.notes.clone());
        out
    }

    /// Columns aligned with spaces; numbers right-aligned.
    pub fn text(&self) -> String {
        let mut lines = vec![self.header()];
        lines.extend(self.rows.iter().map(|r| self.cells(r)));
        let columns = lines[0].len();
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                lines
                    .iter()
                    .map(|l| l[c].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = self.preamble.join("\n");
        out.push('\n');
        for line in &lines {
            let cells: Vec<String> = line
                .iter()
                .enumerate()
                .map(|(c, text)| {
                    let left = c < 2 || c == columns - 1;
                    if left {
                        format!("{text:<w$}", w = widths[c])
                    } else {
                        format!("{text:>w$}", w = widths[c])
                    }
                })
                .collect();
            out.push_str(cells.join("  ").trim_end());
            out.push('\n');
        }
        out
    }

    /// A markdown section body: machine, date and command, then the table.
    pub fn markdown(&self) -> String {
        let command: Vec<String> = std::env::args().collect();
        let mut out = format!(
            "Machine: {}. Date: {}. Command: `{}`.\n\n",
            machine(),
            today(),
            command.join(" ")
        );
        // One paragraph, a hard line break (trailing backslash) between lines.
        out.push_str(&self.preamble.join("\\\n"));
        out.push_str("\n\n");
        let header = self.header();
        out.push_str(&format!("| {} |\n", header.join(" | ")));
        let align: Vec<&str> = (0..header.len())
            .map(|c| {
                if c < 2 || c == header.len() - 1 {
                    "---"
                } else {
                    "---:"
                }
            })
            .collect();
        out.push_str(&format!("|{}|\n", align.join("|")));
        for row in &self.rows {
            out.push_str(&format!("| {} |\n", self.cells(row).join(" | ")));
        }
        out
    }
}

/// Three significant-ish digits: 1787, 42.3, 0.53.
fn number(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// "2 cores, 23 GiB RAM, Debian GNU/Linux 12 (bookworm), kernel 6.1.0".
pub fn machine() -> String {
    format!(
        "{} cores, {} GiB RAM, {}, kernel {}",
        cores(),
        ram_gib(),
        os_name(),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into())
    )
}

/// As `nproc` counts them (CPU affinity), falling back to what Rust sees.
fn cores() -> usize {
    std::process::Command::new("nproc")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(0, |n| n.get()))
}

fn ram_gib() -> u64 {
    let kib: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    (kib as f64 / (1024.0 * 1024.0)).round() as u64
}

fn os_name() -> String {
    std::fs::read_to_string("/etc/os-release")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_else(|| "Linux".into())
}

/// Today's date (UTC) as YYYY-MM-DD.
pub fn today() -> String {
    let days = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400);
    let (y, m, d) = civil_date(days as i64);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Days since 1970-01-01 to a proleptic Gregorian date (the usual era/day-of-era arithmetic: 400-year
/// eras of 146,097 days, years counted from March so the leap day falls at the end).
fn civil_date(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(civil_date(0), (1970, 1, 1));
        assert_eq!(civil_date(19_723), (2024, 1, 1));
        assert_eq!(civil_date(19_782), (2024, 2, 29));
        assert_eq!(civil_date(20_414), (2025, 11, 22));
    }

    #[test]
    fn numbers() {
        assert_eq!(number(1787.4), "1787");
        assert_eq!(number(42.34), "42.3");
        assert_eq!(number(0.534), "0.53");
    }
}
