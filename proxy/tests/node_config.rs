//! `fencegate node --config FILE [--check]` with good and bad files, run as an operator runs
//! it: the built binary, its output and exit status.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};

const FENCEGATE: &str = env!("CARGO_BIN_EXE_fencegate");

fn node(config: &Path, check: bool) -> Output {
    let mut cmd = Command::new(FENCEGATE);
    cmd.arg("node").arg("--config").arg(config);
    if check {
        cmd.arg("--check");
    }
    cmd.env("NO_COLOR", "1").output().expect("run fencegate")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A one-member config whose API port is `taken` (held by the test).
fn config(dir: &Path, taken: u16, extra: &str) -> String {
    format!(
        "listen = \"127.0.0.1:{taken}\"\npeer_listen = \"127.0.0.1:0\"\n{extra}[node]\nid = 1\n\
         data_dir = \"{data}\"\npeer_secret = \"0123456789abcdef0123\"\nauth = \"off\"\n",
        data = dir.join("data").display(),
    )
}

#[test]
fn check_accepts_a_good_file_without_binding_or_writing_anything() {
    let dir = tempfile::tempdir().unwrap();
    // The port is in use: a check must not try to bind it.
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let file = dir.path().join("node.toml");
    std::fs::write(&file, config(dir.path(), port, "")).unwrap();

    let out = node(&file, true);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(said.contains("valid") && said.contains("node 1"), "{said}");
    assert!(
        !dir.path().join("data").exists(),
        "the check created the data directory"
    );
}

#[test]
fn a_bad_file_exits_2_naming_what_is_wrong_with_or_without_check() {
    let dir = tempfile::tempdir().unwrap();
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let missing = dir.path().join("no-such-secret");
    let cases = [
        (config(dir.path(), port, "colour = \"blue\"\n"), "colour"),
        (
            config(dir.path(), port, "").replace(
                "peer_secret = \"0123456789abcdef0123\"",
                &format!("peer_secret_file = \"{}\"", missing.display()),
            ),
            "no-such-secret",
        ),
        (
            format!(
                "{}[node.policy]\nmin_ttl_ms = 9000\nmax_ttl_ms = 5000\n",
                config(dir.path(), port, "")
            ),
            "node.policy.min_ttl_ms",
        ),
        (
            format!(
                "{}[node.raft]\nheartbeat_ms = 1\n",
                config(dir.path(), port, "")
            ),
            "node.raft.heartbeat_ms",
        ),
        (
            config(dir.path(), port, "").replace(&format!(":{port}\""), ":99999\""),
            "listen = \"127.0.0.1:99999\"",
        ),
    ];
    for (i, (body, named)) in cases.iter().enumerate() {
        let file = dir.path().join(format!("bad{i}.toml"));
        std::fs::write(&file, body).unwrap();
        for check in [true, false] {
            let out = node(&file, check);
            let err = text(&out.stderr);
            assert_eq!(
                out.status.code(),
                Some(2),
                "case {i} (check {check}): {err}"
            );
            assert!(
                err.starts_with("error: ") && err.contains(named),
                "case {i}: {err}"
            );
        }
    }
    let out = node(&dir.path().join("absent.toml"), true);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("absent.toml"));
}
