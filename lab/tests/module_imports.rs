//! No module of the lab imports one that imports it back (issue 53, item 10): a helper two
//! modules share belongs in a module below both. `support/import_graph.rs` reads `src/`.

#[path = "support/import_graph.rs"]
mod import_graph;

#[test]
fn no_module_of_the_lab_imports_one_that_imports_it_back() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = import_graph::assert_no_circles(&src);
    // The reader found the load generator's modules and their references, so the absence of
    // circles is a finding rather than an empty read.
    assert!(graph.modules.len() >= 20, "{:?}", graph.modules);
    assert!(graph.refers("loadgen::runner", "loadgen::drive"));
    assert!(
        graph.edge_count() >= 30,
        "{} references",
        graph.edge_count()
    );
}
