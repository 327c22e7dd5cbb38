//! COPY over several shards. `COPY table TO STDOUT`: each shard's rows in turn, one
//! CopyOutResponse, one CopyDone, the counts summed. `COPY ... FROM STDIN`: every shard runs
//! the COPY in a transaction; each row (text or csv, found by `refract_shard::copyrows` as
//! PostgreSQL finds it; a header line to every shard) goes to the shard its key names (or every
//! byte to every shard for a replicated table); at the client's CopyDone the shards commit
//! together (two-phase where possible, as other writes on several shards), at its CopyFail or
//! any shard's error they all roll back.

use super::fanout::Leg;
use super::Sharding;
use crate::error::PgError;
use crate::session::phase::{CopyDir, Event};
use crate::session::{Session, FLUSH_AT};
use bytes::BytesMut;
use refract_pg::{BackendMessage, ErrorFields, FrontendMessage};
use refract_shard::copyrows::{self, CopyFormat, Field, Force, Piece, RowError, Rows};
use refract_shard::partition::Key;

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
                        self.io.out.extend_from_slice(&frame);
                    }
                    b'd' if error.is_none() => {
                        self.io.out.extend_from_slice(&frame);
                        if self.io.out.len() >= FLUSH_AT {
                            self.flush().await?;
                        }
                    }
                    b'c' if i == last && error.is_none() => {
                        self.advance(Event::CopyEnd);
                        self.io.out.extend_from_slice(&frame);
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
            self.io.out.extend_from_slice(&BackendMessage::CommandComplete(tag).to_bytes());
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
        let split = match key.map(|k| self.split_of(sh, sql, k)).transpose() {
            Ok(s) => s,
            Err(why) => {
                error.get_or_insert(ErrorFields::new("ERROR", "0A000", why));
                None
            }
        };
        if let (None, Some(r)) = (&error, response) {
            self.advance(Event::CopyStart(CopyDir::In));
            self.io.out.extend_from_slice(&r);
            self.flush().await?;
            error = self.route_rows(sh, legs, split).await?;
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

    /// How the rows of `sql` (a COPY FROM STDIN into sharded `key.0`) are split. A row `\.`
    /// ends csv data only before PostgreSQL 18 (the shards' version, as the client saw it).
    fn split_of<'a>(&self, sh: &Sharding, sql: &str, key: &'a (String, usize)) -> Result<Split<'a>, String> {
        let column = refract_shard::shardkey::Schema::key_of(sh, &key.0).unwrap_or_default();
        let (mut format, force) = super::route::copy_in_format(sql, column, sh.key_type(&key.0))?;
        if format.csv {
            let params = self.shared.server_params.read().map(|p| p.clone()).unwrap_or_default();
            let version = params.iter().find(|(k, _)| k == "server_version").map(|(_, v)| v.clone());
            let major = version.and_then(|v| v.split(|c: char| !c.is_ascii_digit()).next()?.parse::<u32>().ok());
            format.end_marker = major.is_none_or(|m| m < 18);
        }
        Ok(Split { key, format, force })
    }

    /// Reads the client's CopyData to its CopyDone (`None`) or CopyFail (its message as the
    /// error) and sends each row where it belongs: with `split`, each row to the shard its key
    /// names (the header line, if any, to every shard); without, every byte to every shard.
    async fn route_rows(
        &mut self,
        sh: &Sharding,
        legs: &mut [Leg],
        split: Option<Split<'_>>,
    ) -> Result<Option<ErrorFields>, PgError> {
        let mut bufs: Vec<BytesMut> = legs.iter().map(|_| BytesMut::new()).collect();
        let mut rows = split.as_ref().map(|s| Rows::new(s.format.clone()));
        loop {
            let Some((tag, frame)) = self.io.wire.next_frame()? else {
                self.io.wire.fill().await?;
                continue;
            };
            match FrontendMessage::decode(tag, &frame[5..])? {
                FrontendMessage::CopyData(data) => {
                    match (&mut rows, &split) {
                        (Some(r), Some(s)) => {
                            r.push(&data);
                            if let Err(e) = drain(sh, s, r, &mut bufs) {
                                return Ok(Some(e));
                            }
                        }
                        _ => bufs.iter_mut().for_each(|b| b.extend_from_slice(&data)),
                    }
                    send_full(legs, &mut bufs, FLUSH_AT).await?;
                }
                FrontendMessage::CopyDone => {
                    if let (Some(r), Some(s)) = (&mut rows, &split) {
                        r.finish();
                        if let Err(e) = drain(sh, s, r, &mut bufs) {
                            return Ok(Some(e));
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

/// How a COPY's rows are split by key: the table and the key's field number, the data's
/// format, how FORCE_(NOT_)NULL read the key.
pub(crate) struct Split<'a> {
    key: &'a (String, usize),
    format: CopyFormat,
    force: Force,
}

/// Places every complete piece `rows` has.
fn drain(sh: &Sharding, s: &Split<'_>, rows: &mut Rows, bufs: &mut [BytesMut]) -> Result<(), ErrorFields> {
    while let Some(piece) = rows.next_piece().map_err(bad_data)? {
        place(sh, s, piece, bufs)?;
    }
    Ok(())
}

/// Puts one piece of the data in the buffer of its shard (a header: of every shard; the end
/// marker: nowhere, each shard's COPY ends at its CopyDone).
fn place(sh: &Sharding, s: &Split<'_>, piece: Piece, bufs: &mut [BytesMut]) -> Result<(), ErrorFields> {
    match piece {
        Piece::Header(h) => bufs.iter_mut().for_each(|b| b.extend_from_slice(&h)),
        Piece::Row(row) => {
            let i = row_shard(sh, s, &row)?;
            bufs[i].extend_from_slice(&row);
        }
        Piece::End(_) => {}
    }
    Ok(())
}

/// SQLSTATE `bad_copy_file_format`.
fn bad_data(e: RowError) -> ErrorFields {
    ErrorFields::new("ERROR", "22P04", e.0)
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

/// The shard of one COPY row: its key field read as PostgreSQL reads it, placed as
/// PostgreSQL's partitioning places it (a NULL key as a NULL partition key).
fn row_shard(sh: &Sharding, s: &Split<'_>, row: &[u8]) -> Result<usize, ErrorFields> {
    let (table, at) = s.key;
    let ty = sh.key_type(table).ok_or_else(|| bad_data(RowError(format!("{table} is not sharded"))))?;
    let key = match copyrows::field(&s.format, row, *at, s.force).map_err(bad_data)? {
        Field::Null => Key::Null,
        Field::Value(v) => ty.parse_text(&v).map_err(|e| ErrorFields::new("ERROR", "22P02", e.to_string()))?,
    };
    sh.place(table, &key).map_err(|e| {
        ErrorFields::new("ERROR", "23514", format!("no partition of relation \"{table}\" found for row: {e}"))
    })
}

/// The row count of a `COPY n` tag.
fn count(tag: &str) -> u64 {
    tag.strip_prefix("COPY ").and_then(|n| n.parse().ok()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_tags_are_counted() {
        assert_eq!(count("COPY 12"), 12);
        assert_eq!(count("INSERT 0 1"), 0);
    }
}
