//! The config file's upstream tables (`[upstreams.NAME]`, TOML) and the
//! `--upstream NAME=TARGET` flag, both read from what operators write:
//! errors, never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tether_gateway::config::{UpstreamTable, parse_flag};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = parse_flag(text);
    #[derive(serde::Deserialize)]
    struct File {
        #[serde(default)]
        upstreams: std::collections::BTreeMap<String, UpstreamTable>,
    }
    if let Ok(file) = toml::from_str::<File>(text) {
        for (name, table) in file.upstreams {
            let _ = table.into_config(&name);
        }
    }
});
