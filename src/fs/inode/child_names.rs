//! The names of each directory: which node each one stands for.
//!
//! Kept per directory, so that a lookup by name allocates nothing (a `&str` finds a `Box<str>` key), and
//! "does this directory hold any name" or "its names" look at that directory alone, not at every name of the
//! mount.

use std::collections::HashMap;

#[derive(Default)]
pub(super) struct ChildNames {
    by_dir: HashMap<u64, HashMap<Box<str>, u64>>,
}

impl ChildNames {
    pub fn get(&self, dir: u64, name: &str) -> Option<u64> {
        self.by_dir.get(&dir)?.get(name).copied()
    }

    /// Names `ino` as `dir/name`; returns the node the name stood for before, if any.
    pub fn insert(&mut self, dir: u64, name: &str, ino: u64) -> Option<u64> {
        self.by_dir.entry(dir).or_default().insert(name.into(), ino)
    }

    /// Forgets `dir/name`; returns the node it stood for.
    pub fn remove(&mut self, dir: u64, name: &str) -> Option<u64> {
        let names = self.by_dir.get_mut(&dir)?;
        let ino = names.remove(name)?;
        if names.is_empty() {
            self.by_dir.remove(&dir);
        }
        Some(ino)
    }

    pub fn any_in(&self, dir: u64) -> bool {
        self.by_dir.contains_key(&dir)
    }

    /// The names of `dir` with their nodes, in no particular order.
    pub fn of(&self, dir: u64) -> impl Iterator<Item = (&str, u64)> {
        self.by_dir
            .get(&dir)
            .into_iter()
            .flat_map(|names| names.iter().map(|(name, &ino)| (&**name, ino)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_kept_per_directory_and_an_emptied_directory_holds_none() {
        let mut names = ChildNames::default();
        assert_eq!(names.insert(1, "a", 10), None);
        assert_eq!(names.insert(1, "b", 11), None);
        assert_eq!(names.insert(2, "a", 20), None);
        assert_eq!(names.get(1, "a"), Some(10));
        assert_eq!(names.get(2, "a"), Some(20));
        assert_eq!(names.get(3, "a"), None);
        assert_eq!(
            names.insert(1, "a", 12),
            Some(10),
            "a name taken over says whom it stood for"
        );
        let mut of_1: Vec<_> = names.of(1).collect();
        of_1.sort();
        assert_eq!(of_1, [("a", 12), ("b", 11)]);
        assert_eq!(names.of(3).count(), 0);

        assert_eq!(names.remove(1, "a"), Some(12));
        assert_eq!(names.remove(1, "a"), None);
        assert!(names.any_in(1));
        assert_eq!(names.remove(1, "b"), Some(11));
        assert!(!names.any_in(1), "no name left");
        assert!(names.any_in(2));
        assert_eq!(names.remove(9, "x"), None);
    }
}
