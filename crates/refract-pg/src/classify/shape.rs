//! A query's *shape*: its text with numeric and plain string literals replaced by markers, so
//! that `SELECT abalance FROM pgbench_accounts WHERE aid = 42` and `… = 43` share one cache
//! entry instead of costing a parse each (literal-heavy traffic such as `pgbench -S` in simple
//! mode would otherwise miss the cache every time).
//!
//! Why a literal's value cannot change a classification that the shape cache stores: the
//! classifier looks at statement kinds, `FOR UPDATE/SHARE`, `INTO` and function *names*, never
//! at constant values, and PostgreSQL's raw parser does not validate constants (`'x'::int`
//! parses; it fails only at execution). What could differ is kept out: statements that carry
//! their text or a constant (SET, PREPARE, `SET refract.route`) are not shape-cached (only all
//! Read / all-Write-kind classifications are, see `Classifier::classify`), and texts the lexer
//! here is not sure about get no shape at all:
//!
//! - `E'…'`, `U&'…'`, `B'…'`, `X'…'`, `N'…'` strings (escapes and digits the parser checks) and
//!   dollar-quoted strings;
//! - a number touching an identifier character or a second `.` (`1e`, `1.2.3`, `0x1F`, `1_000`:
//!   what those mean depends on the PostgreSQL version), and unterminated strings, quoted
//!   identifiers or comments;
//! - `U&"…"` identifiers (escapes could spell any name), and any text containing `refract`
//!   (routing hints are read from the raw text, string literals included).
//!
//! Literals are replaced by a NUL byte and a kind letter: PostgreSQL query texts cannot contain
//! NUL, so a shape never equals a real query text. Comments and quoted identifiers are copied
//! verbatim, with everything else.

/// The shape of `sql`, or `None` when it has no literal to replace or is not certainly lexed.
pub(super) fn of(sql: &str) -> Option<String> {
    replace_literals(sql, |out, kind, _| {
        out.push('\0');
        out.push(kind);
    })
}

/// `sql` with its literals replaced by parameters `$1`, `$2`, … in order, and each literal's
/// value as PostgreSQL's text form (a string's quotes removed, `''` made one quote): the same
/// statement as a prepared one and its parameters. `None` as for [`of`], and when `sql` has
/// parameters of its own.
pub fn parameterized(sql: &str) -> Option<(String, Vec<String>)> {
    if sql.as_bytes().windows(2).any(|w| w[0] == b'$' && w[1].is_ascii_digit()) {
        return None;
    }
    let mut values = vec![];
    let text = replace_literals(sql, |out, kind, lit| {
        values.push(match kind {
            's' => lit[1..lit.len() - 1].replace("''", "'"),
            _ => lit.to_owned(),
        });
        out.push('$');
        out.push_str(&values.len().to_string());
    })?;
    Some((text, values))
}

/// `sql` with each literal replaced by what `emit(out, kind, literal)` appends (`kind`: `s` a
/// string, `n` a number); `None` when there is none or the text is not certainly lexed.
fn replace_literals(sql: &str, mut emit: impl FnMut(&mut String, char, &str)) -> Option<String> {
    if sql.contains("refract") || sql.contains('\0') {
        return None;
    }
    let b = sql.as_bytes();
    let mut out = String::with_capacity(sql.len());
    let mut replaced = false;
    let mut copied = 0; // b[copied..i] is still to be copied
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let prev = if i > 0 { b[i - 1] } else { b' ' };
        match c {
            b'\'' => {
                if is_ident(prev) || prev == b'&' {
                    return None; // E'…', B'…', X'…', N'…', U&'…'
                }
                let end = string_end(b, i)?;
                out.push_str(&sql[copied..i]);
                emit(&mut out, 's', &sql[i..end]);
                replaced = true;
                i = end;
                copied = i;
            }
            b'"' => {
                if prev == b'&' {
                    return None; // U&"…"
                }
                i = quoted_ident_end(b, i)?;
            }
            b'-' if b.get(i + 1) == Some(&b'-') => {
                i = b[i..].iter().position(|&x| x == b'\n').map_or(b.len(), |p| i + p + 1);
            }
            b'/' if b.get(i + 1) == Some(&b'*') => i = block_comment_end(b, i)?,
            b'$' => {
                // `$1` (a parameter) is copied; `$tag$…$tag$` and `$$…$$` are not lexed here.
                match b.get(i + 1) {
                    Some(d) if d.is_ascii_digit() => i = skip_while(b, i + 1, |x| x.is_ascii_digit()),
                    _ if is_ident(prev) => i += 1, // inside an identifier (`a$b`)
                    _ => return None,
                }
            }
            b'0'..=b'9' if !is_ident(prev) && prev != b'.' && prev != b'$' => {
                let end = number_end(b, i)?;
                out.push_str(&sql[copied..i]);
                emit(&mut out, 'n', &sql[i..end]);
                replaced = true;
                i = end;
                copied = i;
            }
            _ if is_ident(c) => i = skip_while(b, i, is_ident),
            _ => i += 1,
        }
    }
    if !replaced {
        return None;
    }
    out.push_str(&sql[copied..]);
    Some(out)
}

/// Identifier characters as PostgreSQL's lexer sees them (bytes of non-ASCII characters too).
fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80
}

fn skip_while(b: &[u8], mut i: usize, f: impl Fn(u8) -> bool) -> usize {
    while i < b.len() && f(b[i]) {
        i += 1;
    }
    i
}

/// The end (exclusive) of the `'…'` string starting at `start` (`''` is a quote inside it).
/// Strings separated only by whitespace with a newline are one literal in SQL; the follow-on
/// part is simply lexed as another string here, which is just as well.
fn string_end(b: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    loop {
        match b.get(i)? {
            b'\'' if b.get(i + 1) == Some(&b'\'') => i += 2,
            b'\'' => return Some(i + 1),
            _ => i += 1,
        }
    }
}

fn quoted_ident_end(b: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    loop {
        match b.get(i)? {
            b'"' if b.get(i + 1) == Some(&b'"') => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
}

/// Block comments nest in PostgreSQL.
fn block_comment_end(b: &[u8], start: usize) -> Option<usize> {
    let (mut depth, mut i) = (0usize, start);
    loop {
        match (b.get(i)?, b.get(i + 1)) {
            (b'/', Some(b'*')) => {
                depth += 1;
                i += 2;
            }
            (b'*', Some(b'/')) => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => i += 1,
        }
    }
}

/// `123`, `1.5`, `1.`, `1e10`, `1.5E-3`; `None` when anything identifier-like or another
/// `.` follows (left to the parser).
fn number_end(b: &[u8], start: usize) -> Option<usize> {
    let mut i = skip_while(b, start, |x| x.is_ascii_digit());
    if b.get(i) == Some(&b'.') && b.get(i + 1) != Some(&b'.') {
        i = skip_while(b, i + 1, |x| x.is_ascii_digit());
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        let mut j = i + 1;
        if matches!(b.get(j), Some(b'+' | b'-')) {
            j += 1;
        }
        if !b.get(j).is_some_and(u8::is_ascii_digit) {
            return None;
        }
        i = skip_while(b, j, |x| x.is_ascii_digit());
    }
    match b.get(i) {
        Some(&c) if is_ident(c) || c == b'.' => None,
        _ => Some(i),
    }
}

#[cfg(test)]
mod tests {
    use super::of;

    #[test]
    fn literals_become_markers() {
        let a = of("SELECT abalance FROM pgbench_accounts WHERE aid = 42;").expect("shape");
        assert_eq!(a, "SELECT abalance FROM pgbench_accounts WHERE aid = \0n;");
        assert_eq!(of("SELECT abalance FROM pgbench_accounts WHERE aid = 987654;").as_deref(), Some(a.as_str()));
        assert_eq!(
            of("SELECT * FROM t WHERE s = 'it''s' AND x > 1.5e-3").as_deref(),
            Some("SELECT * FROM t WHERE s = \0s AND x > \0n")
        );
        assert_eq!(of("SELECT -5, 3.").as_deref(), Some("SELECT -\0n, \0n"));
    }

    #[test]
    fn identifiers_parameters_and_comments_are_kept() {
        assert_eq!(of("SELECT t1.c2 FROM t1 WHERE x = $1").as_deref(), None, "nothing to replace");
        assert_eq!(
            of("SELECT \"col 1\", a$b FROM t /* 42 'x' /* nested */ 7 */ WHERE y = 7 -- 8\n").as_deref(),
            Some("SELECT \"col 1\", a$b FROM t /* 42 'x' /* nested */ 7 */ WHERE y = \0n -- 8\n")
        );
        assert_eq!(
            of("SELECT \"it\"\"s 5\" FROM t WHERE a = 'q'").as_deref(),
            Some("SELECT \"it\"\"s 5\" FROM t WHERE a = \0s")
        );
        assert_eq!(of("SELECT é1 FROM t WHERE a = 2").as_deref(), Some("SELECT é1 FROM t WHERE a = \0n"));
    }

    #[test]
    fn unsure_texts_have_no_shape() {
        for sql in [
            "SELECT E'\\u12'",
            "SELECT e'x', 1",
            "SELECT B'102', 1",
            "SELECT X'1G', 1",
            "SELECT N'x', 1",
            "SELECT U&'\\0061', 1",
            "SELECT U&\"nextv\\0061l\"('s'), 1",
            "SELECT $$x$$, 1",
            "SELECT $q$x$q$, 1",
            "SELECT 1e",
            "SELECT 1e+",
            "SELECT 1.2.3",
            "SELECT 1..2",
            "SELECT 0x1F",
            "SELECT 1_000",
            "SELECT 12abc",
            "SELECT 'unterminated",
            "SELECT \"unterminated, 1",
            "SELECT 1 /* unterminated",
            "/* refract: route=primary */ SELECT 1",
            "SELECT '/* refract: route=replica */', 1",
        ] {
            assert_eq!(of(sql), None, "{sql}");
        }
    }

    #[test]
    fn literals_become_parameters_with_their_values() {
        use super::parameterized;
        let (text, values) = parameterized("SELECT a FROM t WHERE id = 42 AND name = 'O''Brien'").unwrap();
        assert_eq!(text, "SELECT a FROM t WHERE id = $1 AND name = $2");
        assert_eq!(values, vec!["42".to_owned(), "O'Brien".to_owned()]);
        assert_eq!(parameterized("SELECT 1 WHERE x = $1"), None, "parameters of its own");
        assert_eq!(parameterized("SELECT a FROM t"), None, "no literal");
    }
}
