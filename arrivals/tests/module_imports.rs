//! No module of the schedule generator imports one that imports it back (issue 53, item 10).
//! The reader is the lab's (`lab/tests/support/import_graph.rs`), included here so that each
//! crate checks itself.

#[path = "../../lab/tests/support/import_graph.rs"]
mod import_graph;

#[test]
fn no_module_of_arrivals_imports_one_that_imports_it_back() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = import_graph::assert_no_circles(&src);
    // The reader found the modules and their references: the absence of circles is a finding.
    assert!(graph.modules.len() >= 4, "{:?}", graph.modules);
    assert!(graph.refers("schedule", "mix"));
}
