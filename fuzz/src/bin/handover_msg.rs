//! AFL++ harness for [`refract_fuzz::targets::handover_msg`] (docs/fuzzing.md).

fn main() {
    afl::fuzz!(|data: &[u8]| refract_fuzz::targets::handover_msg(data));
}
