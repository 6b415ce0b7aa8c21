//! Who the fork is, for the handshake metadata and for applications that want to check which
//! driver they were linked against.

use std::fmt;

/// The fork's name as it appears in the handshake's `driver.name` (after upstream's name and a
/// `|`, the way the handshake specification lets wrapping libraries identify themselves).
pub const FORK_NAME: &str = "mongodb-overload";

/// The fork's own version (this crate's version; the fork's crates are released together).
pub const FORK_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The identity of a fork build: the fork's name and version and the upstream release it is
/// based on.
///
/// The driver exposes the identity it was built with as `mongodb::fork::IDENTITY`; its upstream
/// version comes from the driver package itself, so it cannot drift from the code that shipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForkIdentity {
    /// Always [`FORK_NAME`].
    pub name: &'static str,
    /// Always [`FORK_VERSION`].
    pub version: &'static str,
    /// The version of the upstream `mongodb` crate the patch series was applied to.
    pub upstream_version: &'static str,
}

impl ForkIdentity {
    /// The identity of this fork release on top of upstream `upstream_version`.
    pub const fn new(upstream_version: &'static str) -> Self {
        Self {
            name: FORK_NAME,
            version: FORK_VERSION,
            upstream_version,
        }
    }
}

impl fmt::Display for ForkIdentity {
    /// `mongodb-overload 0.1.0 (upstream mongodb 3.9.1)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} (upstream mongodb {})",
            self.name, self.version, self.upstream_version
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_fork_and_upstream() {
        let id = ForkIdentity::new("3.9.1");
        assert_eq!(
            id.to_string(),
            format!("mongodb-overload {FORK_VERSION} (upstream mongodb 3.9.1)")
        );
    }
}
