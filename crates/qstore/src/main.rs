//! `qstore`: run embedded clusters, print configurations, check histories.

mod cli;
mod distributed;
mod figure;
mod launcher;
mod redis_port;
mod sizing;
mod zk_latency;

use mimalloc::MiMalloc;
use std::io::IsTerminal;
use tracing_subscriber::filter::{EnvFilter, LevelFilter};

/// mimalloc: fast thread-local allocation for the many small per-transaction allocations
/// (programs, messages, responses); builds from source in seconds with no system library.
#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

fn main() {
    // Logs go to stderr. Warnings and errors (a bad frame, a peer lost and back) show by
    // default; RUST_LOG replaces that filter (e.g. RUST_LOG=qstore_engine=debug, or off).
    let filter = EnvFilter::builder()
        .with_default_directive(LevelFilter::WARN.into())
        .from_env_lossy();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    std::process::exit(cli::main());
}
