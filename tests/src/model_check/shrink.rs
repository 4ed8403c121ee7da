//! Making a failing history smaller: drop a block of operations, play the rest, keep it if it
//! still fails; blocks of half the operations first, then quarters, down to one at a time.
//! Each try plays real services, so the caller bounds how many it makes.

use super::history::History;

/// Where a shrink stands: the smallest failing history so far and the next block to drop.
pub struct Shrinker {
    best: History,
    block: usize,
    at: usize,
}

impl Shrinker {
    pub fn new(failing: History) -> Self {
        let block = (failing.ops.len() / 2).max(1);
        Self {
            best: failing,
            block,
            at: 0,
        }
    }

    /// The smallest failing history found.
    pub fn best(&self) -> &History {
        &self.best
    }

    /// The next history to try, or none when no block is left to drop.
    pub fn candidate(&self) -> Option<History> {
        if self.at >= self.best.ops.len() || self.best.ops.len() <= 1 {
            return None;
        }
        let mut candidate = self.best.clone();
        let end = (self.at + self.block).min(candidate.ops.len());
        candidate.ops.drain(self.at..end);
        (!candidate.ops.is_empty()).then_some(candidate)
    }

    /// What the candidate did: a failing one is the new best, and the same place is tried
    /// again on it; otherwise the next block is.
    pub fn tried(&mut self, candidate: History, failed: bool) {
        if failed {
            self.best = candidate;
        } else {
            self.at += self.block;
        }
        if self.at >= self.best.ops.len() && self.block > 1 {
            self.block /= 2;
            self.at = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model_check::history::Op;

    fn history(n: u64) -> History {
        History {
            seed: 1,
            runs: vec!["L".into()],
            ops: (0..n).map(|ms| Op::Wait { ms }).collect(),
        }
    }

    /// Shrinks `h` against `fails`, the test a real run stands in for; the tries it took.
    fn shrink(h: History, fails: impl Fn(&History) -> bool) -> (History, usize) {
        let mut shrinker = Shrinker::new(h);
        let mut tries = 0;
        while let Some(candidate) = shrinker.candidate() {
            tries += 1;
            let failed = fails(&candidate);
            shrinker.tried(candidate, failed);
        }
        (shrinker.best().clone(), tries)
    }

    #[test]
    fn a_failure_needing_two_operations_shrinks_to_those_two() {
        let needs = |h: &History| {
            let has = |ms| h.ops.contains(&Op::Wait { ms });
            has(3) && has(11)
        };
        let (best, tries) = shrink(history(16), needs);
        assert_eq!(best.ops, [Op::Wait { ms: 3 }, Op::Wait { ms: 11 }]);
        assert!(tries < 40, "{tries} tries");
    }

    #[test]
    fn a_failure_of_any_history_shrinks_to_one_operation() {
        let (best, _) = shrink(history(9), |_| true);
        assert_eq!(best.ops.len(), 1);
    }
}
