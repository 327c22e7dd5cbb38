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

/// The value of the first `/* refract: shard=N */` comment of `sql` (any spacing, any case of
/// `refract` and `shard`; the value as written, without surrounding quotes; empty if none
/// follows the `=`).
///
/// Unlike [`find`], this follows PostgreSQL's lexical rules: a comment inside a string
/// literal (`'...'`, `E'...'`, `$tag$...$tag$`) or a quoted identifier does not count, nor
/// does one after `--`; block comments nest. A shard hint moves data, so a literal that
/// happens to look like one must not.
pub(super) fn shard(sql: &str) -> Option<String> {
    if !sql.contains("/*") {
        return None;
    }
    comments(sql).find_map(shard_value)
}

/// `refract: shard=VALUE` (a comment's body).
fn shard_value(body: &str) -> Option<String> {
    let body = body.trim();
    let body = strip_word(body, "refract")?.trim_start().strip_prefix(':')?.trim_start();
    let value = strip_word(body, "shard")?.trim_start().strip_prefix('=')?.trim();
    let value = value.split_whitespace().next().unwrap_or("");
    let unquoted =
        ['\'', '"'].iter().find_map(|q| value.strip_prefix(*q).and_then(|v| v.strip_suffix(*q))).unwrap_or(value);
    Some(unquoted.to_owned())
}

/// `s` without its leading `word` (ASCII case-insensitive).
fn strip_word<'a>(s: &'a str, word: &str) -> Option<&'a str> {
    let head = s.get(..word.len())?;
    head.eq_ignore_ascii_case(word).then(|| &s[word.len()..])
}

/// The bodies of the top-level block comments of `sql`, skipping string literals, quoted
/// identifiers, dollar-quoted strings and line comments (PostgreSQL's lexer, `scan.l`).
fn comments(sql: &str) -> impl Iterator<Item = &str> {
    let b = sql.as_bytes();
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < b.len() {
            let c = b[i];
            let ident = |j: usize| j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_' || b[j] >= 0x80);
            match c {
                b'/' if b.get(i + 1) == Some(&b'*') => {
                    let start = i + 2;
                    let (mut depth, mut j) = (1usize, start);
                    while j < b.len() && depth > 0 {
                        if b[j] == b'/' && b.get(j + 1) == Some(&b'*') {
                            depth += 1;
                            j += 2;
                        } else if b[j] == b'*' && b.get(j + 1) == Some(&b'/') {
                            depth -= 1;
                            j += 2;
                        } else {
                            j += 1;
                        }
                    }
                    let end = if depth == 0 { j - 2 } else { b.len() };
                    i = j;
                    return sql.get(start..end);
                }
                b'-' if b.get(i + 1) == Some(&b'-') => {
                    i = b[i..].iter().position(|&x| x == b'\n').map_or(b.len(), |n| i + n + 1);
                }
                b'\'' | b'"' => {
                    // E'...' (not part of a longer word) takes backslash escapes.
                    let escapes = c == b'\''
                        && i > 0
                        && b[i - 1].eq_ignore_ascii_case(&b'e')
                        && !(i > 1 && (ident(i - 2) || b[i - 2] == b'$'));
                    let mut j = i + 1;
                    while j < b.len() {
                        if escapes && b[j] == b'\\' {
                            j += 2;
                        } else if b[j] == c {
                            if b.get(j + 1) == Some(&c) {
                                j += 2;
                            } else {
                                break;
                            }
                        } else {
                            j += 1;
                        }
                    }
                    i = j + 1;
                }
                b'$' if i == 0 || !(ident(i - 1) || b[i - 1] == b'$') => {
                    // $tag$ ... $tag$ (the tag: an identifier not starting with a digit, or empty).
                    let tag_end = b[i + 1..].iter().position(|&x| !(ident_byte(x))).map(|n| i + 1 + n);
                    let is_tag = tag_end.is_some_and(|e| b[e] == b'$' && !b.get(i + 1).is_some_and(u8::is_ascii_digit));
                    match tag_end.filter(|_| is_tag) {
                        Some(e) => {
                            let tag = &b[i..=e];
                            let body = e + 1;
                            i = b[body..]
                                .windows(tag.len())
                                .position(|w| w == tag)
                                .map_or(b.len(), |n| body + n + tag.len());
                        }
                        None => i += 1,
                    }
                }
                _ => i += 1,
            }
        }
        None
    })
}

fn ident_byte(x: u8) -> bool {
    x.is_ascii_alphanumeric() || x == b'_' || x >= 0x80
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
    fn finds_the_shard_hint_outside_literals() {
        let s = |sql: &str| shard(sql);
        assert_eq!(s("/* refract: shard=1 */ select 1"), Some("1".into()));
        assert_eq!(s("select 1 /*REFRACT:Shard = s1*/"), Some("s1".into()), "case and spaces");
        assert_eq!(s("/*  refract :  shard  =  s0  */ insert into t values (1)"), Some("s0".into()));
        assert_eq!(s("/* refract: shard='s1' */ select 1"), Some("s1".into()), "quoted");
        assert_eq!(s("/* refract: shard= */ select 1"), Some(String::new()), "no value: refused later");
        assert_eq!(s("/* refract: shard=x y */ select 1"), Some("x".into()));
        assert_eq!(s("/* app */ select /* refract: explain */ /* refract: shard=2 */ 1"), Some("2".into()));
        assert_eq!(s("/* refract: route=primary */ select 1"), None);
        assert_eq!(s("/* refract: sharding=1 */ select 1"), None, "another word");
        assert_eq!(s("select 1"), None);
        // Not a comment: in literals, quoted identifiers, line comments, dollar quotes.
        assert_eq!(s("select '/* refract: shard=1 */'"), None);
        assert_eq!(s("select 'it''s /* refract: shard=1 */'"), None);
        assert_eq!(s("select E'\\' /* refract: shard=1 */'"), None, "E'' escapes its quote");
        assert_eq!(s("select 'a\\' /* refract: shard=1 */"), Some("1".into()), "standard strings do not");
        assert_eq!(s("select \"/* refract: shard=1 */\" from t"), None);
        assert_eq!(s("select 1 -- /* refract: shard=1 */"), None);
        assert_eq!(s("select $$ /* refract: shard=1 */ $$"), None);
        assert_eq!(s("select $q$ $$ /* refract: shard=1 */ $q$"), None);
        assert_eq!(s("select $q$ x $q$ /* refract: shard=3 */"), Some("3".into()));
        assert_eq!(s("select $1 /* refract: shard=4 */"), Some("4".into()), "a parameter is no quote");
        assert_eq!(s("select a$b /* refract: shard=5 */"), Some("5".into()), "$ inside a name");
        assert_eq!(s("/* outer /* refract: shard=1 */ */ select 1"), None, "nested: not the top comment");
        assert_eq!(s("/* refract: shard=1"), Some("1".into()), "unterminated comment");
        assert_eq!(s("select 'unterminated /* refract: shard=1 */"), None);
        assert_eq!(s("select é /* refract: shard=é */"), Some("é".into()));
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
