//! Fault injection: a seeded random choice, per request, of a failure the real service (or the network)
//! can produce. Settable at start (`--fault-rate`) and at run time (`POST /_emulator/faults`).

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::FaultConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    InternalError,
    SlowDown,
    ResetBeforeBody,
    ResetMidBody,
    TruncatedBody,
    LatencySpike,
    ExpiredToken,
    /// A 200 whose XML document is cut off (or, for CompleteMultipartUpload, a 200 carrying an `<Error>`
    /// document, as the real service may send); operations without an XML answer get a 500 with a non-XML body.
    MalformedXml,
    /// A status no S3 operation documents (HTTP 418), with a body that is not XML.
    UnexpectedStatus,
    /// The request is held for 20 s before it is answered: a stalled server, for client timeouts.
    Stall,
    /// GetObject sends half its body, then nothing for 20 s (other operations: the connection is dropped).
    StallMidBody,
    /// 409 ConditionalRequestConflict for a conditional write (PutObject, CompleteMultipartUpload, CopyObject
    /// with If-Match / If-None-Match; a Complete also loses its upload), as if another writer had raced it.
    /// Requests without a write condition pass untouched.
    ConditionalConflict,
    /// The request is carried out, then its connection is dropped before a successful answer is sent: a write
    /// that landed while its client saw only a reset, and sends it again. Error answers go through.
    LostAnswer,
}

impl Fault {
    pub const ALL: [(&'static str, Fault); 13] = [
        ("internal-error", Fault::InternalError),
        ("slow-down", Fault::SlowDown),
        ("reset-before-body", Fault::ResetBeforeBody),
        ("reset-mid-body", Fault::ResetMidBody),
        ("truncated-body", Fault::TruncatedBody),
        ("latency-spike", Fault::LatencySpike),
        ("expired-token", Fault::ExpiredToken),
        ("malformed-xml", Fault::MalformedXml),
        ("unexpected-status", Fault::UnexpectedStatus),
        ("stall", Fault::Stall),
        ("stall-mid-body", Fault::StallMidBody),
        ("conditional-conflict", Fault::ConditionalConflict),
        ("lost-answer", Fault::LostAnswer),
    ];

    /// Kinds a plain `--fault-rate` mixes: the ones a client is expected to absorb by retrying. Malformed XML,
    /// odd statuses and stalls are opted into by name (`--fault-kind`), since they test failing loudly.
    pub const RETRYABLE: [Fault; 7] = [
        Fault::InternalError,
        Fault::SlowDown,
        Fault::ResetBeforeBody,
        Fault::ResetMidBody,
        Fault::TruncatedBody,
        Fault::LatencySpike,
        Fault::ExpiredToken,
    ];

    pub fn name(self) -> &'static str {
        Fault::ALL
            .iter()
            .find(|(_, f)| *f == self)
            .map(|(n, _)| *n)
            .unwrap_or("unknown")
    }

    pub fn parse(name: &str) -> Option<Fault> {
        Fault::ALL.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
    }
}

pub struct Faults {
    config: FaultConfig,
    kinds: Vec<Fault>,
    rng: StdRng,
    /// What was injected so far: (kind, operation) -> count; reported by `GET /_emulator/faults`.
    injected: BTreeMap<(&'static str, String), u64>,
}

impl Faults {
    pub fn new(config: FaultConfig) -> Result<Faults, String> {
        if !(0.0..=1.0).contains(&config.rate) {
            return Err(format!("fault rate {} is not within 0..=1", config.rate));
        }
        let kinds = if config.kinds.is_empty() {
            Fault::RETRYABLE.to_vec()
        } else {
            config
                .kinds
                .iter()
                .map(|k| Fault::parse(k).ok_or_else(|| format!("unknown fault kind {k:?}")))
                .collect::<Result<Vec<_>, _>>()?
        };
        let rng = StdRng::seed_from_u64(config.seed);
        Ok(Faults {
            config,
            kinds,
            rng,
            injected: BTreeMap::new(),
        })
    }

    /// Whether this request gets a fault, and which.
    pub fn pick(&mut self, operation: &str) -> Option<Fault> {
        if self.config.rate <= 0.0 {
            return None;
        }
        if !self.config.operations.is_empty()
            && !self.config.operations.iter().any(|o| o == operation)
        {
            return None;
        }
        if !self.rng.random_bool(self.config.rate) {
            return None;
        }
        let fault = self.kinds[self.rng.random_range(0..self.kinds.len())];
        *self
            .injected
            .entry((fault.name(), operation.to_string()))
            .or_default() += 1;
        Some(fault)
    }

    /// Takes back a picked fault that did not apply to the request (a `conditional-conflict` for a request
    /// without write conditions), so the report counts only what was injected.
    pub fn not_applied(&mut self, fault: Fault, operation: &str) {
        let key = (fault.name(), operation.to_string());
        if let Some(n) = self.injected.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.injected.remove(&key);
            }
        }
    }

    /// The configuration and the faults injected under it, as JSON.
    pub fn report(&self) -> serde_json::Value {
        let injected: Vec<serde_json::Value> = self
            .injected
            .iter()
            .map(|((kind, op), n)| serde_json::json!({"kind": kind, "operation": op, "count": n}))
            .collect();
        let total: u64 = self.injected.values().sum();
        serde_json::json!({
            "rate": self.config.rate,
            "seed": self.config.seed,
            "operations": self.config.operations,
            "kinds": self.config.kinds,
            "injected_total": total,
            "injected": injected,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditional_conflict_is_opt_in() {
        assert_eq!(
            Fault::parse("conditional-conflict"),
            Some(Fault::ConditionalConflict)
        );
        assert!(!Fault::RETRYABLE.contains(&Fault::ConditionalConflict));
        assert_eq!(Fault::parse("lost-answer"), Some(Fault::LostAnswer));
        assert!(!Fault::RETRYABLE.contains(&Fault::LostAnswer));
    }

    #[test]
    fn same_seed_same_faults_and_filters_apply() {
        let config = FaultConfig {
            rate: 0.5,
            seed: 7,
            operations: vec!["GetObject".into()],
            kinds: vec![],
        };
        let run = || {
            let mut f = Faults::new(config.clone()).unwrap();
            (0..200).map(|_| f.pick("GetObject")).collect::<Vec<_>>()
        };
        let a = run();
        assert_eq!(a, run());
        let hits = a.iter().filter(|f| f.is_some()).count();
        assert!((60..140).contains(&hits), "{hits}");
        assert_eq!(Faults::new(config.clone()).unwrap().pick("PutObject"), None);
        let mut f = Faults::new(config).unwrap();
        let picked = (0..100).filter_map(|_| f.pick("GetObject")).count() as u64;
        assert_eq!(f.report()["injected_total"], picked);
        assert!(picked > 0);
        // Plain --fault-rate mixes only kinds a client should absorb.
        let mixed = Faults::new(FaultConfig {
            rate: 1.0,
            ..Default::default()
        })
        .unwrap();
        assert!(!mixed.kinds.contains(&Fault::Stall));
        assert!(
            Faults::new(FaultConfig {
                rate: 1.0,
                kinds: vec!["stall".into(), "malformed-xml".into()],
                ..Default::default()
            })
            .is_ok()
        );
        assert!(
            Faults::new(FaultConfig {
                rate: 2.0,
                ..Default::default()
            })
            .is_err()
        );
        assert!(
            Faults::new(FaultConfig {
                kinds: vec!["nope".into()],
                ..Default::default()
            })
            .is_err()
        );
    }
}
