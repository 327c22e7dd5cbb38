//! Deferred bodies: how an agent lets its backend write a large result straight into the
//! client's socket (the agent's `pass_socket` option; docs/agent.md, "The backend writes
//! the result itself").
//!
//! Over a Unix socket between the agent and a backend on the same host:
//! 1. The agent adds `x-refract-defer: T` to the request: "if your result has at least T bytes,
//!    send the head only and wait".
//! 2. A backend that understands it and has such a result answers with its head plus
//!    `x-refract-deferred: 1` and nothing more. Any other backend just answers: the header
//!    is a request, never a requirement.
//! 3. The agent decides where the body goes and sends 4 bytes: [`SINK`] with the client's TCP
//!    socket attached (SCM_RIGHTS), or [`HERE`] (send it on this connection, as usual).
//! 4. After [`SINK`] the backend writes the whole body to the passed socket, closes its copy
//!    and reports with [`DONE`] or [`FAIL`] followed by the body bytes it wrote (u64,
//!    big-endian). The connection then carries the next request as usual.

/// The request header the agent adds: defer bodies of at least this many bytes.
pub const DEFER: &str = "x-refract-defer";
/// The response header of a deferred head.
pub const DEFERRED: &str = "x-refract-deferred";
/// Agent → backend: write the body to the socket attached to this message.
pub const SINK: [u8; 4] = *b"SINK";
/// Agent → backend: write the body on this connection.
pub const HERE: [u8; 4] = *b"HERE";
/// Backend → agent after [`SINK`]: the whole body was written.
pub const DONE: [u8; 4] = *b"DONE";
/// Backend → agent after [`SINK`]: writing the body failed (the client connection is
/// broken and must be closed).
pub const FAIL: [u8; 4] = *b"FAIL";
/// Length of a backend's report: the word and the byte count.
pub const REPORT_LEN: usize = 12;

/// The value of header `name` in the head at the start of `head` (request or response; names
/// compare case-insensitively), if the head parses and has it.
pub fn header_value<'a>(head: &'a [u8], name: &str) -> Option<&'a str> {
    let lines = head.split(|&b| b == b'\n').skip(1);
    for line in lines {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            return None;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else { continue };
        if line[..colon].eq_ignore_ascii_case(name.as_bytes()) {
            return std::str::from_utf8(&line[colon + 1..]).ok().map(str::trim);
        }
    }
    None
}

/// `request` (head of `head_len` bytes, then any body) with `name: value` added as the head's
/// last header.
pub fn with_header(request: &[u8], head_len: usize, name: &str, value: &str) -> Vec<u8> {
    let end = head_len.saturating_sub(2).min(request.len());
    let mut out = Vec::with_capacity(request.len() + name.len() + value.len() + 4);
    out.extend_from_slice(&request[..end]);
    out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    out.extend_from_slice(&request[end..]);
    out
}

/// The head `head` without its header lines named `name`, or `None` when it has none.
pub fn without_header(head: &[u8], name: &str) -> Option<Vec<u8>> {
    without_headers(head, &[name])
}

/// The head at the start of `head` without its header lines named any of `names` (compared
/// case-insensitively), or `None` when it has none. Bytes after the head's empty line are
/// kept as they are.
pub fn without_headers(head: &[u8], names: &[&str]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(head.len());
    let mut found = false;
    let mut first = true;
    let mut ended = false;
    for line in head.split_inclusive(|&b| b == b'\n') {
        ended |= !first && matches!(line, b"\r\n" | b"\n");
        let named = !first
            && !ended
            && line.iter().position(|&b| b == b':').is_some_and(|colon| {
                let name = &line[..colon];
                names.iter().any(|n| name.eq_ignore_ascii_case(n.as_bytes()))
            });
        first = false;
        if named {
            found = true;
        } else {
            out.extend_from_slice(line);
        }
    }
    found.then_some(out)
}

/// A backend's report after [`SINK`]: whether it wrote the whole body, and how many bytes.
pub fn parse_report(report: &[u8; REPORT_LEN]) -> Option<(bool, u64)> {
    let mut count = [0u8; 8];
    count.copy_from_slice(&report[4..]);
    let n = u64::from_be_bytes(count);
    match &report[..4] {
        w if w == DONE => Some((true, n)),
        w if w == FAIL => Some((false, n)),
        _ => None,
    }
}

/// The report a backend sends after [`SINK`].
pub fn report(done: bool, bytes: u64) -> [u8; REPORT_LEN] {
    let mut out = [0u8; REPORT_LEN];
    out[..4].copy_from_slice(if done { &DONE } else { &FAIL });
    out[4..].copy_from_slice(&bytes.to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\nX-Refract-Deferred: 1\r\n\r\nbody";

    #[test]
    fn header_values_are_found_by_name_in_the_head_only() {
        assert_eq!(header_value(HEAD, DEFERRED), Some("1"));
        assert_eq!(header_value(HEAD, "content-length"), Some("9"));
        assert_eq!(header_value(HEAD, "body"), None);
        assert_eq!(header_value(b"GET / HTTP/1.1\r\nhost: a\r\n\r\nx-refract-defer: 1\r\n", DEFER), None);
        assert_eq!(header_value(b"GET /x-refract-defer: HTTP/1.1\r\n\r\n", DEFER), None, "not the request line");
    }

    #[test]
    fn a_header_is_added_last_and_the_body_kept() {
        let req = b"POST /q HTTP/1.1\r\ncontent-length: 2\r\n\r\nab";
        let out = with_header(req, req.len() - 2, DEFER, "65536");
        assert_eq!(out, b"POST /q HTTP/1.1\r\ncontent-length: 2\r\nx-refract-defer: 65536\r\n\r\nab");
        assert_eq!(header_value(&out, DEFER), Some("65536"));
    }

    #[test]
    fn a_header_is_removed_whatever_its_case() {
        let head = &HEAD[..HEAD.len() - 4];
        assert_eq!(without_header(head, DEFERRED).unwrap(), b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n");
        assert_eq!(without_header(b"HTTP/1.1 200 OK\r\n\r\n", DEFERRED), None);
    }

    #[test]
    fn several_names_are_removed_and_the_body_is_left_alone() {
        let req = b"POST /x-refract-defer: HTTP/1.1\r\nX-Refract-Defer: 1\r\nhost: a\r\nx-refract-handover: 2\r\n\r\nx-refract-defer: 3\r\n";
        let out = without_headers(req, &[DEFER, "x-refract-handover"]).unwrap();
        assert_eq!(out, b"POST /x-refract-defer: HTTP/1.1\r\nhost: a\r\n\r\nx-refract-defer: 3\r\n");
        assert_eq!(without_headers(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n", &[DEFER, DEFERRED]), None);
    }

    #[test]
    fn reports_round_trip_and_garbage_is_refused() {
        assert_eq!(parse_report(&report(true, 1 << 40)), Some((true, 1 << 40)));
        assert_eq!(parse_report(&report(false, 7)), Some((false, 7)));
        assert_eq!(parse_report(b"HTTP/1.1 200"), None);
    }
}
