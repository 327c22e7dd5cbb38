//! AFL++ harness for [`refract_fuzz::targets::peer_cancel`] (docs/fuzzing.md).

fn main() {
    afl::fuzz!(|data: &[u8]| refract_fuzz::targets::peer_cancel(data));
}
