//! The emulator links no driver, not even for its tests: the spec runner builds it next to
//! whichever driver it tests (the fork or unmodified upstream), and a driver in the emulator's
//! graph would put a second one into that build. `cargo tree` lists every package reachable
//! through normal, dev and build dependencies; both drivers are packages named `mongodb`.

use std::path::Path;
use std::process::Command;

#[test]
fn no_driver_in_the_emulators_dependency_graph() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("emulator/ has a parent directory");
    // Cargo sets CARGO for the processes it runs, so the check uses the same toolchain as the
    // build; a bare `cargo` covers a test binary started by hand.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(workspace)
        .args([
            "tree",
            "-p",
            "emulator",
            "-e",
            "normal,dev,build",
            "--prefix",
            "none",
        ])
        .output()
        .expect("cargo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let packages: Vec<&str> = stdout
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    // The listing is the real graph, not an empty or unexpected output.
    assert_eq!(packages.first(), Some(&"emulator"), "{stdout}");
    assert!(packages.contains(&"bson"), "{stdout}");
    let drivers: Vec<&str> = stdout
        .lines()
        .filter(|line| line.split_whitespace().next() == Some("mongodb"))
        .collect();
    assert!(drivers.is_empty(), "the emulator depends on {drivers:?}");
}
