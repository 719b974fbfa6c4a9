//! Lifecycle of the arrays of a `flashraid serve` process, with the real binary on member
//! files:
//!
//! - `flashraid scrub` (a check) of an array served read-only runs, reports what it finds,
//!   and writes nothing to any member (the files hash the same before and after); `--repair`
//!   stays refused, saying a check works (found by an admin's expectation: every scrub was
//!   refused read-only).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const FLASHRAID: &str = env!("CARGO_BIN_EXE_flashraid");
/// Longest any wait here takes before the test gives up.
const WAIT_MAX: Duration = Duration::from_secs(30);

/// A server process, killed (SIGTERM, then waited for) when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        if self.running() {
            let _ = Command::new("kill").arg(self.0.id().to_string()).status();
        }
        let _ = self.0.wait();
    }
}

impl Server {
    fn running(&mut self) -> bool {
        self.0.try_wait().unwrap().is_none()
    }
}

/// `flashraid ARGS` with the control directory `control_dir`.
fn flashraid(control_dir: &Path, args: &[&str]) -> Output {
    Command::new(FLASHRAID).args(args).env("FLASHRAID_CONTROL_DIR", control_dir).output().unwrap()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn succeeds(control_dir: &Path, args: &[&str]) -> String {
    let out = flashraid(control_dir, args);
    assert!(out.status.success(), "flashraid {args:?} failed: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn fails(control_dir: &Path, args: &[&str]) -> String {
    let out = flashraid(control_dir, args);
    assert!(!out.status.success(), "flashraid {args:?} succeeded: {}", text(&out));
    text(&out)
}

/// Create array `name` (zeroed: consistent from the start) on new 32 MiB files `dir/NAMEi`.
fn create(dir: &Path, name: &str, level: &str, count: usize) -> Vec<PathBuf> {
    let members: Vec<PathBuf> = (0..count).map(|i| dir.join(format!("{name}{i}"))).collect();
    let mut args = vec!["create", "-l", level, "-n", name, "--size", "32M", "--init", "zero"];
    args.extend(members.iter().map(|p| p.to_str().unwrap()));
    succeeds(dir, &args);
    members
}

/// Start `flashraid serve ARGS` and wait until every socket in `sockets` exists.
fn serve(control_dir: &Path, args: &[&str], sockets: &[&Path]) -> Server {
    let child = Command::new(FLASHRAID)
        .arg("serve")
        .args(args)
        .env("FLASHRAID_CONTROL_DIR", control_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut server = Server(child);
    let started = Instant::now();
    while !sockets.iter().all(|s| s.exists()) {
        assert!(server.running(), "the server exited at its start");
        assert!(started.elapsed() < WAIT_MAX, "the server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    server
}

/// Every member file's contents, hashed.
fn member_sums(members: &[PathBuf]) -> Vec<u64> {
    use std::hash::Hasher;
    members
        .iter()
        .map(|p| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            h.write(&std::fs::read(p).unwrap());
            h.finish()
        })
        .collect()
}

#[test]
fn a_check_scrub_of_a_read_only_array_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let control_dir = dir.join("control");
    let members = create(dir, "r", "5", 3);
    // Silent corruption: bytes of one member's data area changed behind the array's back.
    let file = std::fs::OpenOptions::new().write(true).open(&members[1]).unwrap();
    use std::os::unix::fs::FileExt;
    file.write_all_at(&[0x5a; 512], flashraid_format::layout::DATA_OFFSET_BYTES + 8192).unwrap();
    file.sync_all().unwrap();
    drop(file);
    let before = member_sums(&members);
    let (nbd, control) = (dir.join("nbd.sock"), dir.join("r.control"));
    let control = control.as_path();
    let mut args = vec!["--read-only", "--socket", nbd.to_str().unwrap()];
    args.extend(["--control", control.to_str().unwrap()]);
    args.extend(members.iter().map(|p| p.to_str().unwrap()));
    let mut server = serve(&control_dir, &args, &[control]);
    let c = control.to_str().unwrap();

    let repair = fails(&control_dir, &["scrub", "--repair", "--control", c]);
    assert!(repair.contains("served read-only") && repair.contains("without --repair"), "{repair}");
    let check = succeeds(&control_dir, &["scrub", "--wait", "--control", c]);
    assert!(check.contains("scrub (check): finished"), "{check}");
    assert!(check.contains("1 mismatched stripes") && check.contains("0 repaired"), "{check}");
    assert_eq!(member_sums(&members), before, "a read-only scrub wrote to a member");

    let stopped = succeeds(&control_dir, &["stop", "--control", c]);
    assert!(stopped.contains("nothing was written"), "{stopped}");
    assert!(!server.running());
    assert_eq!(member_sums(&members), before, "a read-only server wrote to a member");
}
