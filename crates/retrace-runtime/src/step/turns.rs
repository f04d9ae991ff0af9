//! Identical model calls of one agent in flight at once are recorded in the order they were
//! issued.
//!
//! Replay hands identical keys out in recorded order, in the order the program asks for them
//! (SPEC §7). Recorded in the order they completed, identical calls made at once (best-of-n
//! sampling, say) got each other's answers in replay: the call issued first received the output
//! of the one that finished first, and the replay still said `ok`. So a model call's event waits,
//! before it takes its seq, until every identical call of its agent issued before it has been
//! appended or given up: seq order is then issue order among identical calls, and replay gives
//! the n-th such request the n-th such recorded answer.
//!
//! Only model calls wait: a model's answer never depends on what the program does next, while
//! of two identical tool calls the first may wait for something the second one's return brings
//! about (a lock it holds), and holding the second's event for the first would then wait
//! forever.
use std::collections::{BTreeSet, HashMap};
use std::future::{poll_fn, Future};
use std::sync::Arc;
use std::task::{Poll, Waker};

use parking_lot::Mutex;
use retrace_core::Digest;

use crate::session::AgentState;

/// The identical calls (one key) of one agent in flight: in the agent's state while any is.
#[derive(Debug, Default)]
pub(crate) struct Turns {
    /// The turn the next call with this key gets.
    issued: u64,
    /// The lowest turn not yet passed.
    next: u64,
    /// Turns passed before an earlier one (a call given up).
    early: BTreeSet<u64>,
    /// Calls waiting for their turn.
    wakers: Vec<Waker>,
}

/// The per-agent turns, by key.
pub(crate) type TurnsByKey = HashMap<Digest, Turns>;

/// One call's place among the identical calls of its agent; passed when its event is appended,
/// or when it is dropped before that (the call failed or was abandoned).
pub(crate) struct Turn {
    state: Arc<Mutex<AgentState>>,
    key: Digest,
    n: u64,
    passed: bool,
}

impl Turn {
    /// Takes the next turn among the agent's calls with `key`.
    pub(crate) fn take(state: &Arc<Mutex<AgentState>>, key: Digest) -> Turn {
        let mut st = state.lock();
        let turns = st.turns.entry(key).or_default();
        let n = turns.issued;
        turns.issued += 1;
        Turn { state: Arc::clone(state), key, n, passed: false }
    }

    /// Resolves once every identical call issued before this one has passed its turn.
    pub(crate) fn ready(&self) -> impl Future<Output = ()> + '_ {
        poll_fn(move |cx| {
            let mut st = self.state.lock();
            match st.turns.get_mut(&self.key) {
                Some(turns) if turns.next < self.n => {
                    if !turns.wakers.iter().any(|w| w.will_wake(cx.waker())) {
                        turns.wakers.push(cx.waker().clone());
                    }
                    Poll::Pending
                }
                _ => Poll::Ready(()),
            }
        })
    }

    /// Passes this turn: the next identical call may take its seq.
    pub(crate) fn pass(mut self) {
        self.pass_now();
    }

    fn pass_now(&mut self) {
        if std::mem::replace(&mut self.passed, true) {
            return;
        }
        let mut st = self.state.lock();
        let Some(turns) = st.turns.get_mut(&self.key) else { return };
        turns.early.insert(self.n);
        while turns.early.remove(&turns.next) {
            turns.next += 1;
        }
        let wakers = std::mem::take(&mut turns.wakers);
        if turns.next == turns.issued {
            st.turns.remove(&self.key);
        }
        drop(st);
        wakers.into_iter().for_each(Waker::wake);
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.pass_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Context;

    fn key(b: u8) -> Digest {
        Digest::from_bytes([b; 32])
    }

    fn is_ready(turn: &Turn) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        std::pin::pin!(turn.ready()).poll(&mut cx).is_ready()
    }

    #[test]
    fn identical_calls_pass_in_the_order_they_were_issued() {
        let state = Arc::new(Mutex::new(AgentState::default()));
        let (a, b, c) = (Turn::take(&state, key(1)), Turn::take(&state, key(1)), Turn::take(&state, key(1)));
        let other = Turn::take(&state, key(2));
        assert!(is_ready(&a) && is_ready(&other), "the first of each key goes at once");
        assert!(!is_ready(&b) && !is_ready(&c));
        a.pass();
        assert!(is_ready(&b) && !is_ready(&c));
        b.pass();
        assert!(is_ready(&c));
        c.pass();
        other.pass();
        assert!(state.lock().turns.is_empty(), "no key is kept once its calls are done");
    }

    #[test]
    fn a_call_given_up_passes_its_turn_without_letting_a_later_one_overtake_an_earlier_one() {
        let state = Arc::new(Mutex::new(AgentState::default()));
        let (a, b, c) = (Turn::take(&state, key(1)), Turn::take(&state, key(1)), Turn::take(&state, key(1)));
        drop(b);
        assert!(!is_ready(&c), "the first call is still in flight");
        drop(a);
        assert!(is_ready(&c));
        drop(c);
        assert!(state.lock().turns.is_empty());
    }

    #[test]
    fn a_waiting_call_is_woken_when_its_turn_comes() {
        let state = Arc::new(Mutex::new(AgentState::default()));
        let first = Turn::take(&state, key(3));
        let second = Turn::take(&state, key(3));
        let waiter = std::thread::spawn(move || {
            futures_lite_block_on(second.ready());
            second.pass();
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        first.pass();
        waiter.join().unwrap();
        assert!(state.lock().turns.is_empty());
    }

    /// Blocks on `fut` by parking the thread between polls.
    fn futures_lite_block_on<F: Future>(fut: F) -> F::Output {
        struct Unpark(std::thread::Thread);
        impl std::task::Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut fut = std::pin::pin!(fut);
        loop {
            if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                return v;
            }
            std::thread::park();
        }
    }
}
