//! Driving a step's future from synchronous code (`Agent::tool`, `Agent::model`, ...).
//!
//! A recorded step's future is usually pending on one thing: its acknowledgment, which the
//! writer's commit thread gives within a commit. Sleeping through that wait costs a wake-up that,
//! on a virtual machine, can take longer than the commit ([`retrace_store::spin`]); so
//! [`block_on`] spins for up to [`ACK_SPIN`] for the future's waker before it parks the thread,
//! unless other threads already wait (see [`retrace_store::spin::waiter`]).
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;

use retrace_store::spin::waiter;
use retrace_store::writer::ACK_SPIN;

/// Drives `fut` to completion on this thread, inside `block_in_place` when `may_wait` (for
/// other tasks) and running on a worker of a multi-thread tokio runtime.
pub(crate) fn block_on<F: Future>(may_wait: bool, fut: F) -> F::Output {
    use tokio::runtime::{Handle, RuntimeFlavor};
    if may_wait && Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread) {
        tokio::task::block_in_place(|| spin_then_park(fut))
    } else {
        spin_then_park(fut)
    }
}

/// Wakes the thread blocked in [`spin_then_park`]: sets the flag it spins on, then unparks it
/// (an atomic swap, no system call, while it still spins).
struct Signal {
    woken: AtomicBool,
    thread: Thread,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// Polls `fut` until ready; between polls spins for its waker, then parks.
fn spin_then_park<F: Future>(fut: F) -> F::Output {
    let signal = Arc::new(Signal { woken: AtomicBool::new(false), thread: std::thread::current() });
    let waker = Waker::from(Arc::clone(&signal));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        // Cleared before the poll: a wake-up during the poll is seen after it.
        signal.woken.store(false, Ordering::Release);
        if let Poll::Ready(value) = fut.as_mut().poll(&mut cx) {
            return value;
        }
        let waiter = waiter();
        if !waiter.spin_until(ACK_SPIN, || signal.woken.load(Ordering::Acquire)) {
            while !signal.woken.load(Ordering::Acquire) {
                std::thread::park();
            }
        }
        drop(waiter);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_future_woken_from_another_thread_completes_whether_spun_for_or_parked_on() {
        for delay in [Duration::ZERO, Duration::from_micros(300), Duration::from_millis(20)] {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let sender = std::thread::spawn(move || {
                std::thread::sleep(delay);
                tx.send(7).unwrap();
            });
            assert_eq!(block_on(false, rx).unwrap(), 7, "after {delay:?}");
            sender.join().unwrap();
        }
    }
}
