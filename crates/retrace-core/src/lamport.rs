//! Lamport clocks: an agent's clock increases on each of its events, and on delivery becomes
//! max(own, sender's) + 1.

/// One agent's Lamport clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LamportClock(u64);

impl LamportClock {
    /// A clock that has seen nothing.
    pub fn new() -> Self {
        Self(0)
    }

    /// The current value.
    pub fn now(&self) -> u64 {
        self.0
    }

    /// A local event: advance by one and return the new value.
    pub fn tick(&mut self) -> u64 {
        self.0 += 1;
        self.0
    }

    /// A delivery of a message stamped `sender`: max(own, sender) + 1.
    pub fn observe(&mut self, sender: u64) -> u64 {
        self.0 = self.0.max(sender) + 1;
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_jumps_past_the_sender() {
        let mut a = LamportClock::new();
        let mut b = LamportClock::new();
        let sent = a.tick();
        a.tick();
        assert_eq!(b.tick(), 1);
        assert!(b.observe(sent) > sent);
        assert_eq!(b.observe(10), 11);
    }
}
