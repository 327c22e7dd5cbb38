//! The rows of `COPY ... FROM STDIN` data, found incrementally as the client's CopyData
//! messages arrive (a row may span several messages, a message may hold many rows), and one
//! field of a row read as PostgreSQL reads it. A sharded front end uses this to send each row
//! to the shard its key names (docs/sharding.md).
//!
//! The rules are PostgreSQL's (`copyfromparse.c`, `CopyReadLineText` and
//! `CopyReadAttributes{Text,CSV}`):
//! - **text**: a row ends at a newline (`\n` or `\r\n`); a backslash takes the next byte
//!   literally, a newline included; fields are split by the delimiter; a field whose raw text
//!   is the NULL string (`\N`) is NULL, others are de-escaped (`\t`, `\101`, `\x41`, ...).
//! - **csv**: a row ends at a newline outside quotes; inside quotes the escape character
//!   (default: the quote itself, so `""`) makes the next quote or escape literal; an unquoted
//!   field equal to the NULL string (default: empty) is NULL, a quoted one never is (unless
//!   FORCE_NULL); FORCE_NOT_NULL reads an unquoted NULL string as its text.
//! - a row that is exactly `\.` ends the data (both formats, PostgreSQL up to 17; from 18 only
//!   text: `end_marker`); what follows is ignored, as the server ignores it.
//! - a carriage return outside quotes (not escaped in text) must be followed by `\n`: files
//!   with bare `\r` line ends are refused here rather than split wrongly.
//!
//! Splitting never changes a byte: the pieces [`Rows`] returns, joined, are the input up to and
//! including the end marker (a fuzz target checks it).

use bytes::{Bytes, BytesMut};

/// How the COPY's data is written (its options).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyFormat {
    /// `FORMAT csv` (else text).
    pub csv: bool,
    /// DELIMITER: tab (text) or comma (csv) by default.
    pub delimiter: u8,
    /// QUOTE (csv): `"` by default.
    pub quote: u8,
    /// ESCAPE (csv): the quote by default.
    pub escape: u8,
    /// NULL: `\N` (text) or empty (csv) by default.
    pub null: Vec<u8>,
    /// HEADER: the first row is a header line, not data.
    pub header: bool,
    /// A row `\.` ends the data (text always; csv up to PostgreSQL 17).
    pub end_marker: bool,
}

impl CopyFormat {
    /// PostgreSQL's defaults for text (`csv: false`) or csv.
    pub fn new(csv: bool) -> CopyFormat {
        CopyFormat {
            csv,
            delimiter: if csv { b',' } else { b'\t' },
            quote: b'"',
            escape: b'"',
            null: if csv { vec![] } else { b"\\N".to_vec() },
            header: false,
            end_marker: true,
        }
    }
}

/// One piece of the data, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// The header line (HEADER), with its line end.
    Header(Bytes),
    /// A data row, with its line end (none for a last row the data ends without one).
    Row(Bytes),
    /// The end marker `\.` and its line end; what follows is not data.
    End(Bytes),
}

/// Why data cannot be split (SQLSTATE 22P04, `bad_copy_file_format`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowError(pub String);

impl std::fmt::Display for RowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The line end style, fixed by the first line as PostgreSQL fixes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Eol {
    Nl,
    CrNl,
}

/// What follows a backslash that may start the end marker.
enum Marker {
    /// More data is needed to tell.
    More,
    /// Not the marker: data.
    Not,
    /// The marker, this many bytes from the backslash on.
    Is(usize),
    /// PostgreSQL refuses it (text format).
    Bad(&'static str),
}

/// The incremental row scanner: [`Rows::push`] data and take [`Rows::next_piece`] pieces until
/// `None` (more data needed); at the end of the data [`Rows::finish`], then take the last
/// pieces with [`Rows::next_piece`].
#[derive(Debug)]
pub struct Rows {
    fmt: CopyFormat,
    buf: BytesMut,
    /// Bytes of the current row already scanned.
    pos: usize,
    in_quote: bool,
    last_was_esc: bool,
    eol: Option<Eol>,
    /// The header is still to come.
    header: bool,
    /// The data ended ([`Rows::finish`]).
    eof: bool,
    /// The end marker was seen: nothing more is returned (but `end`, once).
    ended: bool,
    /// The end marker, returned after the row before it on its line (text format).
    end: Option<Bytes>,
}

impl Rows {
    /// A scanner for data in `fmt`.
    pub fn new(fmt: CopyFormat) -> Rows {
        let header = fmt.header;
        Rows {
            fmt,
            buf: BytesMut::new(),
            pos: 0,
            in_quote: false,
            last_was_esc: false,
            eol: None,
            header,
            eof: false,
            ended: false,
            end: None,
        }
    }

    /// Appends the next bytes of the data (ignored after the end marker or the end).
    pub fn push(&mut self, data: &[u8]) {
        if !self.ended && !self.eof {
            self.buf.extend_from_slice(data);
        }
    }

    /// The data ended (the client's CopyDone): [`Rows::next_piece`] then returns what is left.
    pub fn finish(&mut self) {
        self.eof = true;
    }

    /// Whether the end marker was seen.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// The bytes scanned but not yet returned (a row still incomplete).
    pub fn pending(&self) -> &[u8] {
        &self.buf
    }

    /// The next complete piece; `None` when more data is needed, or after the last piece.
    pub fn next_piece(&mut self) -> Result<Option<Piece>, RowError> {
        if let Some(end) = self.end.take() {
            return Ok(Some(Piece::End(end)));
        }
        if self.ended {
            return Ok(None);
        }
        let (csv, q, e) = (self.fmt.csv, self.fmt.quote, self.fmt.escape);
        let mut i = self.pos;
        while i < self.buf.len() {
            let c = self.buf[i];
            if c == b'\\' && self.fmt.end_marker && !self.in_quote && (!csv || i == 0) {
                match self.marker(i + 1) {
                    Marker::More => break,
                    Marker::Bad(why) => return Err(RowError(why.into())),
                    Marker::Is(n) => return Ok(Some(self.end_at(i, n))),
                    Marker::Not => {}
                }
            }
            if csv {
                // As PostgreSQL: an escape equal to the quote is no escape (the quote toggles).
                let esc = e != q && c == e;
                if self.in_quote && esc {
                    self.last_was_esc = !self.last_was_esc;
                }
                if c == q && !self.last_was_esc {
                    self.in_quote = !self.in_quote;
                }
                if !esc {
                    self.last_was_esc = false;
                }
            }
            if !self.in_quote {
                match c {
                    b'\n' => {
                        self.line_end(Eol::Nl)?;
                        return Ok(Some(self.row(i + 1)));
                    }
                    b'\r' => match self.buf.get(i + 1) {
                        None if !self.eof => break,
                        None if self.eol.is_none() => return Ok(Some(self.row(i + 1))),
                        Some(b'\n') => {
                            self.line_end(Eol::CrNl)?;
                            return Ok(Some(self.row(i + 2)));
                        }
                        _ => {
                            let what = if csv { "unquoted carriage return" } else { "literal carriage return" };
                            return Err(RowError(format!(
                                "{what} found in data: rows must end with \\n or \\r\\n, as the first one does (use \"\\r\" in text, or quote it in CSV)"
                            )));
                        }
                    },
                    b'\\' if !csv => {
                        if i + 1 == self.buf.len() && !self.eof {
                            break;
                        }
                        i += 1;
                    }
                    _ => {}
                }
            }
            i += 1;
        }
        self.pos = i.min(self.buf.len());
        if !self.eof || self.buf.is_empty() || self.pos < self.buf.len() {
            return Ok(None);
        }
        if self.in_quote {
            return Err(RowError("unterminated CSV quoted field".into()));
        }
        let n = self.buf.len();
        Ok(Some(self.row(n)))
    }

    /// Whether the backslash before `j` starts the end marker (PostgreSQL's rules, which
    /// depend on the line end style; csv takes what text refuses as data). At the end of the
    /// data a missing byte reads as 0, as in PostgreSQL.
    fn marker(&self, j: usize) -> Marker {
        let at = |x: usize| self.buf.get(x).copied().or(self.eof.then_some(0));
        let bad = |why| if self.fmt.csv { Marker::Not } else { Marker::Bad(why) };
        let style = "end-of-copy marker does not match previous newline style";
        match at(j) {
            None => return Marker::More,
            Some(b'.') => {}
            Some(_) => return Marker::Not,
        }
        match (at(j + 1), self.eol) {
            (None, _) => Marker::More,
            (Some(b'\n'), Some(Eol::CrNl)) => bad(style),
            (Some(b'\n'), _) => Marker::Is(3),
            (Some(b'\r'), Some(Eol::Nl)) => Marker::Bad(style),
            (Some(b'\r'), None) => Marker::Is(3),
            (Some(b'\r'), Some(Eol::CrNl)) => match at(j + 2) {
                None => Marker::More,
                Some(b'\n') => Marker::Is(4),
                Some(b'\r') => Marker::Bad(style),
                Some(_) => bad("end-of-copy marker corrupt"),
            },
            (Some(_), _) => bad("end-of-copy marker corrupt"),
        }
    }

    /// A row ended with `eol`: the first sets the style, the others must match it.
    fn line_end(&mut self, eol: Eol) -> Result<(), RowError> {
        match self.eol {
            None => {
                self.eol = Some(eol);
                Ok(())
            }
            Some(style) if style == eol => Ok(()),
            Some(_) => {
                let what = match (self.fmt.csv, eol) {
                    (true, Eol::Nl) => "unquoted newline",
                    (false, Eol::Nl) => "literal newline",
                    (true, Eol::CrNl) => "unquoted carriage return",
                    (false, Eol::CrNl) => "literal carriage return",
                };
                Err(RowError(format!("{what} found in data: the first row set another line end")))
            }
        }
    }

    /// The end marker of `n` bytes at `at`: the row before it on its line (text), then the
    /// marker; the rest of the data is ignored.
    fn end_at(&mut self, at: usize, n: usize) -> Piece {
        self.ended = true;
        let before = self.buf.split_to(at).freeze();
        let marker = self.buf.split_to(n.min(self.buf.len())).freeze();
        self.buf.clear();
        if before.is_empty() {
            return Piece::End(marker);
        }
        self.end = Some(marker);
        self.take_header(before)
    }

    fn row(&mut self, n: usize) -> Piece {
        let row = self.buf.split_to(n).freeze();
        self.pos = 0;
        self.in_quote = false;
        self.last_was_esc = false;
        self.take_header(row)
    }

    fn take_header(&mut self, row: Bytes) -> Piece {
        if std::mem::take(&mut self.header) {
            Piece::Header(row)
        } else {
            Piece::Row(row)
        }
    }
}

/// One field's value: NULL, or its text (de-quoted / de-escaped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// The NULL string (or FORCE_NULL's quoted one).
    Null,
    /// The value's bytes.
    Value(Vec<u8>),
}

/// How a field is read beyond the format: FORCE_NOT_NULL / FORCE_NULL (csv) of its column.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Force {
    /// An unquoted NULL string is the text itself.
    pub not_null: bool,
    /// A quoted NULL string is NULL too.
    pub null: bool,
}

/// Field number `n` (0-based) of `row` (with or without its line end), as PostgreSQL reads it.
pub fn field(fmt: &CopyFormat, row: &[u8], n: usize, force: Force) -> Result<Field, RowError> {
    let row = row.strip_suffix(b"\n").unwrap_or(row);
    let row = row.strip_suffix(b"\r").unwrap_or(row);
    let missing = || RowError(format!("missing data for column {} (field {})", n + 1, n + 1));
    if fmt.csv {
        let mut at = 0;
        for i in 0..=n {
            let (raw, quoted, next) = csv_field(fmt, row, at)?;
            if i == n {
                let null = raw == fmt.null && if quoted { force.null } else { !force.not_null };
                return Ok(if null { Field::Null } else { Field::Value(raw) });
            }
            at = next.ok_or_else(missing)?;
        }
        return Err(missing());
    }
    let mut at = 0;
    for i in 0..=n {
        let end = text_field_end(fmt, row, at);
        if i == n {
            let raw = &row[at..end];
            return Ok(if raw == fmt.null { Field::Null } else { Field::Value(unescape(raw)) });
        }
        if end == row.len() {
            return Err(missing());
        }
        at = end + 1;
    }
    Err(missing())
}

/// A csv field starting at `at`: its value, whether any part was quoted, and where the next
/// field starts (`None`: this was the last).
fn csv_field(fmt: &CopyFormat, row: &[u8], mut at: usize) -> Result<(Vec<u8>, bool, Option<usize>), RowError> {
    let (mut out, mut quoted) = (vec![], false);
    loop {
        // Outside quotes.
        loop {
            let Some(&c) = row.get(at) else { return Ok((out, quoted, None)) };
            at += 1;
            if c == fmt.delimiter {
                return Ok((out, quoted, Some(at)));
            }
            if c == fmt.quote {
                break;
            }
            out.push(c);
        }
        quoted = true;
        // Inside quotes.
        loop {
            let Some(&c) = row.get(at) else { return Err(RowError("unterminated CSV quoted field".into())) };
            at += 1;
            if c == fmt.escape {
                if let Some(&next) = row.get(at).filter(|&&x| x == fmt.quote || x == fmt.escape) {
                    out.push(next);
                    at += 1;
                    continue;
                }
            }
            if c == fmt.quote {
                break;
            }
            out.push(c);
        }
    }
}

/// Where the text field starting at `at` ends (its delimiter, or the end of the row).
fn text_field_end(fmt: &CopyFormat, row: &[u8], mut at: usize) -> usize {
    while at < row.len() {
        match row[at] {
            b'\\' => at += 2,
            c if c == fmt.delimiter => return at,
            _ => at += 1,
        }
    }
    row.len()
}

/// A text-format field's value: backslash escapes decoded as PostgreSQL does.
pub fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let b = field[i];
        i += 1;
        if b != b'\\' || i == field.len() {
            out.push(b);
            continue;
        }
        let c = field[i];
        i += 1;
        match c {
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'0'..=b'7' => {
                let mut v = u32::from(c - b'0');
                for _ in 0..2 {
                    match field.get(i) {
                        Some(d @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push(v as u8);
            }
            b'x' => {
                let hex = |b: u8| (b as char).to_digit(16);
                let (mut v, mut n) = (0u32, 0);
                while n < 2 {
                    match field.get(i).and_then(|b| hex(*b)) {
                        Some(d) => {
                            v = v * 16 + d;
                            i += 1;
                            n += 1;
                        }
                        None => break,
                    }
                }
                out.push(if n == 0 { b'x' } else { v as u8 });
            }
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every piece of `data` pushed in chunks of `size` bytes, then finished.
    fn pieces(fmt: &CopyFormat, data: &[u8], size: usize) -> Result<Vec<Piece>, RowError> {
        let mut rows = Rows::new(fmt.clone());
        let mut out = vec![];
        for chunk in data.chunks(size.max(1)) {
            rows.push(chunk);
            while let Some(p) = rows.next_piece()? {
                out.push(p);
            }
        }
        rows.finish();
        while let Some(p) = rows.next_piece()? {
            out.push(p);
        }
        Ok(out)
    }

    fn bytes(p: &Piece) -> &[u8] {
        match p {
            Piece::Header(b) | Piece::Row(b) | Piece::End(b) => b,
        }
    }

    fn rows_of(fmt: &CopyFormat, data: &str) -> Vec<String> {
        let all = pieces(fmt, data.as_bytes(), data.len()).expect("splits");
        // The same at every chunk size: a row split across messages at any byte.
        for size in 1..data.len().max(1) {
            assert_eq!(pieces(fmt, data.as_bytes(), size).as_ref(), Ok(&all), "chunks of {size}");
        }
        all.iter().map(|p| String::from_utf8_lossy(bytes(p)).into_owned()).collect()
    }

    fn csv() -> CopyFormat {
        CopyFormat::new(true)
    }

    fn key(fmt: &CopyFormat, row: &str, n: usize) -> Result<Field, RowError> {
        field(fmt, row.as_bytes(), n, Force::default())
    }

    fn v(s: &str) -> Result<Field, RowError> {
        Ok(Field::Value(s.as_bytes().to_vec()))
    }

    #[test]
    fn csv_rows_end_at_newlines_outside_quotes() {
        let data = "1,\"a,b\"\n2,\"say \"\"hi\"\"\"\n3,\"two\nlines\"\n4,plain";
        assert_eq!(rows_of(&csv(), data), ["1,\"a,b\"\n", "2,\"say \"\"hi\"\"\"\n", "3,\"two\nlines\"\n", "4,plain"]);
        let crlf = "1,a\r\n2,\"x\r\ny\"\r\n3,\"\n\"\r\n";
        assert_eq!(rows_of(&csv(), crlf), ["1,a\r\n", "2,\"x\r\ny\"\r\n", "3,\"\n\"\r\n"]);
        assert_eq!(key(&csv(), "1,\"a,b\"\n", 1), v("a,b"));
        assert_eq!(key(&csv(), "2,\"say \"\"hi\"\"\"\n", 1), v("say \"hi\""));
        assert_eq!(key(&csv(), "3,\"two\nlines\"\r\n", 1), v("two\nlines"));
        assert_eq!(key(&csv(), "\"4\"x,plain", 0), v("4x"), "quoted and unquoted parts join");
        assert_eq!(key(&csv(), "a,,c", 1), Ok(Field::Null), "unquoted empty: NULL");
        assert_eq!(key(&csv(), "a,\"\",c", 1), v(""), "quoted empty: an empty string");
        assert_eq!(key(&csv(), "a,b", 2).unwrap_err().0, "missing data for column 3 (field 3)");
        assert!(key(&csv(), "\"open,b", 0).is_err());
        let force = |not_null, null, row: &str| field(&csv(), row.as_bytes(), 0, Force { not_null, null });
        assert_eq!(force(true, false, ",x"), v(""));
        assert_eq!(force(false, true, "\"\",x"), Ok(Field::Null));
    }

    #[test]
    fn custom_quote_escape_delimiter_and_null() {
        let fmt = CopyFormat { delimiter: b';', quote: b'\'', escape: b'\\', null: b"NULL".to_vec(), ..csv() };
        let data = "1;'it\\'s; \\\\ fine'\n2;NULL\n3;'NULL'\n";
        assert_eq!(rows_of(&fmt, data), ["1;'it\\'s; \\\\ fine'\n", "2;NULL\n", "3;'NULL'\n"]);
        assert_eq!(key(&fmt, "1;'it\\'s; \\\\ fine'\n", 1), v("it's; \\ fine"));
        assert_eq!(key(&fmt, "2;NULL\n", 1), Ok(Field::Null));
        assert_eq!(key(&fmt, "3;'NULL'\n", 1), v("NULL"));
        // An escape before the closing quote keeps the quote open across a newline.
        assert_eq!(rows_of(&fmt, "1;'a\\'\nb'\n2;x\n"), ["1;'a\\'\nb'\n", "2;x\n"]);
        // Outside quotes the escape is an ordinary byte.
        assert_eq!(key(&fmt, "a\\;b", 1), v("b"));
    }

    #[test]
    fn header_and_end_marker() {
        let fmt = CopyFormat { header: true, ..csv() };
        let all = pieces(&fmt, b"\"id\nx\",name\n1,a\n\\.\nignored\n", 3).unwrap();
        assert_eq!(
            all,
            [
                Piece::Header(Bytes::from_static(b"\"id\nx\",name\n")),
                Piece::Row(Bytes::from_static(b"1,a\n")),
                Piece::End(Bytes::from_static(b"\\.\n")),
            ]
        );
        assert_eq!(rows_of(&csv(), "1\r\n\\.\r\n2\r\n"), ["1\r\n", "\\.\r\n"]);
        assert_eq!(rows_of(&csv(), "1\n\\."), ["1\n", "\\."], "at the end of the data: a value");
        assert!(
            pieces(&csv(), b"1\r\n\\.\n2\r\n", 100).is_err(),
            "as PostgreSQL: data, then a newline of another style"
        );
        assert!(pieces(&csv(), b"1\n\\.\r\n", 100).is_err(), "as PostgreSQL: a marker of another style");
        assert_eq!(rows_of(&csv(), "\\.x,1\n\"\n\\.\n\"\n"), ["\\.x,1\n", "\"\n\\.\n\"\n"], "data, not markers");
        let pg18 = CopyFormat { end_marker: false, ..csv() };
        assert_eq!(rows_of(&pg18, "1\n\\.\n2\n"), ["1\n", "\\.\n", "2\n"]);
    }

    #[test]
    fn text_rows_and_fields() {
        let text = CopyFormat::new(false);
        let data = "1\ta\\\nb\n2\t\\N\n3\tx\\\ty\n";
        assert_eq!(rows_of(&text, data), ["1\ta\\\nb\n", "2\t\\N\n", "3\tx\\\ty\n"]);
        assert_eq!(key(&text, "2\t\\N\r\n", 1), Ok(Field::Null));
        assert_eq!(key(&text, "3\tx\\\ty\n", 1), v("x\ty"), "an escaped delimiter");
        assert_eq!(key(&text, "3\tx\\\ty\tz\n", 2), v("z"));
        assert_eq!(key(&text, "a\\101\\x41\\n", 0), v("aAA\n"));
        let pipes = CopyFormat { delimiter: b'|', null: b"-".to_vec(), ..text.clone() };
        assert_eq!(key(&pipes, "7|-|x", 1), Ok(Field::Null));
        assert_eq!(key(&pipes, "7|-|x", 2), v("x"));
        assert_eq!(rows_of(&text, "1\n\\.\n2\n"), ["1\n", "\\.\n"]);
        assert_eq!(rows_of(&text, "1\nab\\.\nzz"), ["1\n", "ab", "\\.\n"], "mid-line, as PostgreSQL 15");
        assert_eq!(rows_of(&text, "1\\\\.\n"), ["1\\\\.\n"], "an escaped backslash");
        assert!(pieces(&text, b"1\n\\.", 100).is_err(), "end-of-copy marker corrupt");
        assert!(pieces(&text, b"1\n\\.x\n", 100).is_err(), "end-of-copy marker corrupt");
        assert_eq!(unescape(b"a\\tb\\\\c\\101\\x41\\n"), b"a\tb\\cAA\n");
    }

    #[test]
    fn bare_carriage_returns_and_open_quotes_are_refused() {
        assert!(pieces(&csv(), b"1,a\r2,b\r", 100).is_err());
        assert!(pieces(&CopyFormat::new(false), b"1\ta\rb\n", 100).is_err());
        assert_eq!(rows_of(&csv(), "1,\"a\rb\"\n"), ["1,\"a\rb\"\n"], "quoted: data");
        assert!(pieces(&csv(), b"1,\"open\n", 100).is_err());
        assert_eq!(rows_of(&csv(), "x\r"), ["x\r"], "a last CR: left to the server");
        assert!(pieces(&csv(), b"1,a\n2,b\r\n", 100).is_err(), "styles mixed");
        assert!(pieces(&csv(), b"1,a\r\n2,b\n", 100).is_err(), "styles mixed");
    }
}
