//! `qstore`: run embedded clusters, print configurations, check histories.

mod cli;
mod distributed;
mod launcher;

use mimalloc::MiMalloc;

/// mimalloc: fast thread-local allocation for the many small per-transaction allocations
/// (programs, messages, responses); builds from source in seconds with no system library.
#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

fn main() {
    // Logs go to stderr, filtered by RUST_LOG (e.g. RUST_LOG=qstore_engine=debug).
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    std::process::exit(cli::main());
}
