//! `flashraid replace` from another directory than the server's: the server lists member
//! paths as it was given them (relative to its own directory), so the CLI sends absolute
//! paths and the server matches its members by them (found by a misuse test: the CLI
//! resolved the server's relative names against its own directory and found no member).
//! Runs the real binary: `serve` in one directory, `replace` in another.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const FLASHRAID: &str = env!("CARGO_BIN_EXE_flashraid");

/// The server, stopped (SIGTERM, then waited for) when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(self.0.id().to_string()).status();
        let _ = self.0.wait();
    }
}

fn run(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(FLASHRAID).args(args).current_dir(dir).output().unwrap()
}

#[test]
fn replace_names_a_member_relative_to_the_cli_not_to_the_server() {
    let tmp = tempfile::tempdir().unwrap();
    let (server_dir, cli_dir) = (tmp.path().join("server"), tmp.path().join("cli"));
    std::fs::create_dir_all(&server_dir).unwrap();
    std::fs::create_dir_all(&cli_dir).unwrap();
    let made = run(&server_dir, &["create", "-l", "1", "-n", "rc", "--size", "32M", "m0", "m1"]);
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    std::fs::File::create(server_dir.join("new")).unwrap().set_len(32 << 20).unwrap();
    let control = tmp.path().join("rc.control");
    let control = control.to_str().unwrap();
    let nbd = tmp.path().join("nbd.sock");
    let child = Command::new(FLASHRAID)
        .args(["serve", "--control", control, "--socket", nbd.to_str().unwrap(), "m0", "m1"])
        .current_dir(&server_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _server = Server(child);
    let start = Instant::now();
    while !Path::new(control).exists() {
        assert!(start.elapsed() < Duration::from_secs(20), "the server did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Still a relative name, but relative to the CLI's directory.
    let replaced =
        run(&cli_dir, &["replace", "--control", control, "../server/m0", "../server/new"]);
    let stdout = String::from_utf8_lossy(&replaced.stdout);
    assert!(replaced.status.success(), "{stdout}{}", String::from_utf8_lossy(&replaced.stderr));
    assert!(stdout.contains("member 0 ("), "{stdout}");
    // A name that is no member here is refused by the server, naming it.
    let refused = run(&cli_dir, &["replace", "--control", control, "m1", "../server/new"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("is not a member of this array"), "{stderr}");
}
