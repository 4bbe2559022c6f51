//! The `get` calls parked on an empty queue, a leaf of the core both queues share (`shared.rs`):
//! kept under the queue's own lock, each with a ticket (handed out in
//! park order) and its waker. An add wakes the oldest one; a `get` that is woken or cancelled
//! leaves by its ticket.
//!
//! Invariant: `waiting` is sorted by ticket (tickets only grow and are pushed at the back), so a
//! ticket is found by binary search.

use std::collections::VecDeque;
use std::task::Waker;

/// Parked `get` calls, oldest first.
#[derive(Default)]
pub(super) struct Parked {
    waiting: VecDeque<(u64, Waker)>,
    next_ticket: u64,
    /// Wake-ups sent so far (for tests).
    #[cfg(test)]
    wakeups: usize,
}

impl Parked {
    /// Registers a parked `get`; returns its ticket.
    pub(super) fn park(&mut self, waker: Waker) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.waiting.push_back((ticket, waker));
        ticket
    }

    /// Replaces the waker of a still-parked `get`. Returns false if it is not parked (it was
    /// woken).
    pub(super) fn update_waker(&mut self, ticket: u64, waker: &Waker) -> bool {
        match self.waiting.binary_search_by_key(&ticket, |(t, _)| *t) {
            Ok(i) => {
                let slot = &mut self.waiting[i].1;
                if !slot.will_wake(waker) {
                    *slot = waker.clone();
                }
                true
            }
            Err(_) => false,
        }
    }

    /// Removes a parked `get`. Returns false if it was not parked (it was woken).
    pub(super) fn unpark(&mut self, ticket: u64) -> bool {
        match self.waiting.binary_search_by_key(&ticket, |(t, _)| *t) {
            Ok(i) => {
                self.waiting.remove(i);
                true
            }
            Err(_) => false,
        }
    }

    /// Takes the oldest parked `get`'s waker, to wake after unlocking.
    pub(super) fn wake_one(&mut self) -> Option<Waker> {
        let (_, waker) = self.waiting.pop_front()?;
        #[cfg(test)]
        {
            self.wakeups += 1;
        }
        Some(waker)
    }

    /// Takes every parked `get`'s waker (shutdown), to wake after unlocking.
    pub(super) fn take_all(&mut self) -> Vec<Waker> {
        #[cfg(test)]
        {
            self.wakeups += self.waiting.len();
        }
        self.waiting.drain(..).map(|(_, w)| w).collect()
    }

    /// How many `get` calls are parked.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Wake-ups sent so far.
    #[cfg(test)]
    pub(super) fn wakeups(&self) -> usize {
        self.wakeups
    }
}
