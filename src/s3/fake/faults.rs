//! What the fake counts and what it can be told to do wrong: per-operation request counters, and a
//! [`FaultPlan`] that fails the next requests of an operation or holds its answers at a [`Gate`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

use crate::s3::ClientError;

/// One kind of request, as the service would see it (one per [`crate::s3::ObjectClient`] method that
/// reaches the bucket; `head_with_first_bytes` is a `Head` and a `Get` in the fake).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    HeadBucket,
    Head,
    List,
    Get,
    Put,
    Append,
    CreateUpload,
    UploadPart,
    UploadPartCopy,
    CompleteUpload,
    AbortUpload,
    Delete,
    Rename,
    Copy,
}

impl Op {
    pub const ALL: [Op; 14] = [
        Op::HeadBucket,
        Op::Head,
        Op::List,
        Op::Get,
        Op::Put,
        Op::Append,
        Op::CreateUpload,
        Op::UploadPart,
        Op::UploadPartCopy,
        Op::CompleteUpload,
        Op::AbortUpload,
        Op::Delete,
        Op::Rename,
        Op::Copy,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

/// Requests sent so far, per operation: a snapshot, so a test can take one before and one after.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts([u64; Op::ALL.len()]);

impl Counts {
    pub fn get(&self, op: Op) -> u64 {
        self.0[op.index()]
    }

    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// The requests sent between `earlier` and this snapshot.
    pub fn since(&self, earlier: &Counts) -> Counts {
        let mut out = Counts::default();
        for op in Op::ALL {
            out.0[op.index()] = self.get(op) - earlier.get(op);
        }
        out
    }
}

#[derive(Default)]
pub(super) struct Counters([AtomicU64; Op::ALL.len()]);

impl Counters {
    pub(super) fn add(&self, op: Op) {
        self.0[op.index()].fetch_add(1, Ordering::SeqCst);
    }

    pub(super) fn snapshot(&self) -> Counts {
        let mut out = Counts::default();
        for op in Op::ALL {
            out.0[op.index()] = self.0[op.index()].load(Ordering::SeqCst);
        }
        out
    }
}

/// Holds the answers of one operation: each waits (after the fake has done the work, so a held write has
/// already changed the bucket and a held listing shows the bucket from before a later change) until the
/// gate lets it through.
#[derive(Clone)]
pub struct Gate {
    permits: Arc<Semaphore>,
    waiting: Arc<AtomicUsize>,
}

impl Gate {
    fn new() -> Gate {
        Gate {
            permits: Arc::new(Semaphore::new(0)),
            waiting: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Lets `n` held (or future) answers through.
    pub fn release(&self, n: usize) {
        self.permits.add_permits(n);
    }

    /// Lets every answer through, now and from now on.
    pub fn open(&self) {
        // A closed semaphore refuses every acquire at once, which is exactly "no longer held".
        self.permits.close();
    }

    /// Answers waiting at the gate now.
    pub fn held(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    async fn pass(&self) {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        if let Ok(permit) = self.permits.acquire().await {
            permit.forget();
        }
        self.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Faults to inject, per operation. Failed requests still count as sent.
#[derive(Default)]
pub struct FaultPlan {
    inner: Mutex<Plan>,
}

#[derive(Default)]
struct Plan {
    failures: HashMap<Op, (u64, ClientError)>,
    /// Requests of an operation let through before its planned failures start.
    skips: HashMap<Op, u64>,
    gates: HashMap<Op, Gate>,
    /// First pages of listings still to answer empty, with a token to go on (as S3 may).
    empty_first_pages: u64,
}

impl FaultPlan {
    fn plan(&self) -> std::sync::MutexGuard<'_, Plan> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next `n` requests of `op` fail with `error` without touching the bucket (replaces an earlier
    /// plan for `op`).
    pub fn fail_next(&self, op: Op, n: u64, error: ClientError) {
        let mut plan = self.plan();
        plan.skips.remove(&op);
        if n == 0 {
            plan.failures.remove(&op);
        } else {
            plan.failures.insert(op, (n, error));
        }
    }

    /// As [`Self::fail_next`], once `skip` more requests of `op` have gone through untouched.
    pub fn fail_after(&self, op: Op, skip: u64, n: u64, error: ClientError) {
        self.fail_next(op, n, error);
        self.plan().skips.insert(op, skip);
    }

    /// The next `n` listings get an empty first page that still carries a continuation token: the service
    /// may answer so (a page's worth of keys it skipped), and only the token says there is more.
    pub fn empty_first_pages(&self, n: u64) {
        self.plan().empty_first_pages = n;
    }

    /// Whether this listing's first page is to be an empty one ([`Self::empty_first_pages`]).
    pub(super) fn take_empty_first_page(&self) -> bool {
        let mut plan = self.plan();
        let take = plan.empty_first_pages > 0;
        plan.empty_first_pages = plan.empty_first_pages.saturating_sub(1);
        take
    }

    /// Holds every later answer of `op` until the returned gate lets it through.
    pub fn hold(&self, op: Op) -> Gate {
        self.plan()
            .gates
            .entry(op)
            .or_insert_with(Gate::new)
            .clone()
    }

    /// The injected error for this request of `op`, if one is planned.
    pub(super) fn take_failure(&self, op: Op) -> Option<ClientError> {
        let mut plan = self.plan();
        if let Some(skip) = plan.skips.get_mut(&op)
            && *skip > 0
        {
            *skip -= 1;
            return None;
        }
        let (left, error) = plan.failures.get_mut(&op)?;
        *left -= 1;
        let error = error.clone();
        if *left == 0 {
            plan.failures.remove(&op);
        }
        Some(error)
    }

    /// Waits at the gate of `op`, if it has one.
    pub(super) async fn pass(&self, op: Op) {
        let gate = self.plan().gates.get(&op).cloned();
        if let Some(gate) = gate {
            gate.pass().await;
        }
    }
}

/// The error a request fails with when retries are exhausted: what most fault tests want.
pub fn transient() -> ClientError {
    ClientError::Transient {
        code: "InternalError".into(),
        message: "injected by the fake".into(),
    }
}
