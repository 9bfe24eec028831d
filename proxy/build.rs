//! Stamps the binary with the commit it was built from, so operators can tell builds apart
//! (`fencegate version`, `fencegate_build_info`, the members' versions in the admin overview).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=FENCEGATE_COMMIT={commit}");
    // Built again when the checked-out commit changes, not on every source change.
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        // HEAD moves on a checkout; the branch it names, on a commit.
        let branch = git(&["symbolic-ref", "-q", "HEAD"]);
        for file in ["HEAD", "packed-refs"].into_iter().chain(branch.as_deref()) {
            println!("cargo:rerun-if-changed={dir}/{file}");
        }
    } else {
        println!("cargo:rerun-if-changed=build.rs");
    }
}
