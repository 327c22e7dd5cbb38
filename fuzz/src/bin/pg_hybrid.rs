//! AFL++ harness for [`refract_fuzz::targets::pg_hybrid`] (docs/fuzzing.md).

fn main() {
    afl::fuzz!(|data: &[u8]| refract_fuzz::targets::pg_hybrid(data));
}
