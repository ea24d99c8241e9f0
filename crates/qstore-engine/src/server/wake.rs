//! The wake-up of an event loop that takes engine answers on a channel: at most one wake-up
//! system call per burst of answers.

use crate::protocol::Wake;
use mio::Waker;
use std::sync::atomic::{AtomicBool, Ordering};

/// Wakes an event loop's `poll` when an answer is sent to it, unless a wake-up is pending
/// already.
pub struct WakeFlag {
    waker: Waker,
    pending: AtomicBool,
}

impl WakeFlag {
    pub fn new(waker: Waker) -> Self {
        WakeFlag {
            waker,
            pending: AtomicBool::new(false),
        }
    }

    /// Wakes the loop even if a wake-up is pending (for stop and lost data).
    pub fn wake_now(&self) {
        self.pending.store(true, Ordering::Release);
        if let Err(e) = self.waker.wake() {
            tracing::error!("cannot wake an event loop: {e}");
        }
    }

    /// Called by the loop before it drains its answers; returns whether a wake-up was
    /// pending. A swap, not a store: it acquires what an answering thread released with its
    /// own swap, so the drain sees every answer whose wake-up was skipped.
    pub fn clear(&self) -> bool {
        self.pending.swap(false, Ordering::AcqRel)
    }

    /// Called by the loop before it runs work that answers on its own thread: those answers
    /// need no wake-up, the loop drains them after [`WakeFlag::clear`].
    pub fn hold(&self) {
        self.pending.store(true, Ordering::Release);
    }
}

impl Wake for WakeFlag {
    #[inline]
    fn wake(&self) {
        // The loop clears the flag before it drains its answers, so an answer sent after
        // that drain finds the flag clear and wakes it again.
        if !self.pending.swap(true, Ordering::AcqRel) {
            if let Err(e) = self.waker.wake() {
                tracing::error!("cannot wake an event loop: {e}");
            }
        }
    }
}
