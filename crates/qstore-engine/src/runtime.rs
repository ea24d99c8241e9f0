//! Thread plumbing shared by protocols: named worker threads, optional pinning to cores.
//!
//! Workers wait on crossbeam channels, which spin briefly and then park the thread: idle
//! workers cost no CPU, which matters when nodes share two cores.

use std::thread::JoinHandle;

/// Spawns a named worker thread, pinned to core `index % cores` when `pin` is set.
///
/// A worker that panics has left its node's shared state half-updated, and the work it held
/// would never finish: the node would hang without a word. So the process stops instead,
/// with the panic's message, and peers and clients see a dead node they report.
pub fn spawn_worker<F>(name: String, pin: bool, index: usize, f: F) -> JoinHandle<()>
where
    F: FnOnce() + Send + 'static,
{
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(move || {
            if pin {
                pin_to_core(index);
            }
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
                tracing::error!("worker thread {name} panicked; stopping the process");
                eprintln!("error: worker thread {name} panicked; stopping the process");
                std::process::exit(101);
            }
        })
        .expect("spawn worker thread")
}

fn pin_to_core(index: usize) {
    if let Some(cores) = core_affinity::get_core_ids() {
        if !cores.is_empty() && !core_affinity::set_for_current(cores[index % cores.len()]) {
            tracing::warn!("could not pin thread to core {}", index % cores.len());
        }
    }
}
