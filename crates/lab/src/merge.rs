//! Side-by-side comparison of earlier workload runs (vm-images, video-frames, small-files):
//! the runs' targets put into one report, so the report's own tables give every figure with
//! its ratio to the first run's first target. (SNIA runs compare in `report`, element by
//! element across rounds' windows.)
//!
//! Invariants: only runs of the same workload shape compare (a quick run's 200 frames are not
//! a full run's 3000); every target keeps its run's id in its name; the merged conformance is
//! quick-smoke if any run was, lists which runs were put together, and keeps every run's
//! deviations (a run that stopped early says so in the comparison too).
//!
//! degraded-rebuild runs (one array per run, load levels rather than targets) compare in
//! `degraded`, with the header built here ([`merged_header`]).

use crate::files::{FilesReport, FilesTarget};
use crate::profile::ConformanceLabel;
use crate::vm::{VmReport, VmTarget};
use std::collections::BTreeMap;

/// Why runs cannot be put side by side.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    #[error("nothing to compare: {0} run(s), two are needed")]
    TooFew(usize),
    #[error("run {other} has another workload shape (mode, sizes or counts) than run {first}")]
    ShapeDiffers { first: String, other: String },
}

/// What comparison needs of a workload report.
pub trait Comparable: Clone {
    type Target;
    fn run_id(&self) -> &str;
    fn conformance(&self) -> &ConformanceLabel;
    fn same_workload(&self, other: &Self) -> bool;
    fn manifest(&self) -> &BTreeMap<String, String>;
    /// Replace run id, conformance, manifest and targets.
    fn rebuild(
        &self,
        run_id: String,
        conformance: ConformanceLabel,
        manifest: BTreeMap<String, String>,
        targets: Vec<Self::Target>,
    ) -> Self;
    /// The targets, each renamed `prefix` + its name.
    fn renamed_targets(&self, prefix: &str) -> Vec<Self::Target>;
}

/// The runs as one report: every target of every run, in order, named `RUN: TARGET`.
pub fn compare_runs<R: Comparable>(runs: &[R]) -> Result<R, MergeError> {
    let [first, rest @ ..] = runs else { return Err(MergeError::TooFew(0)) };
    if rest.is_empty() {
        return Err(MergeError::TooFew(1));
    }
    if let Some(other) = rest.iter().find(|r| !first.same_workload(r)) {
        return Err(MergeError::ShapeDiffers {
            first: first.run_id().to_string(),
            other: other.run_id().to_string(),
        });
    }
    let (run_id, conformance, manifest) = merged_header(
        &runs.iter().map(|r| (r.run_id(), r.conformance(), r.manifest())).collect::<Vec<_>>(),
    );
    let mut targets = vec![];
    for run in runs {
        targets.extend(run.renamed_targets(&format!("{}: ", run.run_id())));
    }
    Ok(first.rebuild(run_id, conformance, manifest, targets))
}

/// What a comparison of runs (id, label, manifest) is called, how it is labelled (quick-smoke
/// if any run was, noting which runs were put together) and its manifest (every run's
/// entries, as "RUN: KEY").
pub(crate) fn merged_header(
    runs: &[(&str, &ConformanceLabel, &BTreeMap<String, String>)],
) -> (String, ConformanceLabel, BTreeMap<String, String>) {
    let ids: Vec<&str> = runs.iter().map(|r| r.0).collect();
    let note = format!("a comparison of runs {}, each labelled as it was run", ids.join(", "));
    assert!(!runs.is_empty(), "at least one run");
    let chosen =
        runs.iter().position(|r| matches!(r.1, ConformanceLabel::QuickSmoke { .. })).unwrap_or(0);
    // The other runs' deviations too (a run that stopped early, a target not purged), each
    // with its run: the comparison would otherwise read as if they were complete and clean.
    let mut others = vec![];
    for (i, (id, label, _)) in runs.iter().enumerate() {
        for deviation in label.deviations() {
            if i != chosen && !runs[chosen].1.deviations().contains(deviation) {
                others.push(format!("{id}: {deviation}"));
            }
        }
    }
    let conformance = runs[chosen].1.clone().with_deviations(others).with_deviations(vec![note]);
    let mut manifest = BTreeMap::new();
    for (id, _, entries) in runs {
        for (key, value) in *entries {
            manifest.insert(format!("{id}: {key}"), value.clone());
        }
    }
    (format!("compare of {}", ids.join(", ")), conformance, manifest)
}

/// Runs grouped by workload (first-seen order), so each group compares on its own.
pub fn group_by_workload<R: Comparable>(runs: Vec<R>) -> Vec<Vec<R>> {
    group_runs(runs, R::same_workload)
}

/// Runs grouped by `same` (each group's first run against the next), in first-seen order.
pub(crate) fn group_runs<R>(runs: Vec<R>, same: impl Fn(&R, &R) -> bool) -> Vec<Vec<R>> {
    let mut groups: Vec<Vec<R>> = vec![];
    for run in runs {
        match groups.iter_mut().find(|g| same(&g[0], &run)) {
            Some(group) => group.push(run),
            None => groups.push(vec![run]),
        }
    }
    groups
}

/// Whether two runs' workload shapes measured the same thing.
trait SameShape {
    fn same_shape(&self, other: &Self) -> bool;
}

impl SameShape for crate::profile::VmImagesShape {
    fn same_shape(&self, other: &Self) -> bool {
        self == other
    }
}

impl SameShape for crate::files::FilesShape {
    /// Equal, except that a video-frames run from before the large-file ladder (P5a) has
    /// none, and a small-files run from before PostMark (P6a) has none: their other tests
    /// still compare with a newer run's.
    fn same_shape(&self, other: &Self) -> bool {
        use crate::files::FilesShape::{SmallFiles, VideoFrames};
        match (self, other) {
            (SmallFiles(a), SmallFiles(b)) if a.postmark.is_none() || b.postmark.is_none() => {
                let without = |s: &crate::profile::SmallFilesShape| {
                    crate::profile::SmallFilesShape { postmark: None, ..s.clone() }
                };
                without(a) == without(b)
            }
            (VideoFrames(a), VideoFrames(b))
                if a.large_file_bytes.is_empty() || b.large_file_bytes.is_empty() =>
            {
                let without = |s: &crate::profile::VideoFramesShape| {
                    let mut s = s.clone();
                    s.large_file_bytes.clear();
                    s.large_file_depths.clear();
                    s
                };
                without(a) == without(b)
            }
            _ => self == other,
        }
    }
}

/// The two workload reports have the same fields for what comparison touches.
macro_rules! comparable {
    ($report:ident, $target:ident) => {
        impl Comparable for $report {
            type Target = $target;

            fn run_id(&self) -> &str {
                &self.run_id
            }

            fn conformance(&self) -> &ConformanceLabel {
                &self.conformance
            }

            fn same_workload(&self, other: &Self) -> bool {
                self.mode == other.mode && SameShape::same_shape(&self.shape, &other.shape)
            }

            fn manifest(&self) -> &BTreeMap<String, String> {
                &self.manifest
            }

            fn rebuild(
                &self,
                run_id: String,
                conformance: ConformanceLabel,
                manifest: BTreeMap<String, String>,
                targets: Vec<$target>,
            ) -> Self {
                $report { run_id, conformance, manifest, targets, ..self.clone() }
            }

            fn renamed_targets(&self, prefix: &str) -> Vec<$target> {
                self.targets
                    .iter()
                    .map(|t| $target { name: format!("{prefix}{}", t.name), ..t.clone() })
                    .collect()
            }
        }
    };
}

comparable!(VmReport, VmTarget);
comparable!(FilesReport, FilesTarget);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{Mode, Profile, WorkloadShape, workload_shape};

    fn vm(run_id: &str, mode: Mode, targets: &[&str]) -> VmReport {
        let Some(WorkloadShape::VmImages(shape)) = workload_shape(Profile::VmImages, mode) else {
            panic!("vm-images has a shape")
        };
        VmReport {
            run_id: run_id.into(),
            mode,
            conformance: match mode {
                Mode::Quick => ConformanceLabel::QuickSmoke { deviations: vec![] },
                Mode::Full => ConformanceLabel::Workload { deviations: vec![] },
            },
            shape,
            manifest: BTreeMap::from([("fio".to_string(), "fio-3.33".to_string())]),
            targets: targets
                .iter()
                .map(|n| VmTarget {
                    name: n.to_string(),
                    description: String::new(),
                    repetitions: vec![],
                    timelines: vec![],
                })
                .collect(),
        }
    }

    #[test]
    fn runs_merge_in_order_with_their_ids() {
        let a = vm("a", Mode::Full, &["members", "flashraid"]);
        let b = vm("b", Mode::Full, &["/dev/md0"]);
        let merged = compare_runs(&[a, b]).unwrap();
        let names: Vec<&str> = merged.targets.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a: members", "a: flashraid", "b: /dev/md0"]);
        assert_eq!(merged.run_id, "compare of a, b");
        assert_eq!(merged.manifest.get("b: fio").map(String::as_str), Some("fio-3.33"));
        assert!(matches!(merged.conformance, ConformanceLabel::Workload { .. }));
        assert!(merged.conformance.deviations().iter().any(|d| d.contains("runs a, b")));
    }

    #[test]
    fn different_shapes_and_single_runs_are_refused() {
        let quick = vm("q", Mode::Quick, &["members"]);
        let full = vm("f", Mode::Full, &["members"]);
        assert_eq!(
            compare_runs(&[full.clone(), quick.clone()]),
            Err(MergeError::ShapeDiffers { first: "f".into(), other: "q".into() })
        );
        assert_eq!(compare_runs(std::slice::from_ref(&quick)), Err(MergeError::TooFew(1)));
        let groups = group_by_workload(vec![quick.clone(), full.clone(), quick.clone()]);
        let ids: Vec<Vec<&str>> =
            groups.iter().map(|g| g.iter().map(|r| r.run_id.as_str()).collect()).collect();
        assert_eq!(ids, [vec!["q", "q"], vec!["f"]]);
        // A quick run among them makes the comparison quick-smoke.
        let merged = compare_runs(&[quick.clone(), quick]).unwrap();
        assert!(matches!(merged.conformance, ConformanceLabel::QuickSmoke { .. }));
    }

    /// A later run's deviations (here: it stopped early) reach the comparison's label, with
    /// the run named; its label was dropped before (checked: this test failed then).
    #[test]
    fn other_runs_deviations_are_kept() {
        let a = vm("a", Mode::Full, &["members"]);
        let mut b = vm("b", Mode::Full, &["members"]);
        b.conformance =
            b.conformance.with_deviations(vec!["run stopped early: fio failed".to_string()]);
        let merged = compare_runs(&[a.clone(), b.clone()]).unwrap();
        let deviations = merged.conformance.deviations();
        assert!(
            deviations.iter().any(|d| d == "b: run stopped early: fio failed"),
            "{deviations:?}"
        );
        // The chosen run's own deviations are not repeated under its name.
        let merged = compare_runs(&[b, a]).unwrap();
        let deviations = merged.conformance.deviations();
        assert_eq!(deviations.iter().filter(|d| d.contains("stopped early")).count(), 1);
    }
}
