//! The PyTorch workloads (`--pytorch`): DataLoader over an expressfs mount against AWS's S3 Connector for
//! PyTorch, run by the Python driver bench/pytorch_bench.py in the venv that scripts/install-pytorch-peer.sh
//! makes. The driver starts its own emulator per TTFB (the data sets differ from the Rust workloads') and
//! prints its own table; without the venv the workloads are skipped with a note.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The venv's interpreter, if it has torch (the connector side is skipped by the driver when asked).
pub fn python(explicit: Option<&Path>) -> Option<PathBuf> {
    let python = explicit
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".venv-pytorch/bin/python"));
    python.is_file().then_some(python)
}

/// What to ask the driver for.
pub struct Run<'a> {
    pub python: &'a Path,
    pub expressfs: &'a Path,
    pub ttfb_ms: &'a str,
    pub rounds: u32,
    pub emulator_dir: Option<&'a Path>,
    pub expressfs_args: &'a [String],
    pub markdown: bool,
    /// Passed through last (data set sizes, `--no-connector`, `--connector-reader=range`, ...)
    pub extra: &'a [String],
}

/// The driver's command line (everything after the interpreter).
pub fn driver_args(run: &Run<'_>) -> Vec<String> {
    let mut args = vec![
        "bench/pytorch_bench.py".to_string(),
        format!("--ttfb-ms={}", run.ttfb_ms),
        format!("--rounds={}", run.rounds),
        format!("--expressfs={}", run.expressfs.display()),
        // The emulator binary is built next to expressfs (`cargo build --release -p expressfs-emulator`).
        format!(
            "--emulator={}",
            run.expressfs.with_file_name("expressfs-emulator").display()
        ),
    ];
    if let Some(dir) = run.emulator_dir {
        args.push(format!("--emulator-dir={}", dir.display()));
    }
    for a in run.expressfs_args {
        args.push(format!("--expressfs-arg={a}"));
    }
    if run.markdown {
        args.push("--markdown".into());
    }
    args.extend(run.extra.iter().cloned());
    args
}

/// Runs the driver; its table goes to our stdout, its progress to our stderr.
pub fn run(run: &Run<'_>) -> Result<()> {
    let status = Command::new(run.python)
        .args(driver_args(run))
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .status()
        .with_context(|| format!("starting {}", run.python.display()))?;
    if !status.success() {
        bail!("bench/pytorch_bench.py failed ({status})");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_gets_the_emulator_next_to_expressfs_and_every_extra_flag() {
        let extra = vec!["--max-prefetch=16M".to_string()];
        let passed = vec!["--no-connector".to_string()];
        let args = driver_args(&Run {
            python: Path::new("py"),
            expressfs: Path::new("target/release/expressfs"),
            ttfb_ms: "4,0",
            rounds: 3,
            emulator_dir: Some(Path::new("/dev/shm")),
            expressfs_args: &extra,
            markdown: true,
            extra: &passed,
        });
        assert_eq!(
            args,
            [
                "bench/pytorch_bench.py",
                "--ttfb-ms=4,0",
                "--rounds=3",
                "--expressfs=target/release/expressfs",
                "--emulator=target/release/expressfs-emulator",
                "--emulator-dir=/dev/shm",
                "--expressfs-arg=--max-prefetch=16M",
                "--markdown",
                "--no-connector",
            ]
        );
    }

    #[test]
    fn a_missing_venv_is_none() {
        assert_eq!(python(Some(Path::new("/nonexistent/bin/python"))), None);
    }
}
