//! Canned responses: errors carry a JSON body `{"error": …}` so that clients and operators see
//! whose fault a failure was.

use bytes::Bytes;

/// The reason phrase for the statuses refract produces itself.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Content Too Large",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}

/// A complete response with a body of the given content type.
pub fn response(status: u16, content_type: &str, body: &[u8], close: bool) -> Bytes {
    let conn = if close { "connection: close\r\n" } else { "" };
    // A 503 is always temporary: say when to come back (and not sooner).
    let retry = if status == 503 || status == 429 { "retry-after: 1\r\n" } else { "" };
    let mut out = format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n{retry}{conn}\r\n",
        reason(status),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    Bytes::from(out)
}

/// A JSON error response: `{"error": message, "status": status}` plus extra fields.
pub fn error(status: u16, message: &str, extra: &[(&str, &str)], close: bool) -> Bytes {
    let mut obj = serde_json::Map::new();
    obj.insert("error".into(), message.into());
    obj.insert("status".into(), status.into());
    for (k, v) in extra {
        obj.insert((*k).into(), (*v).into());
    }
    let body = serde_json::Value::Object(obj).to_string();
    response(status, "application/json", body.as_bytes(), close)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_reply_is_framed_json() {
        let r = error(503, "no backend available", &[("class", "read")], true);
        let text = std::str::from_utf8(&r).unwrap();
        assert!(text.starts_with("HTTP/1.1 503 Service Unavailable\r\n"));
        assert!(text.contains("connection: close\r\n"));
        assert!(text.contains("retry-after: 1\r\n"));
        let body = text.split("\r\n\r\n").nth(1).unwrap();
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"], "no backend available");
        assert_eq!(v["class"], "read");
        assert!(text.contains(&format!("content-length: {}\r\n", body.len())));
    }
}
