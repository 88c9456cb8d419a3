//! Fault injection: a seeded random choice, per request, of a failure the real service (or the network)
//! can produce. Settable at start (`--fault-rate`) and at run time (`POST /_emulator/faults`).

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
}

impl Fault {
    pub const ALL: [(&'static str, Fault); 7] = [
        ("internal-error", Fault::InternalError),
        ("slow-down", Fault::SlowDown),
        ("reset-before-body", Fault::ResetBeforeBody),
        ("reset-mid-body", Fault::ResetMidBody),
        ("truncated-body", Fault::TruncatedBody),
        ("latency-spike", Fault::LatencySpike),
        ("expired-token", Fault::ExpiredToken),
    ];

    pub fn parse(name: &str) -> Option<Fault> {
        Fault::ALL.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
    }
}

pub struct Faults {
    config: FaultConfig,
    kinds: Vec<Fault>,
    rng: StdRng,
}

impl Faults {
    pub fn new(config: FaultConfig) -> Result<Faults, String> {
        if !(0.0..=1.0).contains(&config.rate) {
            return Err(format!("fault rate {} is not within 0..=1", config.rate));
        }
        let kinds = if config.kinds.is_empty() {
            Fault::ALL.iter().map(|(_, f)| *f).collect()
        } else {
            config
                .kinds
                .iter()
                .map(|k| Fault::parse(k).ok_or_else(|| format!("unknown fault kind {k:?}")))
                .collect::<Result<Vec<_>, _>>()?
        };
        let rng = StdRng::seed_from_u64(config.seed);
        Ok(Faults { config, kinds, rng })
    }

    pub fn config(&self) -> &FaultConfig {
        &self.config
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
        Some(self.kinds[self.rng.random_range(0..self.kinds.len())])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(Faults::new(config).unwrap().pick("PutObject"), None);
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
