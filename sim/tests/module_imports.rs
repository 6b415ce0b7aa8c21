//! No module of the simulator imports one that imports it back (issue 53, item 10): a helper
//! two modules share belongs in a module below both. The reader is the lab's
//! (`lab/tests/support/import_graph.rs`), included here so that each crate checks itself.

#[path = "../../lab/tests/support/import_graph.rs"]
mod import_graph;

#[test]
fn no_module_of_the_simulator_imports_one_that_imports_it_back() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = import_graph::assert_no_circles(&src);
    // The reader found the simulator's modules and their references, so the absence of
    // circles is a finding rather than an empty read.
    assert!(graph.modules.len() >= 10, "{:?}", graph.modules);
    assert!(graph.refers("engine", "server"));
    assert!(
        graph.edge_count() >= 12,
        "{} references",
        graph.edge_count()
    );
}
