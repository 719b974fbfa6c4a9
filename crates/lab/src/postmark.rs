//! small-files P6a: PostMark (NetApp's mail and web server model; Debian's `postmark` 1.51),
//! on the filesystem the runner makes on each target (benchmark-method.md §7.3 P6a).
//!
//! Owns: the PostMark command file ([`render_postmark_config`]), the parse of its verbose
//! report ([`parse_postmark`]), and [`PostmarkRun`], one target's run: one PostMark process per
//! filesystem (the raw members have one each, run side by side like fio's jobs over them),
//! with the lab's own clock around them all.
//!
//! Invariants: the command file is a pure function of its inputs and refuses a location
//! PostMark's whitespace-split commands would misread; a report missing any figure the table
//! shows is refused, never read as zero; the processes split the files and transactions so
//! the whole run does the shape's work, whatever the number of filesystems.
//!
//! Limits: PostMark times in whole seconds (`time(2)`), so its per-second figures are counts
//! over rounded seconds (a phase under a second counts as one); the lab's wall-clock rate over
//! the whole run (create, transactions, delete) is the figure ratios are taken on. PostMark
//! does not sync: with a working set that fits in memory it measures the filesystem and the
//! page cache more than the target, which the report says.

use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// P6a's settings (benchmark-method.md: full `number 100000`, `size 512 65536`,
/// `subdirectories 100`, `transactions 500000`, `read 4096`, `write 4096`, `buffering false`;
/// quick: 2000 files, 20000 transactions).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PostmarkShape {
    /// Files at the start (PostMark's `number`), split among the processes.
    pub files: u32,
    pub transactions: u32,
    pub size_min_bytes: u32,
    pub size_max_bytes: u32,
    pub subdirectories: u32,
    pub read_block_bytes: u32,
    pub write_block_bytes: u32,
    /// stdio buffering (`set buffering`); false: plain read(2) and write(2).
    pub buffered: bool,
    /// A run taking longer than this is stopped as wedged.
    pub time_limit_s: u32,
}

impl PostmarkShape {
    pub fn for_mode(quick: bool) -> Self {
        PostmarkShape {
            files: if quick { 2_000 } else { 100_000 },
            transactions: if quick { 20_000 } else { 500_000 },
            size_min_bytes: 512,
            size_max_bytes: 65_536,
            subdirectories: 100,
            read_block_bytes: 4096,
            write_block_bytes: 4096,
            buffered: false,
            time_limit_s: if quick { 900 } else { 4 * 3600 },
        }
    }

    /// The most bytes the files can hold at once (every file at the largest size): the room
    /// a run needs.
    pub fn space_bytes_max(&self) -> u64 {
        u64::from(self.files) * u64::from(self.size_max_bytes)
    }

    /// Process `index` of `processes`' share of the files and the transactions (the first
    /// ones take the remainders; every process gets at least one of each).
    pub fn share(&self, index: u32, processes: u32) -> (u32, u32) {
        let processes = processes.max(1);
        let part = |total: u32| {
            let extra = u32::from(index < total % processes);
            (total / processes + extra).max(1)
        };
        (part(self.files), part(self.transactions))
    }
}

/// Why a command file could not be made or a report could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PostmarkError {
    #[error("PostMark location {0:?} must be an absolute path without whitespace")]
    BadLocation(String),
    #[error("PostMark report: {0}")]
    BadReport(String),
}

/// PostMark's command file for process `index` of `processes`, working in `location`.
pub fn render_postmark_config(
    shape: &PostmarkShape,
    location: &str,
    index: u32,
    processes: u32,
    seed: u64,
) -> Result<String, PostmarkError> {
    // PostMark splits a command at whitespace: a path with a space would be cut short.
    if !location.starts_with('/') || location.chars().any(char::is_whitespace) {
        return Err(PostmarkError::BadLocation(location.to_string()));
    }
    let (files, transactions) = shape.share(index, processes);
    let mut out = String::new();
    let _ = writeln!(out, "set location {location}");
    let _ = writeln!(out, "set number {files}");
    let _ = writeln!(out, "set transactions {transactions}");
    let _ = writeln!(out, "set size {} {}", shape.size_min_bytes, shape.size_max_bytes);
    let _ = writeln!(out, "set subdirectories {}", shape.subdirectories);
    let _ = writeln!(out, "set read {}", shape.read_block_bytes);
    let _ = writeln!(out, "set write {}", shape.write_block_bytes);
    let _ = writeln!(out, "set buffering {}", shape.buffered);
    // PostMark's seed is a C int; each process its own, so they do not move in lockstep.
    let seed = (seed.wrapping_add(u64::from(index)) % i32::MAX as u64) as i32;
    let _ = writeln!(out, "set seed {seed}");
    out.push_str("set report verbose\nshow\nrun\nquit\n");
    Ok(out)
}

/// What one PostMark process reported: counts, its whole seconds, and its per-second
/// figures as it printed them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PostmarkOutput {
    pub total_seconds: u64,
    pub transaction_seconds: u64,
    pub transactions_per_s: f64,
    pub created: u64,
    pub created_per_s: f64,
    pub created_alone: u64,
    pub created_alone_per_s: f64,
    pub created_mixed: u64,
    pub created_mixed_per_s: f64,
    pub read: u64,
    pub read_per_s: f64,
    pub appended: u64,
    pub appended_per_s: f64,
    pub deleted: u64,
    pub deleted_per_s: f64,
    pub deleted_alone: u64,
    pub deleted_alone_per_s: f64,
    pub deleted_mixed: u64,
    pub deleted_mixed_per_s: f64,
    pub read_bytes: f64,
    pub read_bytes_per_s: f64,
    pub written_bytes: f64,
    pub written_bytes_per_s: f64,
}

/// `N (R per second)` or `X unit (Y unit per second)` at the end of a report line: the
/// count and the rate, in bytes where a unit is given.
fn count_and_rate(text: &str, what: &str) -> Result<(f64, f64), PostmarkError> {
    let bad = || PostmarkError::BadReport(format!("cannot read {what:?} from {text:?}"));
    let (count_part, rate_part) = text.split_once('(').ok_or_else(bad)?;
    let rate_part = rate_part.strip_suffix(')').ok_or_else(bad)?;
    let rate_part = rate_part.strip_suffix("per second").ok_or_else(bad)?;
    let value = |part: &str| -> Result<f64, PostmarkError> {
        let mut words = part.split_whitespace();
        let number: f64 = words.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        let scale = match words.next() {
            None => 1.0,
            Some("bytes") => 1.0,
            Some("kilobytes") => 1024.0,
            Some("megabytes") => 1024.0 * 1024.0,
            Some("gigabytes") => 1024.0 * 1024.0 * 1024.0,
            Some(_) => return Err(bad()),
        };
        if words.next().is_some() || !number.is_finite() || number < 0.0 {
            return Err(bad());
        }
        Ok(number * scale)
    };
    // The count part ends with the line's label ("created", "read", "files", ...).
    let count_words: Vec<&str> = count_part.split_whitespace().collect();
    let count_text = match count_words.as_slice() {
        [number, _label] => number.to_string(),
        [number, unit, _label] => format!("{number} {unit}"),
        _ => return Err(bad()),
    };
    Ok((value(&count_text)?, value(rate_part)?))
}

/// Read PostMark's verbose report (its standard output, configuration echo and progress
/// included).
pub fn parse_postmark(text: &str) -> Result<PostmarkOutput, PostmarkError> {
    #[derive(Clone, Copy, PartialEq)]
    enum Section {
        None,
        Time,
        Files,
        Data,
    }
    let mut section = Section::None;
    // Which top line the next "Mixed with transactions" belongs to.
    let mut mixed_of_deleted = false;
    let mut found = [None::<(f64, f64)>; 11];
    let mut total_seconds = None;
    let count = |v: f64| v as u64;
    for raw in text.lines() {
        let line = raw.trim();
        match line {
            "Time:" => section = Section::Time,
            "Files:" => section = Section::Files,
            "Data:" => section = Section::Data,
            _ => {}
        }
        let slot = match section {
            Section::Time => {
                if let Some(n) = line.strip_suffix(" seconds total") {
                    let n = n.parse::<u64>().map_err(|_| {
                        PostmarkError::BadReport(format!("total seconds in {line:?}"))
                    })?;
                    total_seconds = Some(n);
                    continue;
                }
                if let Some((n, rest)) = line.split_once(" seconds of transactions ") {
                    let (_, rate) = count_and_rate(&format!("0 x {rest}"), "transactions")?;
                    let n = n.parse::<f64>().map_err(|_| {
                        PostmarkError::BadReport(format!("transaction seconds in {line:?}"))
                    })?;
                    found[0] = Some((n, rate));
                }
                continue;
            }
            Section::Files => {
                let label = line.split('(').next().unwrap_or("");
                if label.ends_with(" created ") {
                    mixed_of_deleted = false;
                    1
                } else if label.starts_with("Creation alone:") {
                    2
                } else if label.starts_with("Mixed with transactions:") {
                    if mixed_of_deleted { 9 } else { 3 }
                } else if label.ends_with(" read ") {
                    4
                } else if label.ends_with(" appended ") {
                    5
                } else if label.ends_with(" deleted ") {
                    mixed_of_deleted = true;
                    6
                } else if label.starts_with("Deletion alone:") {
                    7
                } else {
                    continue;
                }
            }
            Section::Data => {
                let label = line.split('(').next().unwrap_or("");
                if label.ends_with(" read ") {
                    10
                } else if label.ends_with(" written ") {
                    8
                } else {
                    continue;
                }
            }
            Section::None => continue,
        };
        let body = line.split_once(':').map_or(line, |(_, rest)| rest.trim());
        let value = count_and_rate(body, line)?;
        if found[slot].replace(value).is_some() {
            return Err(PostmarkError::BadReport(format!("{line:?} given twice")));
        }
    }
    let names = [
        "seconds of transactions",
        "created",
        "creation alone",
        "created mixed with transactions",
        "files read",
        "appended",
        "deleted",
        "deletion alone",
        "bytes written",
        "deleted mixed with transactions",
        "bytes read",
    ];
    let mut get = |i: usize| {
        found[i].take().ok_or_else(|| {
            PostmarkError::BadReport(format!("no {} figure (did the run end?)", names[i]))
        })
    };
    let (transaction_seconds, transactions_per_s) = get(0)?;
    let (created, created_per_s) = get(1)?;
    let (created_alone, created_alone_per_s) = get(2)?;
    let (created_mixed, created_mixed_per_s) = get(3)?;
    let (read, read_per_s) = get(4)?;
    let (appended, appended_per_s) = get(5)?;
    let (deleted, deleted_per_s) = get(6)?;
    let (deleted_alone, deleted_alone_per_s) = get(7)?;
    let (written_bytes, written_bytes_per_s) = get(8)?;
    let (deleted_mixed, deleted_mixed_per_s) = get(9)?;
    let (read_bytes, read_bytes_per_s) = get(10)?;
    let total_seconds =
        total_seconds.ok_or_else(|| PostmarkError::BadReport("no total seconds".into()))?;
    Ok(PostmarkOutput {
        total_seconds,
        transaction_seconds: count(transaction_seconds),
        transactions_per_s,
        created: count(created),
        created_per_s,
        created_alone: count(created_alone),
        created_alone_per_s,
        created_mixed: count(created_mixed),
        created_mixed_per_s,
        read: count(read),
        read_per_s,
        appended: count(appended),
        appended_per_s,
        deleted: count(deleted),
        deleted_per_s,
        deleted_alone: count(deleted_alone),
        deleted_alone_per_s,
        deleted_mixed: count(deleted_mixed),
        deleted_mixed_per_s,
        read_bytes,
        read_bytes_per_s,
        written_bytes,
        written_bytes_per_s,
    })
}

/// One target's PostMark run: a process per filesystem, all started together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PostmarkRun {
    pub processes: Vec<PostmarkOutput>,
    /// From the first start to the last exit, by the lab's clock.
    pub wall_seconds: f64,
}

impl PostmarkRun {
    fn sum(&self, pick: impl Fn(&PostmarkOutput) -> f64) -> f64 {
        self.processes.iter().map(pick).sum()
    }

    /// PostMark's headline, summed over the processes (they ran at once).
    pub fn transactions_per_s(&self) -> f64 {
        self.sum(|p| p.transactions_per_s)
    }

    /// Files created, read, appended and deleted per second of the lab's clock over the
    /// whole run: the figure with sub-second resolution.
    pub fn file_ops_per_s(&self) -> f64 {
        let ops = self.sum(|p| (p.created + p.read + p.appended + p.deleted) as f64);
        ops / self.wall_seconds.max(1e-3)
    }

    /// The table's row after the target's name (ratios of the last column to `base`).
    pub(crate) fn cells(&self, base: Option<&PostmarkRun>) -> Vec<String> {
        let seconds = |pick: fn(&PostmarkOutput) -> u64| {
            self.processes.iter().map(pick).max().unwrap_or(0).to_string()
        };
        let rate = |pick: fn(&PostmarkOutput) -> f64| format!("{:.0}", self.sum(pick));
        let mb = |pick: fn(&PostmarkOutput) -> f64| format!("{:.1}", self.sum(pick) / 1e6);
        let ops = self.file_ops_per_s();
        let ops_cell = match base.map(PostmarkRun::file_ops_per_s) {
            Some(b) if b > 0.0 => format!("{ops:.0} ({:.2}x)", ops / b),
            _ => format!("{ops:.0}"),
        };
        vec![
            self.processes.len().to_string(),
            format!("{} / {}", seconds(|p| p.total_seconds), seconds(|p| p.transaction_seconds)),
            rate(|p| p.transactions_per_s),
            format!(
                "{} ({} / {})",
                rate(|p| p.created_per_s),
                rate(|p| p.created_alone_per_s),
                rate(|p| p.created_mixed_per_s)
            ),
            rate(|p| p.read_per_s),
            rate(|p| p.appended_per_s),
            format!(
                "{} ({} / {})",
                rate(|p| p.deleted_per_s),
                rate(|p| p.deleted_alone_per_s),
                rate(|p| p.deleted_mixed_per_s)
            ),
            mb(|p| p.read_bytes_per_s),
            mb(|p| p.written_bytes_per_s),
            format!("{:.2}", self.wall_seconds),
            ops_cell,
        ]
    }

    pub(crate) fn header() -> Vec<String> {
        [
            "Processes",
            "PostMark s (total / transactions)",
            "transactions/s",
            "created/s (alone / mixed)",
            "read/s",
            "appended/s",
            "deleted/s (alone / mixed)",
            "MB/s read",
            "MB/s written",
            "wall s",
            "file ops/s (wall)",
        ]
        .iter()
        .map(|h| h.to_string())
        .collect()
    }
}

/// What the PostMark table's figures are, for the report.
pub const POSTMARK_NOTE: &str = "PostMark times in whole seconds: its per-second figures are \
counts over rounded seconds, summed over its processes (one per filesystem, run at once, each \
with its share of the files and transactions). The last column counts files created, read, \
appended and deleted per second of the lab's clock over the whole run, and carries the ratios. \
PostMark does not sync: a working set that fits in memory measures the filesystem and page \
cache more than the device under it.";

#[cfg(test)]
mod tests {
    use super::*;

    /// PostMark 1.51's verbose report, as Debian's postmark printed it on this machine.
    const REPORT: &str = "PostMark v1.51 : 8/14/01
Reading configuration from file 'cfg'
Current configuration is:
The base number of files is 2000
Transactions: 20000
Files range between 512 bytes and 64.00 kilobytes in size
Working directory: 
\t/tmp/pm/a (weight=1)
10 subdirectories will be used
Block sizes are: read=4.00 kilobytes, write=4.00 kilobytes
Biases are: read/append=5, create/delete=5
Not using Unix buffered file I/O
Random number generator seed is 42
Report format is verbose.
Creating subdirectories...Done
Creating files...Done
Performing transactions..........Done
Deleting files...Done
Deleting subdirectories...Done
Time:
\t3 seconds total
\t2 seconds of transactions (10000 per second)

Files:
\t12062 created (4020 per second)
\t\tCreation alone: 2000 files (2000 per second)
\t\tMixed with transactions: 10062 files (5031 per second)
\t9893 read (4946 per second)
\t10083 appended (5041 per second)
\t12062 deleted (4020 per second)
\t\tDeletion alone: 2124 files (2124 per second)
\t\tMixed with transactions: 9938 files (4969 per second)

Data:
\t400.87 megabytes read (133.62 megabytes per second)
\t488.13 kilobytes written (162.71 kilobytes per second)
";

    #[test]
    fn a_verbose_report_reads_whole() {
        let out = parse_postmark(REPORT).unwrap();
        assert_eq!((out.total_seconds, out.transaction_seconds), (3, 2));
        assert_eq!(out.transactions_per_s, 10000.0);
        assert_eq!((out.created, out.created_alone, out.created_mixed), (12062, 2000, 10062));
        assert_eq!((out.created_per_s, out.created_mixed_per_s), (4020.0, 5031.0));
        assert_eq!((out.read, out.appended), (9893, 10083));
        assert_eq!((out.deleted, out.deleted_alone, out.deleted_mixed), (12062, 2124, 9938));
        assert_eq!(out.deleted_mixed_per_s, 4969.0);
        assert!((out.read_bytes - 400.87 * 1048576.0).abs() < 1.0);
        assert!((out.read_bytes_per_s - 133.62 * 1048576.0).abs() < 1.0);
        assert!((out.written_bytes - 488.13 * 1024.0).abs() < 1e-6);
        assert!((out.written_bytes_per_s - 162.71 * 1024.0).abs() < 1e-6);
    }

    #[test]
    fn a_report_cut_short_or_garbled_is_refused() {
        // Every figure line removed in turn: refused, never read as zero.
        let figures: Vec<&str> = REPORT
            .lines()
            .filter(|l| l.contains("per second") || l.contains("seconds total"))
            .collect();
        assert_eq!(figures.len(), 12);
        for line in &figures {
            let cut = REPORT.replacen(line, "", 1);
            assert!(parse_postmark(&cut).is_err(), "accepted without {line:?}");
        }
        // A run that died before its report.
        let died = REPORT.split("Time:").next().unwrap();
        assert!(parse_postmark(died).is_err());
        for (from, to) in [
            ("9893 read", "lots read"),
            ("(4946 per second)", "(4946 per minute)"),
            ("400.87 megabytes", "400.87 parsecs"),
            ("3 seconds total", "3.5 seconds total"),
            ("12062 created", "-1 created"),
        ] {
            let garbled = REPORT.replacen(from, to, 1);
            assert!(parse_postmark(&garbled).is_err(), "accepted {to:?}");
        }
        // A figure given twice.
        let twice = REPORT.replacen("\t9893 read", "\t9893 read (1 per second)\n\t9893 read", 1);
        assert!(parse_postmark(&twice).is_err());
    }

    #[test]
    fn the_processes_share_the_work_and_each_gets_its_own_seed() {
        let shape = PostmarkShape::for_mode(true);
        for processes in [1, 3, 7, 2001] {
            let (files, transactions): (Vec<u32>, Vec<u32>) =
                (0..processes).map(|i| shape.share(i, processes)).unzip();
            assert!(files.iter().all(|&f| f >= 1) && transactions.iter().all(|&t| t >= 1));
            if processes <= shape.files {
                assert_eq!(files.iter().sum::<u32>(), shape.files);
                assert_eq!(transactions.iter().sum::<u32>(), shape.transactions);
            }
        }
        let a = render_postmark_config(&shape, "/mnt/a/postmark", 0, 2, 7).unwrap();
        let b = render_postmark_config(&shape, "/mnt/b/postmark", 1, 2, 7).unwrap();
        assert!(a.contains("set location /mnt/a/postmark\n") && a.contains("set number 1000\n"));
        assert!(a.contains("set seed 7\n") && b.contains("set seed 8\n"));
        assert!(a.contains("set buffering false\n") && a.ends_with("run\nquit\n"));
        assert_eq!(a, render_postmark_config(&shape, "/mnt/a/postmark", 0, 2, 7).unwrap());
        for bad in ["relative/dir", "/with space", "/with\ttab", "/new\nline"] {
            assert!(render_postmark_config(&shape, bad, 0, 1, 7).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_wall_clock_rate_carries_the_ratio() {
        let one = parse_postmark(REPORT).unwrap();
        let run = PostmarkRun { processes: vec![one.clone(), one], wall_seconds: 4.0 };
        let ops = 2.0 * (12062.0 + 9893.0 + 10083.0 + 12062.0);
        assert_eq!(run.file_ops_per_s(), ops / 4.0);
        assert_eq!(run.transactions_per_s(), 20000.0);
        let slower = PostmarkRun { wall_seconds: 8.0, ..run.clone() };
        let cells = slower.cells(Some(&run));
        assert_eq!(cells.len(), PostmarkRun::header().len());
        assert!(cells.last().unwrap().ends_with("(0.50x)"), "{cells:?}");
        assert_eq!(cells[1], "3 / 2");
    }
}
