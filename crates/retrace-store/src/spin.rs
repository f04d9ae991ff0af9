//! Waiting for another thread by spinning briefly before sleeping.
//!
//! Recording hands every step between threads twice: the step's thread queues its event and
//! the commit thread takes it; the commit thread commits and the step's thread takes the
//! acknowledgment. Each hand-off takes microseconds, but waking a thread that went to sleep
//! costs a futex call and, on a virtual machine whose idle vCPU halted, a trip through the
//! hypervisor: a condvar ping-pong between two threads measured 172 µs a round trip on this
//! project's 2-core machine, against under 1 µs when each side spins. So both waits first spin
//! for a bounded time ([`spin_until`]), yielding to any runnable thread, and only then sleep.
//!
//! At most [`max_spinners`] threads spin at once (one fewer than the CPUs, at least one), so
//! sixteen agents waiting for acknowledgments never starve the commit thread they wait for:
//! the others sleep at once, as before.
//!
//! A thread waiting for an acknowledgment (or a step's turn) says so with [`waiter`], and
//! doesn't spin at all when [`max_spinners`] other threads already wait: the commit it waits
//! for is then a group commit that wakes a crowd, and a spinner's yields only take CPU time
//! from the commit thread and from the steps it wakes. With sixteen agents recording on two
//! CPUs, the one spinner allowed before spent a fifth of the agents' CPU time in
//! `sched_yield`; with this rule the process used about 15% less CPU and ran 5-10% faster. A
//! lone agent still spins, so its acknowledgment costs no wake-up.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The most threads that spin at once: one fewer than the CPUs this process may use, at least
/// one.
pub fn max_spinners() -> usize {
    process().max
}

/// Spins until `done()` holds or `bound` has passed, yielding the CPU between rounds; returns
/// whether `done()` held. Returns at once (false) when [`max_spinners`] threads already spin:
/// the caller then sleeps as it would have.
pub fn spin_until(bound: Duration, done: impl FnMut() -> bool) -> bool {
    process().spin_until(bound, done)
}

/// [`spin_until`] without the limit on spinners, for a thread whose spinning can't starve the
/// one it waits for (that one is asleep in the kernel, not on a CPU).
pub fn spin_unlimited(bound: Duration, mut done: impl FnMut() -> bool) -> bool {
    let began = Instant::now();
    loop {
        for _ in 0..32 {
            if done() {
                return true;
            }
            std::hint::spin_loop();
        }
        if began.elapsed() >= bound {
            return done();
        }
        std::thread::yield_now();
    }
}

/// Whether more than [`max_spinners`] threads wait ([`waiter`]) now: a crowd, which runs
/// better on the CPU a spinner would take.
pub fn crowded() -> bool {
    process().crowded()
}

/// Counts this thread among the threads waiting for another one until the returned guard
/// drops; [`Waiter::spin_until`] spins only if fewer than [`max_spinners`] others were waiting.
pub fn waiter() -> Waiter<'static> {
    process().waiter()
}

/// The spinners of this process.
fn process() -> &'static Spinners {
    static PROCESS: OnceLock<Spinners> = OnceLock::new();
    PROCESS.get_or_init(|| {
        Spinners::new(std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1)).max(1))
    })
}

/// Threads spinning now, and how many may; threads waiting now ([`Waiter`]).
struct Spinners {
    now: AtomicUsize,
    max: usize,
    waiting: AtomicUsize,
}

impl Spinners {
    fn new(max: usize) -> Spinners {
        Spinners { now: AtomicUsize::new(0), max, waiting: AtomicUsize::new(0) }
    }

    fn crowded(&self) -> bool {
        self.waiting.load(Ordering::Acquire) > self.max
    }

    fn waiter(&self) -> Waiter<'_> {
        let before = self.waiting.fetch_add(1, Ordering::AcqRel);
        Waiter { spinners: self, crowded: before >= self.max }
    }

    fn claim(&self) -> Option<Place<'_>> {
        self.now
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.max).then_some(n + 1))
            .ok()
            .map(|_| Place(self))
    }

    fn spin_until(&self, bound: Duration, mut done: impl FnMut() -> bool) -> bool {
        if done() {
            return true;
        }
        let Some(_place) = self.claim() else {
            return false;
        };
        spin_unlimited(bound, done)
    }
}

/// A thread counted among the waiting ones ([`waiter`]) until this drops.
pub struct Waiter<'a> {
    spinners: &'a Spinners,
    crowded: bool,
}

impl Waiter<'_> {
    /// [`spin_until`] while fewer than [`max_spinners`] other threads wait: returns at once
    /// when that many were waiting already, and stops spinning once that many more begin to
    /// (false, unless `done()` holds); the caller then sleeps.
    pub fn spin_until(&self, bound: Duration, mut done: impl FnMut() -> bool) -> bool {
        let spinners = self.spinners;
        if self.crowded {
            return done();
        }
        spinners.spin_until(bound, || done() || spinners.crowded());
        done()
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        self.spinners.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for Waiter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter").field("crowded", &self.crowded).finish()
    }
}

/// One of the [`Spinners`]' places, given back on drop.
struct Place<'a>(&'a Spinners);

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn returns_once_the_condition_holds_and_gives_up_after_the_bound() {
        let spinners = Spinners::new(1);
        let flag = Arc::new(AtomicBool::new(false));
        let setter = {
            let flag = Arc::clone(&flag);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(2));
                flag.store(true, Ordering::Release);
            })
        };
        assert!(spinners.spin_until(Duration::from_secs(10), || flag.load(Ordering::Acquire)));
        setter.join().unwrap();
        let began = Instant::now();
        assert!(!spinners.spin_until(Duration::from_millis(3), || false));
        assert!(began.elapsed() >= Duration::from_millis(3));
        assert_eq!(spinners.now.load(Ordering::Acquire), 0, "every place is given back");
    }

    #[test]
    fn a_crowd_is_more_waiters_than_spinners_allowed() {
        let spinners = Spinners::new(2);
        let mut waiters = vec![spinners.waiter(), spinners.waiter()];
        assert!(!spinners.crowded(), "as many waiting as may spin");
        waiters.push(spinners.waiter());
        assert!(spinners.crowded());
        waiters.pop();
        assert!(!spinners.crowded(), "a waiter that stops waiting is counted out");
    }

    #[test]
    fn a_waiter_spins_only_while_fewer_than_the_spinners_allowed_wait_with_it() {
        let spinners = Spinners::new(1);
        let first = spinners.waiter();
        assert!(!first.crowded, "alone: it may spin");
        let flag = AtomicBool::new(false);
        let second = spinners.waiter();
        let began = Instant::now();
        assert!(!second.spin_until(Duration::from_secs(10), || flag.load(Ordering::Acquire)));
        assert!(began.elapsed() < Duration::from_secs(5), "crowded: gives up at once");
        flag.store(true, Ordering::Release);
        assert!(second.spin_until(Duration::from_secs(10), || flag.load(Ordering::Acquire)));
        drop((first, second));
        assert_eq!(spinners.waiting.load(Ordering::Acquire), 0, "every waiter is counted out");
        assert!(!spinners.waiter().crowded, "alone again");
    }

    #[test]
    fn a_spinning_waiter_stops_once_a_crowd_begins_to_wait() {
        let spinners = Spinners::new(1);
        let stopped = std::thread::scope(|scope| {
            let (ready, started) = std::sync::mpsc::channel();
            let spinners = &spinners;
            let spinner = scope.spawn(move || {
                let waiter = spinners.waiter();
                ready.send(()).unwrap();
                let began = Instant::now();
                (waiter.spin_until(Duration::from_secs(30), || false), began.elapsed())
            });
            started.recv().unwrap();
            let second = spinners.waiter();
            let result = spinner.join().unwrap();
            drop(second);
            result
        });
        assert!(!stopped.0, "nothing it waited for happened");
        assert!(stopped.1 < Duration::from_secs(20), "it stopped spinning long before its bound");
        assert_eq!(spinners.waiting.load(Ordering::Acquire), 0);
    }

    #[test]
    fn no_more_than_the_allowed_threads_spin_at_once() {
        let spinners = Spinners::new(2);
        let places: Vec<Place<'_>> = (0..3).filter_map(|_| spinners.claim()).collect();
        assert_eq!(places.len(), 2);
        let began = Instant::now();
        assert!(!spinners.spin_until(Duration::from_secs(10), || false), "no place left: gives up at once");
        assert!(began.elapsed() < Duration::from_secs(5));
        assert!(
            spinners.spin_until(Duration::from_secs(10), || true),
            "a condition that holds needs no place"
        );
        drop(places);
        assert!(spinners.claim().is_some());
    }
}
