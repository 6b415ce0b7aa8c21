//! `labd`: the MongoDB wire-protocol emulator as a standalone server.
fn main() {
    eprintln!("labd: the emulator is not built yet (issue 3)");
    std::process::exit(2);
}
