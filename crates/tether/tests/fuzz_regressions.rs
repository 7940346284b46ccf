//! Every input kept in `fuzz/regressions/TARGET/` (inputs that once found a
//! bug, and the seeds) goes through its fuzz target's code, the same code
//! the libFuzzer targets run (`fuzz/bodies.rs`, included here): none may
//! panic. The coverage-guided fuzzing itself is `scripts/fuzz`, outside the
//! test command (its instrumented build of every dependency takes about ten
//! minutes); a crash it finds is kept in `fuzz/regressions/` and then
//! replayed here on every run.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

#[allow(dead_code)]
mod bodies {
    include!("../../../fuzz/bodies.rs");
}

/// A fuzz target's name and its code.
type Target = (&'static str, fn(&[u8]));

/// Each target of `fuzz/Cargo.toml`.
const TARGETS: [Target; 5] = [
    ("envelope", bodies::envelope),
    ("sse", bodies::sse),
    ("tokens", bodies::tokens),
    ("sessionless", bodies::sessionless),
    ("config", bodies::config),
];

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

#[test]
fn every_input_kept_for_a_fuzz_target_passes_through_its_code() {
    for (target, code) in TARGETS {
        let dir = fuzz_dir().join("regressions").join(target);
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let mut inputs: Vec<PathBuf> = entries.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.is_file()).collect();
        inputs.sort();
        assert!(!inputs.is_empty(), "fuzz/regressions/{target}/ keeps no input: add at least a seed");
        for input in inputs {
            let data = std::fs::read(&input).unwrap_or_else(|e| panic!("{}: {e}", input.display()));
            // A panic here names the input through the test's output.
            eprintln!("{target}: {}", input.display());
            code(&data);
        }
    }
}

#[test]
fn every_fuzz_target_is_replayed_here() {
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).expect("fuzz/Cargo.toml");
    let manifest: toml::Table = toml::from_str(&manifest).expect("fuzz/Cargo.toml is TOML");
    let declared: BTreeSet<String> = manifest["bin"]
        .as_array()
        .expect("fuzz/Cargo.toml has [[bin]] targets")
        .iter()
        .filter_map(|bin| bin.get("name").and_then(toml::Value::as_str).map(str::to_owned))
        .collect();
    let replayed: BTreeSet<String> = TARGETS.iter().map(|(name, _)| (*name).to_owned()).collect();
    assert_eq!(declared, replayed, "a fuzz target of fuzz/Cargo.toml is not in this test's TARGETS, or the other way round");
}
