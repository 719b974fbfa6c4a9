//! fio's JSON output (`--output-format=json` or `json+`), parsed into per-job results.
//!
//! Owns: the mapping from fio 3.33's JSON (Debian 12) to [`JobResult`]: one entry per reported
//! job, which with `group_reporting=1` and a `stonewall` per section is one entry per element.
//!
//! Choices, and why:
//! * Average and maximum latency are fio's `lat_ns` (total latency, submission to completion), the
//!   closest thing to SNIA's "response time".
//! * Percentiles come from `lat_ns.percentile` when the job ran with `lat_percentiles=1`, else
//!   from `clat_ns.percentile` (fio's default computes percentiles of completion latency only).
//!   [`Percentiles::source`] records which, so a report never mixes the two silently.
//! * fio's percentiles are histogram bucket bounds, so p99.99 can exceed the observed max by a
//!   bucket's width; they are reported as fio gives them.
//! * A direction with no IO (`total_ios == 0`) has no latency: fio prints zeros there and omits
//!   percentiles, and zeros would read as "infinitely fast".
//!
//! Fault model: fio prints notes and warnings to stdout around the JSON document in some
//! configurations, so parsing starts at the first line that opens a JSON object and ignores any
//! text after the document. Malformed or truncated JSON and missing required fields are errors
//! ([`FioError`]); fields this crate does not need (`json+` bins, `disk_util`, trim) are ignored.
//! A job's own `error` code is data, not a parse error: the caller decides what a failed job means.
//!
//! fio's client mode (several load hosts, `--client`) reports `client_stats` instead of `jobs`;
//! [`parse_fio_client_output`] merges the hosts per job name from their json+ histograms, and
//! [`parse_fio_client_jobs`] keeps every host's jobs apart (vm-images: one job per VM).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One fio run: its version and the reported jobs in output order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FioOutput {
    pub fio_version: String,
    pub jobs: Vec<JobResult>,
}

/// One reported job (a stonewalled element when `group_reporting=1`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobResult {
    /// The job section's name, e.g. `r65-4k`.
    pub name: String,
    pub group_id: u64,
    /// fio's error code for the job; 0 when the job succeeded.
    pub error_code: i64,
    /// fio's own CPU use as it reports it: with group reporting, the group's summed CPU time
    /// over its summed thread run time, i.e. percent of one CPU per thread on average. It is
    /// the load generator's cost, not the target's.
    pub usr_cpu_percent: f64,
    pub sys_cpu_percent: f64,
    /// Thread-time of the job; with `numjobs=N` this is about N times the wall runtime.
    pub job_runtime_ms: u64,
    pub read: DirectionResult,
    pub write: DirectionResult,
    /// fsync/fdatasync calls (fio's `sync` section), when the job issued any (`fsync=N`).
    #[serde(default)]
    pub sync: Option<SyncResult>,
}

/// A job's syncs: how many, and how long each took (fio measures syncs from issue to return).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyncResult {
    pub syncs: u64,
    pub latency_us_mean: Option<f64>,
    pub latency_us_max: Option<f64>,
    pub percentiles: Option<Percentiles>,
}

impl JobResult {
    /// Total IOPS = read + write. Never weight by the mix (benchmark-method.md §3.2 item 1).
    pub fn iops_total(&self) -> f64 {
        self.read.iops + self.write.iops
    }

    pub fn bandwidth_bytes_per_s_total(&self) -> f64 {
        self.read.bandwidth_bytes_per_s + self.write.bandwidth_bytes_per_s
    }

    /// Mean total latency over both directions, weighted by each direction's IO count; `None`
    /// when no IO completed.
    pub fn latency_us_mean(&self) -> Option<f64> {
        let parts = [&self.read, &self.write];
        let ios: u64 = parts.iter().filter(|d| d.latency_us_mean.is_some()).map(|d| d.ios).sum();
        if ios == 0 {
            return None;
        }
        let weighted: f64 =
            parts.iter().filter_map(|d| d.latency_us_mean.map(|m| m * d.ios as f64)).sum();
        Some(weighted / ios as f64)
    }

    /// Maximum total latency over both directions.
    pub fn latency_us_max(&self) -> Option<f64> {
        match (self.read.latency_us_max, self.write.latency_us_max) {
            (Some(r), Some(w)) => Some(r.max(w)),
            (one, None) | (None, one) => one,
        }
    }

    /// Wall runtime of the element: the longer of the two directions.
    /// A latency percentile, the worse of the read and write directions (either alone when
    /// only one did IO): the figure a mixed workload's user feels.
    pub fn worse_percentile_us(&self, pick: fn(&Percentiles) -> Option<f64>) -> Option<f64> {
        let read = self.read.percentiles.as_ref().and_then(pick);
        let write = self.write.percentiles.as_ref().and_then(pick);
        match (read, write) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn runtime_ms(&self) -> u64 {
        self.read.runtime_ms.max(self.write.runtime_ms)
    }
}

/// One direction (read or write) of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DirectionResult {
    pub iops: f64,
    pub bandwidth_bytes_per_s: f64,
    pub io_bytes: u64,
    /// IOs completed (fio `total_ios`): the sample count behind the percentiles.
    pub ios: u64,
    pub runtime_ms: u64,
    /// Total latency (`lat_ns`); `None` when the direction did no IO.
    pub latency_us_mean: Option<f64>,
    pub latency_us_max: Option<f64>,
    pub latency_us_min: Option<f64>,
    /// `None` when the direction did no IO or fio reported no percentiles.
    pub percentiles: Option<Percentiles>,
}

/// Which latency fio's percentiles describe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LatencySource {
    /// `lat_ns`: submission to completion (job ran with `lat_percentiles=1`).
    Total,
    /// `clat_ns`: completion latency only (fio's default).
    Completion,
}

/// Latency percentiles in microseconds; each is `None` when fio's `percentile_list` lacked it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub source: LatencySource,
    pub latency_us_p50: Option<f64>,
    pub latency_us_p90: Option<f64>,
    pub latency_us_p99: Option<f64>,
    pub latency_us_p99_9: Option<f64>,
    pub latency_us_p99_99: Option<f64>,
}

/// Why fio output could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FioError {
    #[error("no JSON object in fio output (was it run with --output-format=json?)")]
    NoJson,
    #[error("malformed fio JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("fio output reports no jobs")]
    NoJobs,
    #[error("fio job {job:?}: {problem}")]
    BadJob { job: String, problem: String },
}

/// The lines of one of fio's per-IO or averaged logs (`time_ms, value, direction, block size,
/// offset[, prio]`): each non-blank line, numbered from 1, split into its trimmed fields.
pub fn log_lines(text: &str) -> impl Iterator<Item = (usize, Vec<&str>)> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(index, line)| (index + 1, line.split(',').map(str::trim).collect()))
}

/// Parse fio's JSON output. See the module comment for what is tolerated.
pub fn parse_fio_output(text: &str) -> Result<FioOutput, FioError> {
    let start = json_start(text).ok_or(FioError::NoJson)?;
    let mut stream = serde_json::Deserializer::from_str(&text[start..]).into_iter::<RawOutput>();
    let raw = match stream.next() {
        Some(parsed) => parsed?,
        None => return Err(FioError::NoJson),
    };
    if raw.jobs.is_empty() {
        return Err(FioError::NoJobs);
    }
    let jobs = raw.jobs.into_iter().map(convert_job).collect::<Result<Vec<_>, _>>()?;
    Ok(FioOutput { fio_version: raw.fio_version.unwrap_or_default(), jobs })
}

/// fio's name for its all-groups, all-hosts total in client mode.
const ALL_CLIENTS: &str = "All clients";

/// Parse the output of fio's client mode (`fio --client=HOST job ...` for several load hosts):
/// per job name, in first-seen order, the hosts' results merged into one: IOPS, bandwidth and
/// IO counts summed, mean latency weighted by IOs, min and max over hosts, and percentiles
/// recomputed from the merged json+ histograms (none when a host's histogram is missing, never
/// an average of percentiles). Also returns the hosts seen, in first-seen order.
pub fn parse_fio_client_output(text: &str) -> Result<(FioOutput, Vec<String>), FioError> {
    let start = json_start(text).ok_or(FioError::NoJson)?;
    let mut stream = serde_json::Deserializer::from_str(&text[start..]).into_iter::<RawOutput>();
    let raw = match stream.next() {
        Some(parsed) => parsed?,
        None => return Err(FioError::NoJson),
    };
    let mut hosts: Vec<String> = vec![];
    let mut groups: Vec<(String, Vec<RawJob>)> = vec![];
    for job in raw.client_stats.into_iter().filter(|j| j.jobname != ALL_CLIENTS) {
        let host = job.host();
        if !hosts.contains(&host) {
            hosts.push(host);
        }
        match groups.iter_mut().find(|(name, _)| *name == job.jobname) {
            Some((_, list)) => list.push(job),
            None => groups.push((job.jobname.clone(), vec![job])),
        }
    }
    if groups.is_empty() {
        return Err(FioError::NoJobs);
    }
    // Hosts are told apart by the address and port fio reports (two fio servers may share
    // an address).
    if let Some((name, list)) = groups.iter().find(|(_, list)| list.len() != hosts.len()) {
        return Err(FioError::BadJob {
            job: name.clone(),
            problem: format!("reported by {} of the {} load hosts", list.len(), hosts.len()),
        });
    }
    let jobs = groups.into_iter().map(|(_, list)| merge_hosts(list)).collect::<Result<_, _>>()?;
    Ok((FioOutput { fio_version: raw.fio_version.unwrap_or_default(), jobs }, hosts))
}

/// Parse the output of fio's client mode job by job, unmerged: each host's jobs with the host
/// that ran them, in output order. For a profile whose jobs are separate workloads (vm-images:
/// each clone is one VM), where merging by name would lump the VMs of every host together.
pub fn parse_fio_client_jobs(text: &str) -> Result<Vec<(String, JobResult)>, FioError> {
    let start = json_start(text).ok_or(FioError::NoJson)?;
    let mut stream = serde_json::Deserializer::from_str(&text[start..]).into_iter::<RawOutput>();
    let raw = match stream.next() {
        Some(parsed) => parsed?,
        None => return Err(FioError::NoJson),
    };
    let jobs = raw
        .client_stats
        .into_iter()
        .filter(|j| j.jobname != ALL_CLIENTS)
        .map(|job| Ok((job.host(), convert_job(job)?)))
        .collect::<Result<Vec<_>, FioError>>()?;
    if jobs.is_empty() {
        return Err(FioError::NoJobs);
    }
    Ok(jobs)
}

impl RawJob {
    /// The load host that ran the job, in fio's `--client` syntax: `HOST,PORT` (fio names
    /// the port too: two fio servers on one address are two hosts), or `HOST` when fio
    /// gives no port.
    fn host(&self) -> String {
        let name = self.hostname.clone().unwrap_or_default();
        match self.port {
            Some(port) => format!("{name},{port}"),
            None => name,
        }
    }
}

/// One job name's results from every host, as one result.
fn merge_hosts(list: Vec<RawJob>) -> Result<JobResult, FioError> {
    let hosts = list.len() as f64;
    let name = list[0].jobname.clone();
    let mut read_raw = vec![];
    let mut write_raw = vec![];
    let mut sync_raw = vec![];
    let mut converted = vec![];
    for mut job in list {
        read_raw.push(job.read.take());
        write_raw.push(job.write.take());
        sync_raw.push(job.sync.take());
        converted.push(job);
    }
    let read = merge_direction(&name, "read", read_raw)?;
    let write = merge_direction(&name, "write", write_raw)?;
    let syncs: u64 = sync_raw.iter().flatten().map(|s| s.total_ios).sum();
    let sync = (syncs > 0).then(|| {
        let lats: Vec<&RawLatency> =
            sync_raw.iter().flatten().filter_map(|s| s.lat_ns.as_ref()).collect();
        SyncResult {
            syncs,
            latency_us_mean: weighted_mean_us(&lats),
            latency_us_max: lats.iter().map(|l| l.max / 1000.0).reduce(f64::max),
            percentiles: merged_percentiles(LatencySource::Total, &lats),
        }
    });
    Ok(JobResult {
        name,
        group_id: converted[0].groupid,
        error_code: converted.iter().map(|j| j.error).find(|&e| e != 0).unwrap_or(0),
        usr_cpu_percent: converted.iter().map(|j| j.usr_cpu).sum::<f64>() / hosts,
        sys_cpu_percent: converted.iter().map(|j| j.sys_cpu).sum::<f64>() / hosts,
        job_runtime_ms: converted.iter().map(|j| j.job_runtime).sum(),
        read,
        write,
        sync,
    })
}

fn weighted_mean_us(lats: &[&RawLatency]) -> Option<f64> {
    let n: u64 = lats.iter().map(|l| l.n.unwrap_or(0)).sum();
    (n > 0).then(|| {
        lats.iter().map(|l| l.mean * l.n.unwrap_or(0) as f64).sum::<f64>() / n as f64 / 1000.0
    })
}

/// Percentiles of the merged histograms; `None` unless every host has one.
fn merged_percentiles(source: LatencySource, lats: &[&RawLatency]) -> Option<Percentiles> {
    let mut merged: BTreeMap<u64, u64> = BTreeMap::new();
    for lat in lats {
        for (value, count) in lat.bins.as_ref()? {
            *merged.entry(value.parse().ok()?).or_default() += count;
        }
    }
    let total: u64 = merged.values().sum();
    if total == 0 {
        return None;
    }
    // Nearest rank over the buckets, as fio reports a bucket's value.
    let at = |percent: f64| {
        let rank = ((percent / 100.0) * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        merged.iter().find_map(|(value, count)| {
            seen += count;
            (seen >= rank).then_some(*value as f64 / 1000.0)
        })
    };
    Some(Percentiles {
        source,
        latency_us_p50: at(50.0),
        latency_us_p90: at(90.0),
        latency_us_p99: at(99.0),
        latency_us_p99_9: at(99.9),
        latency_us_p99_99: at(99.99),
    })
}

fn merge_direction(
    job: &str,
    direction: &str,
    raws: Vec<Option<RawDirection>>,
) -> Result<DirectionResult, FioError> {
    let raws: Vec<RawDirection> = raws
        .into_iter()
        .map(|r| {
            r.ok_or_else(|| FioError::BadJob {
                job: job.to_string(),
                problem: format!("a host's result lacks the {direction:?} section"),
            })
        })
        .collect::<Result<_, _>>()?;
    let ios: u64 = raws.iter().map(|r| r.total_ios).sum();
    // Where the histograms are: total latency with lat_percentiles=1, else completion.
    let with_lat_bins = raws.iter().any(|r| r.lat_ns.as_ref().is_some_and(|l| l.bins.is_some()));
    let (source, hist): (LatencySource, Vec<&RawLatency>) = if with_lat_bins {
        (LatencySource::Total, raws.iter().filter_map(|r| r.lat_ns.as_ref()).collect())
    } else {
        (LatencySource::Completion, raws.iter().filter_map(|r| r.clat_ns.as_ref()).collect())
    };
    let busy: Vec<&RawDirection> = raws.iter().filter(|r| r.total_ios > 0).collect();
    // As in the one-host parse: total latency, or completion latency when fio left it empty.
    let lats: Vec<&RawLatency> = busy
        .iter()
        .filter_map(|r| {
            r.lat_ns
                .as_ref()
                .filter(|l| l.n != Some(0))
                .or_else(|| r.clat_ns.as_ref().filter(|l| l.n.is_some_and(|n| n > 0)))
        })
        .collect();
    let hist: Vec<&RawLatency> = hist.into_iter().filter(|l| l.n.is_none_or(|n| n > 0)).collect();
    Ok(DirectionResult {
        iops: raws.iter().map(|r| r.iops).sum(),
        bandwidth_bytes_per_s: raws.iter().map(|r| r.bw_bytes).sum(),
        io_bytes: raws.iter().map(|r| r.io_bytes).sum(),
        ios,
        runtime_ms: raws.iter().map(|r| r.runtime).max().unwrap_or(0),
        latency_us_mean: weighted_mean_us(&lats),
        latency_us_max: lats.iter().map(|l| l.max / 1000.0).reduce(f64::max),
        latency_us_min: lats.iter().map(|l| l.min / 1000.0).reduce(f64::min),
        percentiles: if ios == 0 { None } else { merged_percentiles(source, &hist) },
    })
}

/// When fio wrote its results (`timestamp_ms`, ms since the Unix epoch), from the same
/// output `parse_fio_output` reads.
pub fn results_time_ms(text: &str) -> Result<u64, FioError> {
    #[derive(serde::Deserialize)]
    struct Stamp {
        timestamp_ms: Option<u64>,
    }
    let start = json_start(text).ok_or(FioError::NoJson)?;
    let mut stream = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Stamp>();
    match stream.next() {
        Some(parsed) => parsed?.timestamp_ms.ok_or(FioError::NoJson),
        None => Err(FioError::NoJson),
    }
}

/// Byte offset of the first line whose first non-blank character opens an object.
fn json_start(text: &str) -> Option<usize> {
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if trimmed.starts_with('{') {
            return Some(offset + (line.len() - trimmed.len()));
        }
        offset += line.len();
    }
    None
}

fn convert_job(raw: RawJob) -> Result<JobResult, FioError> {
    let name = raw.jobname;
    let read = convert_direction(&name, "read", raw.read)?;
    let write = convert_direction(&name, "write", raw.write)?;
    Ok(JobResult {
        name,
        group_id: raw.groupid,
        error_code: raw.error,
        usr_cpu_percent: raw.usr_cpu,
        sys_cpu_percent: raw.sys_cpu,
        job_runtime_ms: raw.job_runtime,
        read,
        write,
        sync: raw.sync.filter(|s| s.total_ios > 0).map(|s| SyncResult {
            syncs: s.total_ios,
            latency_us_mean: s.lat_ns.as_ref().map(|l| l.mean / 1000.0),
            latency_us_max: s.lat_ns.as_ref().map(|l| l.max / 1000.0),
            percentiles: s
                .lat_ns
                .as_ref()
                .and_then(|l| l.percentile.as_ref())
                .map(|t| percentile_table(LatencySource::Total, t)),
        }),
    })
}

fn convert_direction(
    job: &str,
    direction: &str,
    raw: Option<RawDirection>,
) -> Result<DirectionResult, FioError> {
    let raw = raw.ok_or_else(|| FioError::BadJob {
        job: job.to_string(),
        problem: format!("missing the {direction:?} section"),
    })?;
    let bad = |problem: String| FioError::BadJob { job: job.to_string(), problem };
    let no_io = raw.total_ios == 0;
    // N == 0 with IO done means fio did not measure latency (disable_lat=1): no value, not zero.
    // fio's file engines (filecreate, filestat, filedelete) time each operation as completion
    // latency only, leaving lat_ns empty: take clat_ns then.
    let lat = if no_io {
        None
    } else {
        raw.lat_ns
            .as_ref()
            .filter(|l| l.n != Some(0))
            .or_else(|| raw.clat_ns.as_ref().filter(|l| l.n.is_some_and(|n| n > 0)))
    };
    if !no_io && raw.lat_ns.is_none() {
        return Err(bad(format!("{direction}: {} IOs but no lat_ns", raw.total_ios)));
    }
    let percentiles = if no_io { None } else { percentiles(&raw) };
    Ok(DirectionResult {
        iops: raw.iops,
        bandwidth_bytes_per_s: raw.bw_bytes,
        io_bytes: raw.io_bytes,
        ios: raw.total_ios,
        runtime_ms: raw.runtime,
        latency_us_mean: lat.map(|l| l.mean / 1000.0),
        latency_us_max: lat.map(|l| l.max / 1000.0),
        latency_us_min: lat.map(|l| l.min / 1000.0),
        percentiles,
    })
}

/// Total-latency percentiles when present (`lat_percentiles=1`), else completion latency.
fn percentiles(raw: &RawDirection) -> Option<Percentiles> {
    let (source, table) = match (&raw.lat_ns, &raw.clat_ns) {
        (Some(RawLatency { percentile: Some(t), .. }), _) => (LatencySource::Total, t),
        (_, Some(RawLatency { percentile: Some(t), .. })) => (LatencySource::Completion, t),
        _ => return None,
    };
    Some(percentile_table(source, table))
}

fn percentile_table(source: LatencySource, table: &BTreeMap<String, f64>) -> Percentiles {
    let lookup = |wanted: f64| {
        // Keys are fio's "%f" rendering ("99.900000"); compare numerically, not as text.
        table.iter().find_map(|(key, ns)| {
            let at: f64 = key.parse().ok()?;
            ((at - wanted).abs() < 1e-6).then_some(ns / 1000.0)
        })
    };
    Percentiles {
        source,
        latency_us_p50: lookup(50.0),
        latency_us_p90: lookup(90.0),
        latency_us_p99: lookup(99.0),
        latency_us_p99_9: lookup(99.9),
        latency_us_p99_99: lookup(99.99),
    }
}

// fio's JSON shapes, limited to the fields used. Integers are read as f64 where fio has printed
// both integers and fractions across versions (iops, bw_bytes, latency statistics).

#[derive(Deserialize)]
struct RawOutput {
    #[serde(rename = "fio version")]
    fio_version: Option<String>,
    #[serde(default)]
    jobs: Vec<RawJob>,
    /// fio's client mode (`--client`): every host's jobs, then an "All clients" entry that
    /// lumps all groups together (useless per element, so unused).
    #[serde(default)]
    client_stats: Vec<RawJob>,
}

#[derive(Deserialize)]
struct RawJob {
    jobname: String,
    /// fio's client mode: the load host that ran the job, and the port of its fio server.
    hostname: Option<String>,
    port: Option<u16>,
    #[serde(default)]
    groupid: u64,
    #[serde(default)]
    error: i64,
    #[serde(default)]
    usr_cpu: f64,
    #[serde(default)]
    sys_cpu: f64,
    #[serde(default)]
    job_runtime: u64,
    read: Option<RawDirection>,
    write: Option<RawDirection>,
    sync: Option<RawSync>,
}

#[derive(Deserialize)]
struct RawSync {
    #[serde(default)]
    total_ios: u64,
    lat_ns: Option<RawLatency>,
}

#[derive(Deserialize)]
struct RawDirection {
    #[serde(default)]
    io_bytes: u64,
    bw_bytes: f64,
    iops: f64,
    #[serde(default)]
    runtime: u64,
    total_ios: u64,
    clat_ns: Option<RawLatency>,
    lat_ns: Option<RawLatency>,
}

#[derive(Deserialize)]
struct RawLatency {
    #[serde(default)]
    min: f64,
    #[serde(default)]
    max: f64,
    #[serde(default)]
    mean: f64,
    #[serde(rename = "N")]
    n: Option<u64>,
    percentile: Option<BTreeMap<String, f64>>,
    /// json+ only: histogram bucket value (ns) -> IOs; what merges across load hosts.
    bins: Option<BTreeMap<String, u64>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const JSONPLUS: &str = include_str!("../tests/fixtures/fio-3.33-randrw-psync-jsonplus.json");
    const TWO_ELEMENTS: &str =
        include_str!("../tests/fixtures/fio-3.33-two-elements-lat-percentiles.json");

    const CLIENT_2HOSTS: &str =
        include_str!("../tests/fixtures/fio-3.33-client-2hosts-2elements-jsonplus.json");

    #[test]
    fn client_mode_merges_hosts_per_element() {
        let (out, hosts) = parse_fio_client_output(CLIENT_2HOSTS).unwrap();
        assert_eq!(hosts, ["10.231.2.2,8765", "10.231.1.2,8765"]);
        let names: Vec<&str> = out.jobs.iter().map(|j| j.name.as_str()).collect();
        // "All clients" lumps every element together: left out.
        assert_eq!(names, ["r100-4k", "r0-4k"]);
        let read = &out.jobs[0].read;
        assert!(close(read.iops, 73479.52048 + 70749.250749));
        assert_eq!(read.ios, 73553 + 70820);
        // Mean total latency weighted by each host's IOs.
        let mean = (54166.086047 * 73553.0 + 56258.838534 * 70820.0) / (73553.0 + 70820.0);
        assert!(close(read.latency_us_mean.unwrap(), mean / 1000.0));
        // p50 of the merged completion-latency histograms (checked against a hand merge),
        // between the two hosts' own p50s.
        let p = read.percentiles.as_ref().unwrap();
        assert_eq!(p.source, LatencySource::Completion);
        assert!(close(p.latency_us_p50.unwrap(), 47.36));
        assert_eq!(out.jobs[1].write.ios, 40241 + 48057);
        assert!(out.jobs[1].read.percentiles.is_none(), "no reads, no read percentiles");
        // An element one host did not report is refused, not merged from fewer hosts.
        let start = CLIENT_2HOSTS.find("\"jobname\" : \"r0-4k\"").unwrap();
        let cut = CLIENT_2HOSTS.replacen("\"jobname\" : \"r0-4k\"", "\"jobname\" : \"r0-4k-x\"", 1);
        assert!(start > 0);
        assert!(matches!(parse_fio_client_output(&cut), Err(FioError::BadJob { .. })));
        // Plain (one-host) output has no client_stats.
        assert!(matches!(parse_fio_client_output(JSONPLUS), Err(FioError::NoJobs)));
    }

    #[test]
    fn client_mode_jobs_unmerged_keep_their_hosts() {
        let jobs = parse_fio_client_jobs(CLIENT_2HOSTS).unwrap();
        let seen: Vec<(&str, &str)> =
            jobs.iter().map(|(h, j)| (h.as_str(), j.name.as_str())).collect();
        assert_eq!(seen.len(), 4, "{seen:?}");
        for host in ["10.231.1.2,8765", "10.231.2.2,8765"] {
            for name in ["r100-4k", "r0-4k"] {
                assert_eq!(seen.iter().filter(|s| **s == (host, name)).count(), 1, "{seen:?}");
            }
        }
        // Each host's own figures, not a merge.
        let reads: Vec<u64> =
            jobs.iter().filter(|(_, j)| j.name == "r100-4k").map(|(_, j)| j.read.ios).collect();
        assert_eq!(reads.iter().sum::<u64>(), 73553 + 70820);
        assert!(reads.contains(&73553) && reads.contains(&70820), "{reads:?}");
        assert!(matches!(parse_fio_client_jobs(JSONPLUS), Err(FioError::NoJobs)));
    }

    /// Two fio servers on one address (ports 8771 and 8772, as fio 3.33 reports them) are
    /// two hosts; told apart by hostname only they were one host that reported every job
    /// twice, and the run was refused (checked: this test failed then).
    #[test]
    fn client_mode_tells_hosts_apart_by_port() {
        let mut seen = 0;
        let one_address = CLIENT_2HOSTS
            .split("\"hostname\" : \"10.231.")
            .enumerate()
            .map(|(i, piece)| {
                if i == 0 {
                    return piece.to_string();
                }
                seen += 1;
                // Every host's entries on 127.0.0.1; the port tells them apart.
                let port = if piece.starts_with('1') { "8771" } else { "8772" };
                let rest = &piece[piece.find('"').unwrap()..];
                let rest = rest.replacen("\"port\" : 8765", &format!("\"port\" : {port}"), 1);
                format!("\"hostname\" : \"127.0.0.1{rest}")
            })
            .collect::<String>();
        assert!(seen >= 4, "{seen}");
        let (out, hosts) = parse_fio_client_output(&one_address).unwrap();
        assert_eq!(hosts, ["127.0.0.1,8772", "127.0.0.1,8771"]);
        assert_eq!(out.jobs[0].read.ios, 73553 + 70820);
        let jobs = parse_fio_client_jobs(&one_address).unwrap();
        assert_eq!(jobs.iter().filter(|(h, _)| h == "127.0.0.1,8771").count(), 2);
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn parses_real_jsonplus_output_with_completion_percentiles() {
        let out = parse_fio_output(JSONPLUS).unwrap();
        assert_eq!(out.fio_version, "fio-3.33");
        assert_eq!(out.jobs.len(), 1);
        let job = &out.jobs[0];
        assert_eq!(job.name, "t");
        assert_eq!(job.error_code, 0);
        assert!(close(job.usr_cpu_percent, 3.1) && close(job.sys_cpu_percent, 27.7));
        assert!(close(job.read.iops, 7083.916084));
        assert!(close(job.read.bandwidth_bytes_per_s, 29015720.0));
        assert_eq!((job.read.ios, job.write.ios), (7091, 7128));
        assert_eq!(job.runtime_ms(), 1001);
        assert!(close(job.read.latency_us_mean.unwrap(), 93.866095614));
        assert!(close(job.read.latency_us_max.unwrap(), 4927.355));
        let p = job.read.percentiles.as_ref().unwrap();
        // Without lat_percentiles=1 fio only has completion-latency percentiles.
        assert_eq!(p.source, LatencySource::Completion);
        assert!(close(p.latency_us_p50.unwrap(), 76.288));
        assert!(close(p.latency_us_p99.unwrap(), 272.384));
        assert!(close(p.latency_us_p99_9.unwrap(), 4112.384));
        assert!(close(p.latency_us_p99_99.unwrap(), 4947.968));
        assert!(close(job.iops_total(), 7083.916084 + 7120.879121));
    }

    #[test]
    fn parses_stonewalled_elements_with_total_latency_percentiles() {
        let out = parse_fio_output(TWO_ELEMENTS).unwrap();
        let names: Vec<&str> = out.jobs.iter().map(|j| j.name.as_str()).collect();
        assert_eq!(names, ["r100-4k", "r0-64k"]);
        let reads = &out.jobs[0];
        let p = reads.read.percentiles.as_ref().unwrap();
        assert_eq!(p.source, LatencySource::Total);
        // lat_ns p50 is 548 ns; clat_ns p50 would be 524 ns.
        assert!(close(p.latency_us_p50.unwrap(), 0.548));
        assert_eq!(p.latency_us_p90, None, "not in percentile_list");
        // No writes in a 100 % read element: no latency, no percentiles, not zeros.
        assert_eq!(reads.write.ios, 0);
        assert_eq!(reads.write.latency_us_mean, None);
        assert_eq!(reads.write.percentiles, None);
        assert_eq!(reads.latency_us_mean(), reads.read.latency_us_mean);
        let writes = &out.jobs[1];
        assert_eq!(writes.read.percentiles, None);
        assert!(writes.write.iops > 0.0 && writes.read.iops == 0.0);
        assert_eq!(writes.group_id, 1);
    }

    #[test]
    fn tolerates_text_around_the_document() {
        let noisy = format!("fio: note: something harmless\n{TWO_ELEMENTS}\nfio: trailing note\n");
        assert_eq!(parse_fio_output(&noisy).unwrap().jobs.len(), 2);
    }

    #[test]
    fn mixed_latency_mean_is_weighted_by_io_count() {
        let job = &parse_fio_output(JSONPLUS).unwrap().jobs[0];
        let expected = (93.866095614 * 7091.0 + 3.56123569 * 7128.0) / (7091.0 + 7128.0);
        assert!(close(job.latency_us_mean().unwrap(), expected));
        assert!(close(job.latency_us_max().unwrap(), 4927.355));
    }

    #[test]
    fn malformed_and_empty_outputs_are_errors() {
        assert!(matches!(parse_fio_output("fio: failed to open file\n"), Err(FioError::NoJson)));
        assert!(matches!(parse_fio_output(""), Err(FioError::NoJson)));
        let truncated = &TWO_ELEMENTS[..TWO_ELEMENTS.len() / 2];
        assert!(matches!(parse_fio_output(truncated), Err(FioError::Json(_))));
        assert!(matches!(parse_fio_output(r#"{"jobs": []}"#), Err(FioError::NoJobs)));
        assert!(matches!(parse_fio_output(r#"{"jobs": [{"read": {}}]}"#), Err(FioError::Json(_))));
    }

    #[test]
    fn missing_direction_or_latency_is_a_job_error() {
        let no_write = r#"{"jobs": [{"jobname": "x", "read": {"bw_bytes": 1, "iops": 1,
            "total_ios": 0}}]}"#;
        let err = parse_fio_output(no_write).unwrap_err();
        assert!(matches!(&err, FioError::BadJob { job, .. } if job == "x"), "{err}");
        let no_lat = r#"{"jobs": [{"jobname": "y",
            "read": {"bw_bytes": 4096, "iops": 1, "total_ios": 1},
            "write": {"bw_bytes": 0, "iops": 0, "total_ios": 0}}]}"#;
        assert!(matches!(parse_fio_output(no_lat), Err(FioError::BadJob { .. })));
    }

    #[test]
    fn failed_job_is_data_not_a_parse_error() {
        let failed = r#"{"fio version": "fio-3.33", "jobs": [{"jobname": "r0-4k", "error": 5,
            "read": {"bw_bytes": 0, "iops": 0, "total_ios": 0},
            "write": {"bw_bytes": 0, "iops": 0, "total_ios": 0}}]}"#;
        let out = parse_fio_output(failed).unwrap();
        assert_eq!(out.jobs[0].error_code, 5);
        assert_eq!(out.jobs[0].latency_us_mean(), None);
        assert_eq!(out.jobs[0].latency_us_max(), None);
    }
}
