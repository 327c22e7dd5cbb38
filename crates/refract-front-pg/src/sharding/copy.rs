//! COPY over several shards. `COPY table TO STDOUT`: each shard's rows in turn, one
//! CopyOutResponse, one CopyDone, the counts summed. `COPY ... FROM STDIN`: every shard runs
//! the COPY in a transaction; each text-format row goes to the shard its key names (or every
//! row to every shard for a replicated table); at the client's CopyDone the shards commit
//! together (two-phase where possible, as other writes on several shards), at its CopyFail or
//! any shard's error they all roll back.

use super::fanout::Leg;
use super::Sharding;
use crate::error::PgError;
use crate::phase::{CopyDir, Event};
use crate::session::{Session, FLUSH_AT};
use bytes::BytesMut;
use refract_pg::partition::Key;
use refract_pg::{BackendMessage, ErrorFields, FrontendMessage};

impl Session {
    /// `COPY ... TO STDOUT` of a sharded table on every leg.
    pub(crate) async fn copy_out_shards(
        &mut self,
        legs: &mut [Leg],
        sql: &str,
    ) -> Result<Option<ErrorFields>, PgError> {
        let mut out = BytesMut::new();
        FrontendMessage::Query(sql.to_owned()).encode(&mut out);
        for l in legs.iter_mut() {
            l.guard.wire.send(&out).await?;
        }
        let (mut rows, mut error, mut started) = (0u64, None, false);
        let last = legs.len().saturating_sub(1);
        for (i, l) in legs.iter_mut().enumerate() {
            loop {
                let (tag, frame) = l.guard.wire.recv().await?;
                match tag {
                    b'H' if !started => {
                        started = true;
                        self.advance(Event::CopyStart(CopyDir::Out));
                        self.out.extend_from_slice(&frame);
                    }
                    b'd' if error.is_none() => {
                        self.out.extend_from_slice(&frame);
                        if self.out.len() >= FLUSH_AT {
                            self.flush().await?;
                        }
                    }
                    b'c' if i == last && error.is_none() => {
                        self.advance(Event::CopyEnd);
                        self.out.extend_from_slice(&frame);
                    }
                    b'C' => {
                        if let BackendMessage::CommandComplete(t) = BackendMessage::decode(tag, &frame[5..])? {
                            rows += count(&t);
                        }
                    }
                    b'E' if error.is_none() => {
                        if let BackendMessage::ErrorResponse(e) = BackendMessage::decode(tag, &frame[5..])? {
                            error = Some(e);
                        }
                    }
                    b'Z' => break,
                    _ => {}
                }
            }
        }
        if error.is_none() {
            let tag = format!("COPY {rows}");
            self.advance(Event::Completed(&tag));
            self.out.extend_from_slice(&BackendMessage::CommandComplete(tag).to_bytes());
        }
        Ok(error)
    }

    /// `COPY ... FROM STDIN` on every leg (each in a transaction the caller opened): the
    /// client's rows routed by `key` (table, field number), or to every leg. Returns the tags
    /// and the first error; the caller commits or rolls back.
    pub(crate) async fn copy_in_shards(
        &mut self,
        sh: &Sharding,
        legs: &mut [Leg],
        sql: &str,
        key: Option<&(String, usize)>,
    ) -> Result<(Vec<String>, Option<ErrorFields>), PgError> {
        let mut out = BytesMut::new();
        FrontendMessage::Query(sql.to_owned()).encode(&mut out);
        let mut error = None;
        let mut response = None;
        for l in legs.iter_mut() {
            l.guard.wire.send(&out).await?;
            loop {
                let (tag, frame) = l.guard.wire.recv().await?;
                match tag {
                    b'G' => {
                        response.get_or_insert(frame);
                        break;
                    }
                    b'E' => {
                        if let BackendMessage::ErrorResponse(e) = BackendMessage::decode(tag, &frame[5..])? {
                            error.get_or_insert(e);
                        }
                    }
                    b'Z' => break,
                    _ => {}
                }
            }
        }
        let in_copy: Vec<bool> = legs.iter().map(|_| error.is_none()).collect();
        if let (None, Some(r)) = (&error, response) {
            self.advance(Event::CopyStart(CopyDir::In));
            self.out.extend_from_slice(&r);
            self.flush().await?;
            error = self.route_rows(sh, legs, key).await?;
            self.advance(Event::CopyEnd);
        }
        // End each shard's COPY: CopyDone, or CopyFail after an error.
        let mut tags = vec![];
        for (l, copying) in legs.iter_mut().zip(in_copy) {
            if !copying {
                continue;
            }
            let mut end = BytesMut::new();
            match &error {
                None => FrontendMessage::CopyDone.encode(&mut end),
                Some(_) => {
                    FrontendMessage::CopyFail("refract: the COPY failed on another shard".into()).encode(&mut end)
                }
            }
            l.guard.wire.send(&end).await?;
            loop {
                let (tag, frame) = l.guard.wire.recv().await?;
                match BackendMessage::decode(tag, &frame[5..])? {
                    BackendMessage::CommandComplete(t) => tags.push(t),
                    BackendMessage::ErrorResponse(e) if error.is_none() => error = Some(e),
                    BackendMessage::ReadyForQuery(_) => break,
                    _ => {}
                }
            }
        }
        Ok((tags, error))
    }

    /// Reads the client's CopyData to its CopyDone (`None`) or CopyFail (its message as the
    /// error) and sends each row where it belongs.
    async fn route_rows(
        &mut self,
        sh: &Sharding,
        legs: &mut [Leg],
        key: Option<&(String, usize)>,
    ) -> Result<Option<ErrorFields>, PgError> {
        let mut pending = BytesMut::new(); // an incomplete last line
        let mut bufs: Vec<BytesMut> = legs.iter().map(|_| BytesMut::new()).collect();
        let mut ended = false; // a `\.` line: the rest is ignored, as PostgreSQL does
        loop {
            let Some((tag, frame)) = self.wire.next_frame()? else {
                self.wire.fill().await?;
                continue;
            };
            match FrontendMessage::decode(tag, &frame[5..])? {
                FrontendMessage::CopyData(data) if !ended => {
                    match key {
                        None => bufs.iter_mut().for_each(|b| b.extend_from_slice(&data)),
                        Some(k) => {
                            pending.extend_from_slice(&data);
                            while let Some(nl) = pending.iter().position(|b| *b == b'\n') {
                                let line = pending.split_to(nl + 1);
                                if &line[..] == b"\\.\n" || &line[..] == b"\\.\r\n" {
                                    ended = true;
                                    break;
                                }
                                match row_shard(sh, k, &line) {
                                    Ok(i) => bufs[i].extend_from_slice(&line),
                                    Err(e) => return Ok(Some(e)),
                                }
                            }
                        }
                    }
                    send_full(legs, &mut bufs, FLUSH_AT).await?;
                }
                FrontendMessage::CopyDone => {
                    if let (Some(k), false) = (key, pending.is_empty() || ended) {
                        let line = pending.split();
                        match row_shard(sh, k, &line) {
                            Ok(i) => bufs[i].extend_from_slice(&line),
                            Err(e) => return Ok(Some(e)),
                        }
                    }
                    send_full(legs, &mut bufs, 0).await?;
                    return Ok(None);
                }
                FrontendMessage::CopyFail(why) => {
                    let msg = format!("COPY from stdin failed: {why}");
                    return Ok(Some(ErrorFields::new("ERROR", "57014", msg)));
                }
                _ => {} // Flush, Sync and the like are ignored during COPY IN, as by PostgreSQL
            }
        }
    }
}

/// Sends each leg's buffered rows once they reach `at` bytes (0: whatever is there).
async fn send_full(legs: &mut [Leg], bufs: &mut [BytesMut], at: usize) -> Result<(), PgError> {
    for (l, b) in legs.iter_mut().zip(bufs.iter_mut()) {
        if !b.is_empty() && b.len() >= at {
            let mut msg = BytesMut::new();
            FrontendMessage::CopyData(b.split().freeze()).encode(&mut msg);
            l.guard.wire.send(&msg).await?;
        }
    }
    Ok(())
}

/// The shard of one text-format COPY row (`key`: the table and the key's field number).
fn row_shard(sh: &Sharding, (table, at): &(String, usize), line: &[u8]) -> Result<usize, ErrorFields> {
    let bad = |why: String| ErrorFields::new("ERROR", "22P04", why);
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let field =
        line.split(|b| *b == b'\t').nth(*at).ok_or_else(|| bad("missing data for the shard key column".into()))?;
    let ty = sh.key_type(table).ok_or_else(|| bad(format!("{table} is not sharded")))?;
    let key = if field == b"\\N" {
        Key::Null
    } else {
        ty.parse_text(&unescape(field)).map_err(|e| ErrorFields::new("ERROR", "22P02", e.to_string()))?
    };
    sh.place(table, &key).map_err(|e| {
        ErrorFields::new("ERROR", "23514", format!("no partition of relation \"{table}\" found for row: {e}"))
    })
}

/// A text-format COPY field's value: backslash escapes decoded as PostgreSQL does.
fn unescape(field: &[u8]) -> Vec<u8> {
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
                let mut v = 0u32;
                let mut n = 0;
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
                if n == 0 {
                    out.push(b'x');
                } else {
                    out.push(v as u8);
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// The row count of a `COPY n` tag.
fn count(tag: &str) -> u64 {
    tag.strip_prefix("COPY ").and_then(|n| n.parse().ok()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_text_escapes_decode_as_postgresql_does() {
        assert_eq!(unescape(b"a\\tb\\\\c\\101\\x41\\n"), b"a\tb\\cAA\n");
        assert_eq!(unescape(b"plain"), b"plain");
        assert_eq!(count("COPY 12"), 12);
    }
}
