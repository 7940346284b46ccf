//! libFuzzer target `tokens`: what it does with its input is `bodies::tokens`
//! (fuzz/bodies.rs, which the normal suite also runs over fuzz/regressions/tokens/).
#![no_main]

#[allow(dead_code)]
mod bodies {
    include!("../bodies.rs");
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| bodies::tokens(data));
