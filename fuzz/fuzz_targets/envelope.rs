//! libFuzzer target `envelope`: what it does with its input is `bodies::envelope`
//! (fuzz/bodies.rs, which the normal suite also runs over fuzz/regressions/envelope/).
#![no_main]

#[allow(dead_code)]
mod bodies {
    include!("../bodies.rs");
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| bodies::envelope(data));
