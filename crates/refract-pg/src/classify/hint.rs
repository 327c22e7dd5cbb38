//! Routing hints in comments: `/* refract: route=primary */` (or `replica`, `auto`).

use super::RouteHint;

/// The first refract hint in a block comment of `sql`, if any.
///
/// This is a text scan: a string literal that looks like such a comment also counts, which
/// only ever moves a query between primary and replica at the author's request.
pub(super) fn find(sql: &str) -> Option<RouteHint> {
    let mut rest = sql;
    while let Some(start) = rest.find("/*") {
        let after = &rest[start + 2..];
        let end = after.find("*/").unwrap_or(after.len());
        if let Some(h) = parse_comment(&after[..end]) {
            return Some(h);
        }
        rest = &after[end..];
    }
    None
}

/// Whether a block comment of `sql` says `refract: explain` (a text scan, as [`find`]).
pub(super) fn explain(sql: &str) -> bool {
    let mut rest = sql;
    while let Some(start) = rest.find("/*") {
        let after = &rest[start + 2..];
        let end = after.find("*/").unwrap_or(after.len());
        let body = after[..end].trim();
        let said = body.strip_prefix("refract").map(|b| b.trim_start()).and_then(|b| b.strip_prefix(':'));
        if said.is_some_and(|b| b.trim().eq_ignore_ascii_case("explain")) {
            return true;
        }
        rest = &after[end..];
    }
    false
}

/// `refract: route=X` with any spacing.
fn parse_comment(body: &str) -> Option<RouteHint> {
    let body = body.trim().strip_prefix("refract")?.trim_start().strip_prefix(':')?.trim_start();
    let value = body.strip_prefix("route")?.trim_start().strip_prefix('=')?;
    RouteHint::parse(value.split_whitespace().next()?)
}

/// `SET [SESSION|LOCAL] refract.route {=|TO} primary` alone: PostgreSQL's grammar refuses it
/// because PRIMARY is a reserved word, but users will write it, and it is for refract anyway.
pub(super) fn unquoted_route_setting(sql: &str) -> Option<RouteHint> {
    let lower = sql.trim().trim_end_matches(';').to_ascii_lowercase();
    let mut words = lower.split_whitespace().peekable();
    (words.next()? == "set").then_some(())?;
    words.next_if(|w| *w == "session" || *w == "local");
    let rest: String = words.collect::<Vec<_>>().join(" ");
    let value = rest.strip_prefix("refract.route")?.trim_start();
    let value = value.strip_prefix('=').or_else(|| value.strip_prefix("to "))?.trim();
    RouteHint::parse(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_explain_hint() {
        assert!(explain("/* refract: explain */ select 1"));
        assert!(explain("select /*refract:EXPLAIN*/ 1"));
        assert!(!explain("/* refract: route=primary */ select 1"));
        assert!(!explain("select 'refract: explain'"));
    }

    #[test]
    fn finds_hints() {
        assert_eq!(find("/* refract: route=primary */ SELECT 1"), Some(RouteHint::Primary));
        assert_eq!(find("SELECT 1 /*refract:route=replica*/"), Some(RouteHint::Replica));
        assert_eq!(find("/* app */ select /* refract : route = auto */ 1"), Some(RouteHint::Auto));
        assert_eq!(find("/* refract: route=nowhere */ SELECT 1"), None);
        assert_eq!(find("SELECT 1 /* refract: route=primary"), Some(RouteHint::Primary), "unterminated comment");
        assert_eq!(find("SELECT '/*' || 'x'"), None);
        assert_eq!(find("-- refract: route=primary\nSELECT 1"), None, "only block comments");
    }
}
