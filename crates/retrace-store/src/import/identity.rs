//! What makes a file's event the same as a stored one, when an import finds its run (or a
//! fork's source) stored already: the same hash, and content that gives that hash on both sides.
//!
//! Comparing hashes alone would trust what each side says of itself. An event stored by
//! `import --force` may hold content its hash doesn't cover, and a forced file may too: a file
//! edited by hand would then pass for the stored run, or the genuine file for an edited run.
//! So a stored event's content is hashed again, and a file's event counts with the hash its
//! content gave as it was read.
use std::collections::HashMap;

use retrace_core::{Digest, Event};

/// The events of a file whose content doesn't give the hash they carry (only a forced import
/// keeps them), by seq: the hash the content gives, `None` when it can't be hashed.
pub(super) type Mismatched = HashMap<u64, Option<Digest>>;

/// An event as compared: the hash it carries, and the hash its content gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Identity {
    hash: Digest,
    content: Option<Digest>,
}

impl Identity {
    /// A stored event's, its content hashed again.
    pub fn stored(event: &Event) -> Identity {
        Identity { hash: event.hash, content: event.compute_hash().ok() }
    }

    /// Each of a file's `events`, as read.
    pub fn of_file(events: &[Event], mismatched: &Mismatched) -> Vec<Identity> {
        events
            .iter()
            .map(|e| Identity {
                hash: e.hash,
                content: mismatched.get(&e.seq).copied().unwrap_or(Some(e.hash)),
            })
            .collect()
    }

    fn intact(&self) -> bool {
        self.content == Some(self.hash)
    }
}

/// The first 1-based position where the stored events `held` and the file's differ, and how.
pub(super) fn first_difference(held: &[Identity], file: &[Identity]) -> Option<(u64, String)> {
    let same = |(a, b): (&Identity, &Identity)| a == b && a.content.is_some();
    if let Some(i) = held.iter().zip(file).position(|pair| !same(pair)) {
        let (held, file) = (&held[i], &file[i]);
        let detail = if held.hash != file.hash {
            format!("hash {} in the store, {} in the file", held.hash, file.hash)
        } else if !held.intact() {
            format!(
                "both say hash {}, but the stored event's content doesn't give it (stored by \
                 `import --force`?; `retrace verify` says what is wrong)",
                held.hash
            )
        } else {
            format!("both say hash {}, but the file's event content doesn't give it", held.hash)
        };
        return Some((i as u64 + 1, detail));
    }
    (held.len() != file.len()).then(|| {
        let detail = format!("the store holds {} events, the file {}", held.len(), file.len());
        (held.len().min(file.len()) as u64 + 1, detail)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(hash: u8, content: Option<u8>) -> Identity {
        let d = |b: u8| Digest::from_bytes([b; 32]);
        Identity { hash: d(hash), content: content.map(d) }
    }

    #[test]
    fn events_are_the_same_only_with_the_same_hash_and_content_that_gives_it() {
        assert_eq!(first_difference(&[id(1, Some(1))], &[id(1, Some(1))]), None);
        let (seq, detail) =
            first_difference(&[id(1, Some(1)), id(2, Some(2))], &[id(1, Some(1)), id(3, Some(3))]).unwrap();
        assert_eq!(seq, 2);
        assert!(detail.starts_with("hash "), "{detail}");
        // An edited event kept its hash: whichever side holds it, the two differ.
        let (_, detail) = first_difference(&[id(1, Some(9))], &[id(1, Some(1))]).unwrap();
        assert!(detail.contains("stored event's content"), "{detail}");
        let (_, detail) = first_difference(&[id(1, Some(1))], &[id(1, Some(9))]).unwrap();
        assert!(detail.contains("file's event content"), "{detail}");
        // The same edited file, forced in twice, is the same run.
        assert_eq!(first_difference(&[id(1, Some(9))], &[id(1, Some(9))]), None);
        // Content that can't be hashed is never the same as anything.
        assert!(first_difference(&[id(1, None)], &[id(1, None)]).is_some());
        let (seq, detail) = first_difference(&[id(1, Some(1))], &[id(1, Some(1)), id(2, Some(2))]).unwrap();
        assert_eq!((seq, detail.as_str()), (2, "the store holds 1 events, the file 2"));
    }
}
