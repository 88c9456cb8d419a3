//! Lookups of one name that must ask the bucket at the same time share one answer.
//!
//! When a directory's entry expires, every thread whose path walks through it makes the kernel send a LOOKUP
//! of its own (a loader with 64 threads: 64 at once), and each would send the same GET and LIST. The first
//! one asks; the others wait until its answer is in the inode table and take it from there. If the one that
//! asked fails, each of the others asks for itself, so an error is never shared with a lookup that did not
//! see it happen.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::watch;

/// What the lookup that asked found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The name is in the inode table, fresh.
    Found,
    /// The bucket has no such name.
    Missing,
}

type Slot = (u64, String);

/// The names being asked about, with a way to wait for each answer.
#[derive(Default)]
pub struct InFlight {
    asking: Mutex<HashMap<Slot, watch::Receiver<Option<Answer>>>>,
}

/// How a lookup joined.
pub enum Joined<'a> {
    /// No other lookup of the name is asking: this one asks, and answers for the others.
    Asking(Asking<'a>),
    /// Another lookup is asking: wait for it with [`wait`].
    Waiting(watch::Receiver<Option<Answer>>),
}

impl InFlight {
    pub fn join(&self, parent: u64, name: &str) -> Joined<'_> {
        let mut asking = self.asking.lock().unwrap_or_else(|e| e.into_inner());
        let slot = (parent, name.to_string());
        if let Some(answer) = asking.get(&slot) {
            return Joined::Waiting(answer.clone());
        }
        let (sender, receiver) = watch::channel(None);
        asking.insert(slot.clone(), receiver);
        Joined::Asking(Asking {
            registry: self,
            slot,
            sender,
        })
    }
}

/// Waits for the lookup that asks. None when it ended without an answer (an error): ask for yourself.
pub async fn wait(mut answer: watch::Receiver<Option<Answer>>) -> Option<Answer> {
    // Err means the asking lookup is gone; what it sent before (if anything) is still there to read.
    let _ = answer.changed().await;
    *answer.borrow()
}

/// The lookup that asks the bucket. Dropping it without [`Asking::answer`] lets the waiting ones ask.
pub struct Asking<'a> {
    registry: &'a InFlight,
    slot: Slot,
    sender: watch::Sender<Option<Answer>>,
}

impl Asking<'_> {
    /// Call once the inode table holds the answer.
    pub fn answer(self, answer: Answer) {
        self.sender.send_replace(Some(answer));
    }
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        let mut asking = self
            .registry
            .asking
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        asking.remove(&self.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_second_lookup_waits_for_the_answer_of_the_first() {
        let in_flight = InFlight::default();
        let Joined::Asking(first) = in_flight.join(1, "a") else {
            panic!("nobody was asking yet");
        };
        let Joined::Waiting(second) = in_flight.join(1, "a") else {
            panic!("the first is asking");
        };
        // Another name, or the same name elsewhere, asks for itself.
        assert!(matches!(in_flight.join(1, "b"), Joined::Asking(_)));
        assert!(matches!(in_flight.join(2, "a"), Joined::Asking(_)));
        let waiting = tokio::spawn(wait(second));
        first.answer(Answer::Missing);
        assert_eq!(waiting.await.unwrap(), Some(Answer::Missing));
        // Answered and gone: the next lookup asks again.
        assert!(matches!(in_flight.join(1, "a"), Joined::Asking(_)));
    }

    #[tokio::test]
    async fn a_lookup_that_fails_lets_the_waiting_ones_ask() {
        let in_flight = InFlight::default();
        let first = in_flight.join(1, "a");
        let Joined::Waiting(second) = in_flight.join(1, "a") else {
            panic!("the first is asking");
        };
        drop(first);
        assert_eq!(wait(second).await, None);
    }
}
