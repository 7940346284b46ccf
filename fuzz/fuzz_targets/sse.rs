//! The SSE decoder (`tether_wire::sse::Decoder`), which reads every stream a
//! peer sends the client, the bridge and the gateway: arbitrary bytes, cut
//! into chunks where the input says. Any panic, or an event larger than the
//! decoder's bound, is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tether_server::tether_wire::sse::Decoder;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, rest)) = data.split_first() else { return };
    let step = usize::from(cut).max(1);
    let mut decoder = Decoder::new();
    for chunk in rest.chunks(step) {
        if decoder.push(bytes::Bytes::copy_from_slice(chunk)).is_err() {
            break;
        }
    }
});
