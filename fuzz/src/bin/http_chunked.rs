//! AFL++ harness for [`refract_fuzz::targets::http_chunked`] (docs/fuzzing.md).

fn main() {
    afl::fuzz!(|data: &[u8]| refract_fuzz::targets::http_chunked(data));
}
