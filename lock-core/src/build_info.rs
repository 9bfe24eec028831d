//! Which build a node runs. The binary that embeds the node names it once at start (its
//! version and the commit it was built from); members show it to each other through their
//! readiness answers, and `/metrics` through `fencegate_build_info`.

use std::sync::OnceLock;

static BUILD: OnceLock<Build> = OnceLock::new();

/// A build: the package version and the commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Build {
    pub version: String,
    pub commit: String,
}

impl std::fmt::Display for Build {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.version, self.commit)
    }
}

/// Names the running build; the first call wins. Call it before starting a node.
pub fn set_build(version: &str, commit: &str) {
    let _ = BUILD.set(Build {
        version: version.to_string(),
        commit: commit.to_string(),
    });
}

/// The running build, or this library's version with an unknown commit when the binary named
/// none.
pub fn build() -> &'static Build {
    BUILD.get_or_init(|| Build {
        version: env!("CARGO_PKG_VERSION").to_string(),
        commit: "unknown".to_string(),
    })
}
