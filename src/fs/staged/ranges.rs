//! Sets of byte ranges, kept merged: which bytes of a staged file are held locally, and which were written.

use std::collections::BTreeMap;
use std::ops::Range;

/// Disjoint, non-adjacent half-open ranges, by start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet(BTreeMap<u64, u64>);

impl RangeSet {
    pub fn new() -> RangeSet {
        RangeSet::default()
    }

    /// A set holding `range` alone.
    pub fn of(range: Range<u64>) -> RangeSet {
        let mut set = RangeSet::new();
        set.insert(range);
        set
    }

    pub fn insert(&mut self, range: Range<u64>) {
        if range.is_empty() {
            return;
        }
        let (mut start, mut end) = (range.start, range.end);
        // Every range that touches or overlaps the new one is absorbed into it.
        let touching: Vec<(u64, u64)> = self
            .0
            .range(..=end)
            .rev()
            .take_while(|(_, e)| **e >= start)
            .map(|(s, e)| (*s, *e))
            .collect();
        for (s, e) in touching {
            self.0.remove(&s);
            start = start.min(s);
            end = end.max(e);
        }
        self.0.insert(start, end);
    }

    /// Drops everything at or past `end` (a file cut short).
    pub fn clip(&mut self, end: u64) {
        let cut: Vec<u64> = self
            .0
            .range(..)
            .filter(|(_, e)| **e > end)
            .map(|(s, _)| *s)
            .collect();
        for s in cut {
            self.0.remove(&s);
            if s < end {
                self.0.insert(s, end);
            }
        }
    }

    /// Whether any byte of `range` is in the set.
    pub fn intersects(&self, range: &Range<u64>) -> bool {
        !range.is_empty()
            && self
                .0
                .range(..range.end)
                .next_back()
                .is_some_and(|(_, e)| *e > range.start)
    }

    /// The parts of `range` not in the set, in order.
    pub fn gaps(&self, range: Range<u64>) -> Vec<Range<u64>> {
        let mut out = Vec::new();
        let mut at = range.start;
        let first = self
            .0
            .range(..=range.start)
            .next_back()
            .map(|(s, _)| *s)
            .unwrap_or(range.start);
        for (s, e) in self.0.range(first..range.end) {
            if *e <= at {
                continue;
            }
            if *s > at {
                out.push(at..(*s).min(range.end));
            }
            at = at.max(*e);
            if at >= range.end {
                break;
            }
        }
        if at < range.end {
            out.push(at..range.end);
        }
        out
    }

    /// Bytes in the set below `end`.
    pub fn len_below(&self, end: u64) -> u64 {
        self.0
            .iter()
            .take_while(|(s, _)| **s < end)
            .map(|(s, e)| (*e).min(end) - s)
            .sum()
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(set: &RangeSet) -> Vec<(u64, u64)> {
        set.0.iter().map(|(s, e)| (*s, *e)).collect()
    }

    #[test]
    fn inserts_merge_what_touches_and_keep_what_does_not() {
        let mut set = RangeSet::new();
        set.insert(10..20);
        set.insert(30..40);
        set.insert(20..25);
        assert_eq!(ranges(&set), [(10, 25), (30, 40)]);
        set.insert(5..35);
        assert_eq!(ranges(&set), [(5, 40)]);
        set.insert(0..0);
        set.insert(50..60);
        assert_eq!(ranges(&set), [(5, 40), (50, 60)]);
        assert_eq!(set.len_below(u64::MAX), 45);
        assert_eq!(set.len_below(55), 40);
    }

    #[test]
    fn gaps_are_what_a_range_lacks() {
        let mut set = RangeSet::new();
        set.insert(10..20);
        set.insert(30..40);
        assert_eq!(set.gaps(0..50), [0..10, 20..30, 40..50]);
        assert_eq!(set.gaps(12..18), Vec::<Range<u64>>::new());
        assert_eq!(set.gaps(15..35), vec![(20..30)]);
        assert_eq!(set.gaps(40..45), vec![(40..45)]);
        assert!(set.intersects(&(19..21)));
        assert!(!set.intersects(&(20..30)));
        assert!(set.intersects(&(0..11)));
        assert!(!set.intersects(&(5..5)));
    }

    #[test]
    fn clipping_cuts_what_lies_past_the_end() {
        let mut set = RangeSet::new();
        set.insert(10..20);
        set.insert(30..40);
        set.clip(35);
        assert_eq!(ranges(&set), [(10, 20), (30, 35)]);
        set.clip(15);
        assert_eq!(ranges(&set), [(10, 15)]);
        set.clip(10);
        assert!(set.is_empty());
    }
}
