//! libFuzzer target `sse`: what it does with its input is `bodies::sse`
//! (fuzz/bodies.rs, which the normal suite also runs over fuzz/regressions/sse/).
#![no_main]

#[allow(dead_code)]
mod bodies {
    include!("../bodies.rs");
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| bodies::sse(data));
