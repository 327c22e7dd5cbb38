//! One server connection from refract, proxied to the PostgreSQL server this agent fronts.
//!
//! A connection that opens with a `HybridRequest` (`refract_pg::hybrid`) is watched: the agent
//! follows the server's message boundaries and counts each result's rows and copy data. At the
//! row (or copy data) whose length brings a result to the threshold it stops forwarding, before
//! that row and before whatever arrived with it that it has not forwarded yet (back to the last
//! ReadyForQuery), says `WANT` and waits. refract answers `RELAY` in-band (the agent forwards the rest), or hands the
//! client's socket over on its hand-over link (`adopt.rs`): the agent then writes the rest of
//! the result to the client itself, through ReadyForQuery (or up to a COPY FROM/BOTH start,
//! which needs the client's data through refract), hands the socket back and sends refract
//! the `DELIVERED` digest: every message it wrote except rows, copy data, notices and
//! notifications, so refract's session state follows what the client saw.
//!
//! The agent never reads from the client: what the client sends while the agent writes stays
//! in the socket for refract. A connection without the request (a CancelRequest, a plain
//! client) is proxied byte for byte.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use refract_pg::hybrid::{self, HybridRequest, HYBRID_REQUEST_CODE, HYBRID_REQUEST_LEN, RELAY};
use refract_pg::startup::CANCEL_REQUEST_CODE;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use super::{Served, Verdict};
use crate::backend::connect_backend;
use crate::options::LocalOptions;

/// Ids of watched connections (unique for the agent's lifetime).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// Bytes gathered for the client before one write.
const FLUSH: usize = 256 * 1024;
/// Bound on refract's verdict after a `WANT` (it answers at once; past this it is gone).
const VERDICT: Duration = Duration::from_secs(30);

/// Proxies one connection from refract until either side closes it.
pub(super) async fn run(mut d: TcpStream, opts: &LocalOptions) -> io::Result<()> {
    let _ = d.set_nodelay(true);
    let mut first = [0u8; 8];
    d.read_exact(&mut first).await?;
    let mut be = connect_backend(opts).await.map_err(io::Error::other)?;
    let len = i32::from_be_bytes([first[0], first[1], first[2], first[3]]);
    let code = i32::from_be_bytes([first[4], first[5], first[6], first[7]]);
    if len != HYBRID_REQUEST_LEN as i32 || code != HYBRID_REQUEST_CODE {
        be.write_all(&first).await?;
        tokio::io::copy_bidirectional(&mut d, &mut be).await?;
        return Ok(());
    }
    let mut packet = [0u8; HYBRID_REQUEST_LEN];
    packet[..8].copy_from_slice(&first);
    d.read_exact(&mut packet[8..]).await?;
    let req = HybridRequest::parse(&packet).ok_or_else(|| io::Error::other("malformed hybrid request"))?;
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let mut accepted = BytesMut::new();
    hybrid::encode_accepted(id, &mut accepted);
    d.write_all(&accepted).await?;
    let (dr, dw) = d.into_split();
    let (br, bw) = tokio::io::split(be);
    let (relay_tx, relay_rx) = mpsc::channel(1);
    let down = Down { id, threshold: req.threshold.max(1), opts, key: None, so_far: 0, asked: false };
    // Either direction ending ends the connection (both halves drop).
    tokio::select! {
        r = up(dr, bw, relay_tx) => r,
        r = down.run(br, dw, relay_rx) => r,
    }
}

/// refract → server: forwarded as it comes, except `RELAY` markers, which go to the waiting
/// down direction. The first packet is the startup message (untyped), then typed messages.
async fn up<R, W>(mut dr: R, mut bw: W, relay: mpsc::Sender<()>) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut left = 0usize; // bytes of the current message still to pass
    let mut startup = true;
    loop {
        if dr.read_buf(&mut buf).await? == 0 {
            return Ok(());
        }
        let (mut i, mut from) = (0usize, 0usize);
        while pass(&mut i, &mut left, buf.len()) {
            if startup {
                let Some(len) = startup_len(&buf[i..])? else { break };
                (left, startup) = (len, false);
                continue;
            }
            let Some((tag, total)) = head(&buf[i..])? else { break };
            if tag == RELAY {
                if buf.len() - i < total {
                    break; // the whole marker first
                }
                bw.write_all(&buf[from..i]).await?;
                i += total;
                from = i;
                let _ = relay.send(()).await;
                continue;
            }
            left = total;
        }
        bw.write_all(&buf[from..i]).await?;
        buf.advance(i);
    }
}

/// The server → refract direction of one watched connection.
struct Down<'a> {
    id: u64,
    threshold: u64,
    opts: &'a LocalOptions,
    /// The server's BackendKeyData body (process id and secret), for cancelling.
    key: Option<Vec<u8>>,
    /// Bytes of rows and copy data since the last ReadyForQuery.
    so_far: u64,
    /// This result was offered already (refract chose to relay it).
    asked: bool,
}

/// The first bytes of a message: its tag and whole length (`None`: not all there yet).
fn head(buf: &[u8]) -> io::Result<Option<(u8, usize)>> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let len = i32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
    let len = usize::try_from(len).ok().filter(|&l| l >= 4).ok_or_else(|| io::Error::other("bad message length"))?;
    Ok(Some((buf[0], len + 1)))
}

/// Moves `i` over what is here of the `left` bytes of the message under way; whether a
/// message starts at `i` now (else more must be read first).
fn pass(i: &mut usize, left: &mut usize, len: usize) -> bool {
    let n = (*left).min(len - *i);
    (*i, *left) = (*i + n, *left - n);
    *left == 0
}

/// The length of the untyped startup packet at the start of `buf` (`None`: not all there yet).
fn startup_len(buf: &[u8]) -> io::Result<Option<usize>> {
    let Some(b) = buf.get(..4) else { return Ok(None) };
    let len = i32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    let len = usize::try_from(len).ok().filter(|&l| l >= 4).ok_or_else(|| io::Error::other("bad startup length"))?;
    Ok(Some(len))
}

fn is_rows(tag: u8) -> bool {
    tag == b'D' || tag == b'd'
}

impl Down<'_> {
    async fn run<R, W>(mut self, mut br: R, mut dw: W, mut relay: mpsc::Receiver<()>) -> io::Result<()>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let mut buf = BytesMut::with_capacity(64 * 1024);
        let mut left = 0usize;
        loop {
            if br.read_buf(&mut buf).await? == 0 {
                return Ok(());
            }
            let mut i = 0usize;
            // The earliest boundary the cut may move back to: none before this read's first
            // one (that message was partly forwarded) nor before a ReadyForQuery or a COPY
            // FROM/BOTH start (refract must see those itself).
            let mut cut: Option<usize> = None;
            while pass(&mut i, &mut left, buf.len()) {
                let from = *cut.get_or_insert(i);
                let Some((tag, total)) = head(&buf[i..])? else { break };
                if !is_rows(tag) && buf.len() - i < total && total <= 4096 {
                    break; // small control messages are read whole (BackendKeyData, ReadyForQuery)
                }
                // Before the row that brings the result to the threshold, not after it: that
                // row (a one-row result's only one) goes straight to the client too. And before
                // what came with it that refract has not forwarded yet (RowDescription,
                // BindComplete, ...): what refract relayed is then all acknowledged by the
                // client's query, so the hand-over waits for no ACK.
                if is_rows(tag) && !self.asked && self.so_far + total as u64 >= self.threshold {
                    dw.write_all(&buf[..from]).await?;
                    buf.advance(from);
                    (i, cut) = (0, None);
                    self.asked = true;
                    if let Verdict::Serve { client, done } = self.ask(&mut dw, &mut relay).await? {
                        self.serve(&mut br, &mut buf, &mut dw, client, done).await?;
                    }
                    continue;
                }
                self.note(tag, total, &buf[i..(i + total).min(buf.len())]);
                if matches!(tag, b'Z' | b'G' | b'W') {
                    cut = Some(i + total);
                }
                left = total;
            }
            dw.write_all(&buf[..i]).await?;
            buf.advance(i);
        }
    }

    /// Follows the result: its size, its end, the cancel key (`frame`: as much of the
    /// message of `total` bytes as is here).
    fn note(&mut self, tag: u8, total: usize, frame: &[u8]) {
        match tag {
            b'D' | b'd' => self.so_far += total as u64,
            b'Z' => (self.so_far, self.asked) = (0, false),
            b'K' if frame.len() > 5 => self.key = Some(frame[5..].to_vec()),
            _ => {}
        }
    }

    /// Says `WANT` and waits for the verdict: `RELAY` in-band, or the link's.
    async fn ask<W: AsyncWrite + Unpin>(&mut self, dw: &mut W, relay: &mut mpsc::Receiver<()>) -> io::Result<Verdict> {
        let (tx, rx) = oneshot::channel();
        self.opts.pg.insert(self.id, tx);
        let mut want = BytesMut::new();
        hybrid::encode_want(self.so_far, &mut want);
        dw.write_all(&want).await?;
        let verdict = tokio::select! {
            v = rx => v.unwrap_or(Verdict::Relay),
            r = relay.recv() => match r {
                Some(()) => Verdict::Relay,
                None => return Err(io::Error::other("refract closed the connection")),
            },
            _ = tokio::time::sleep(VERDICT) => return Err(io::Error::other("no verdict from refract")),
        };
        self.opts.pg.remove(self.id);
        Ok(verdict)
    }

    /// Writes the rest of the result to `client` through ReadyForQuery (or up to a COPY
    /// FROM/BOTH start), then reports on `done` and sends refract the digest.
    async fn serve<R, W>(
        &mut self,
        br: &mut R,
        buf: &mut BytesMut,
        dw: &mut W,
        mut client: TcpStream,
        done: oneshot::Sender<Served>,
    ) -> io::Result<()>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let mut digest = BytesMut::new();
        let mut out = BytesMut::with_capacity(FLUSH);
        let mut sent = 0u64;
        let ended = self.write_through(br, buf, &mut client, &mut out, &mut digest, &mut sent).await;
        let ended = match ended {
            Ok(()) => self.flush(&mut client, &mut out, &mut sent).await,
            Err(e) => Err(e),
        };
        if let Err(e) = ended {
            self.cancel().await;
            let _ = done.send(Served::Close { sent, reason: format!("writing the result to the client: {e}") });
            return Err(e);
        }
        let _ = done.send(Served::Boundary { client, sent });
        let mut marker = BytesMut::new();
        hybrid::encode_marker(hybrid::DELIVERED, &digest, &mut marker);
        dw.write_all(&marker).await
    }

    /// The messages from the server to the client, until a boundary.
    async fn write_through<R: AsyncRead + Unpin>(
        &mut self,
        br: &mut R,
        buf: &mut BytesMut,
        client: &mut TcpStream,
        out: &mut BytesMut,
        digest: &mut BytesMut,
        sent: &mut u64,
    ) -> io::Result<()> {
        let (mut left, mut keep, mut last) = (0usize, false, false);
        loop {
            if left == 0 {
                if last {
                    return Ok(());
                }
                if let Some((tag, total)) = head(buf)? {
                    if tag == b'G' || tag == b'W' {
                        return Ok(()); // COPY FROM / BOTH: the client's data goes through refract
                    }
                    self.note(tag, total, &buf[..5]);
                    (left, keep, last) = (total, !hybrid::is_bulk(tag), tag == b'Z');
                }
            }
            let n = left.min(buf.len());
            if n > 0 {
                let piece = buf.split_to(n);
                if keep {
                    digest.put_slice(&piece);
                }
                out.put_slice(&piece);
                left -= n;
                if out.len() >= FLUSH {
                    self.flush(client, out, sent).await?;
                }
                continue;
            }
            self.flush(client, out, sent).await?;
            if br.read_buf(buf).await? == 0 {
                return Err(io::Error::other("the server closed the connection mid-result"));
            }
        }
    }

    /// Writes what is gathered to the client; a client that takes nothing for `write_stall`
    /// has stalled.
    async fn flush(&self, client: &mut TcpStream, out: &mut BytesMut, sent: &mut u64) -> io::Result<()> {
        if out.is_empty() {
            return Ok(());
        }
        match tokio::time::timeout(self.opts.write_stall, client.write_all(out)).await {
            Ok(r) => r?,
            Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "the client stopped reading")),
        }
        *sent += out.len() as u64;
        out.clear();
        Ok(())
    }

    /// Cancels the running query (the client is gone): a CancelRequest with the server's key.
    async fn cancel(&self) {
        let Some(key) = &self.key else { return };
        let Ok(mut s) = connect_backend(self.opts).await else { return };
        let mut req = BytesMut::new();
        req.put_i32(8 + key.len() as i32);
        req.put_i32(CANCEL_REQUEST_CODE);
        req.put_slice(key);
        let _ = s.write_all(&req).await;
    }
}
