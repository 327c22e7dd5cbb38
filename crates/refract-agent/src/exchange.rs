//! Serving adopted requests: the request the connection was handed over for goes to the
//! backend and its response streams straight to the client socket (head tagged
//! `x-refract-handover`). Then the agent waits (at most `idle`) for the client's next whole
//! request and asks the dispatcher about it (`Next`): it serves it only on `Serve` (routing
//! stays the dispatcher's: a write must not reach this backend), else hands the connection
//! back with it pending. Waiting before the hand-back closes a race: a client that sends its
//! next request as it acknowledges the end of a response would otherwise meet a flow being
//! moved (tombstoned here, not yet restored there) and wait for its retransmission (~200 ms).

use crate::backend::BackendStream;
use crate::error::{eof, stalled, timed_out};
use crate::pipe::Pipe;
use bytes::{Buf, BytesMut};
use refract_http::{defer, BodyKind, ChunkedDecoder, RequestHead, ResponseHead};
use std::borrow::Cow;
use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest request or response head handled.
const MAX_HEAD: usize = 64 * 1024;
/// How much one backend read may take.
const READ_CHUNK: usize = 64 * 1024;
/// Bodies of known length with at least this much left after what the head's reads brought
/// are spliced (zero-copy, `pipe.rs`); shorter ones are copied (a pipe costs system calls).
const SPLICE_MIN: u64 = READ_CHUNK as u64;
/// How long a write to the client may make no progress unless the config says otherwise
/// (`write_stall_ms`, the same default as the dispatcher's).
pub const DEFAULT_WRITE_STALL: Duration = Duration::from_secs(30);
/// Most bytes of the client's next request the agent buffers while it waits for it: a larger
/// one goes back to the dispatcher (which streams bodies) unasked.
const MAX_PENDING: usize = 1 << 20;

/// How serving adopted requests ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Served {
    /// At a request boundary: hand the connection back with these bytes (the next request,
    /// which the dispatcher did not let the agent serve, or a partial one, or nothing).
    Boundary(Vec<u8>),
    /// The connection must close (the reason is for logs).
    Close(String),
}

/// A response the agent read the head of and holds (hybrid: it asked for the connection).
#[derive(Debug)]
pub struct Held {
    /// What was read of it: interim responses, the final head, maybe part of the body.
    pub buf: BytesMut,
    /// Where the final head starts in `buf` (after interim responses).
    pub head_at: usize,
    /// The final head.
    pub head: ResponseHead,
    /// Whether the request asked to keep the connection.
    pub keep_alive: bool,
    /// The backend deferred the body (`refract_http::defer`): it waits to be told where to
    /// write it. The head in `buf` no longer has the `x-refract-deferred` line.
    pub deferred: bool,
}

impl Held {
    /// A response read up to its final head; a deferred head is recognised and cleaned.
    pub fn new(mut buf: BytesMut, head_at: usize, mut head: ResponseHead, keep_alive: bool) -> Held {
        let end = head_at + head.len;
        let clean = defer::without_header(&buf[head_at..end], defer::DEFERRED);
        let deferred = clean.is_some();
        if let Some(clean) = clean {
            let mut out = BytesMut::with_capacity(buf.len());
            out.extend_from_slice(&buf[..head_at]);
            out.extend_from_slice(&clean);
            out.extend_from_slice(&buf[end..]);
            head.len = clean.len();
            buf = out;
        }
        Held { buf, head_at, head, keep_alive, deferred }
    }
}

/// `request` (head of `head_len` bytes first) as the agent sends it to its backend: with
/// `pass_socket`, asking the backend to defer bodies of at least `at_least` bytes. The
/// refract-internal headers the client sent (`x-refract-defer` among them: only the agent asks
/// for that) are dropped either way.
pub(crate) fn to_backend(pass_socket: bool, request: &[u8], head_len: usize, at_least: u64) -> Cow<'_, [u8]> {
    let head_len = head_len.min(request.len());
    let mut out = match refract_http::head::without_internal_headers(&request[..head_len]) {
        Some(mut clean) => {
            clean.extend_from_slice(&request[head_len..]);
            Cow::Owned(clean)
        }
        None => Cow::Borrowed(request),
    };
    if pass_socket {
        let head_len = head_len - (request.len() - out.len());
        out = Cow::Owned(defer::with_header(&out, head_len, defer::DEFER, &at_least.to_string()));
    }
    out
}

/// The dispatcher, as an adopted connection needs it: routing authority stays there, so every
/// request after the one the connection was handed over for is asked about first.
pub(crate) trait Ask {
    /// Sends `Next` with request number `request` (head and body) and waits for the answer:
    /// `true` = serve it here, `false` = hand the connection back with it pending.
    fn next(&mut self, request: u64, bytes: &[u8]) -> impl Future<Output = refract_handover::Result<bool>>;

    /// Says that the response to request `request` is written whole and the agent now waits
    /// for the client: a dispatcher that loses the link from here on takes the connection back.
    fn idle(&mut self, request: u64) -> impl Future<Output = refract_handover::Result<()>>;

    /// Keeps the link alive while the agent serves or waits for the client; returns only on
    /// failure.
    fn beat(&mut self) -> impl Future<Output = refract_handover::Result<Infallible>>;
}

/// The agent's end of one adopted connection: the client, the backend, the pending bytes.
pub struct Adopted<'a> {
    /// The client socket.
    pub client: &'a mut TcpStream,
    /// A connection to the local backend.
    pub backend: &'a mut BackendStream,
    /// Bytes from the client not consumed yet.
    pub pending: BytesMut,
    /// Bound on each backend read.
    pub timeout: Duration,
    /// Bound on a write to the client making no progress (a client that stopped reading):
    /// past it the connection ends here, and the backend connection with it.
    pub stall: Duration,
    /// How long to wait for the client's next request before handing back (zero: at once).
    pub idle: Duration,
    /// The hand-over epoch, put in `x-refract-handover` on each response.
    pub epoch: u64,
    /// Bytes written to the client so far (reported to the dispatcher with the hand-back).
    pub sent: u64,
    /// The pipe bodies are spliced through (made at the first, kept for the next); `None`
    /// before that or when none could be made.
    pub pipe: Option<Pipe>,
    /// Ask the backend to defer large bodies and pass it the client socket (`pass_socket`).
    pub pass_socket: bool,
}

/// The length of the whole request at the start of `buf` (head and body), if it is all there.
/// A chunked body counts as not there: the dispatcher streams those itself.
pub fn whole_request(buf: &[u8]) -> Option<(usize, RequestHead)> {
    let head = RequestHead::parse(buf, MAX_HEAD).ok()??;
    let body = match head.body {
        BodyKind::None | BodyKind::UntilClose => 0,
        BodyKind::Length(n) => usize::try_from(n).ok()?,
        BodyKind::Chunked => return None,
    };
    let total = head.len.checked_add(body)?;
    (buf.len() >= total).then_some((total, head))
}

/// Whether more bytes from the client may still complete a request the agent could ask about:
/// nothing yet, or a head still coming, or a body of known length that fits [`MAX_PENDING`].
fn may_complete(buf: &[u8]) -> bool {
    if buf.len() >= MAX_PENDING {
        return false;
    }
    match RequestHead::parse(buf, MAX_HEAD) {
        Ok(None) => true,
        Ok(Some(h)) => match h.body {
            BodyKind::None | BodyKind::UntilClose => true,
            BodyKind::Length(n) => h.len as u64 + n <= MAX_PENDING as u64,
            BodyKind::Chunked => false,
        },
        Err(_) => false,
    }
}

/// What the wait for the client's next request found.
enum Incoming {
    /// A whole request of this length.
    Request(usize, RequestHead),
    /// None within the idle bound (or one that cannot be asked about): hand back.
    Boundary,
    /// The client closed its side or failed.
    Gone(String),
}

impl<'a> Adopted<'a> {
    /// A connection just adopted: nothing sent yet, no pipe yet.
    pub fn new(
        client: &'a mut TcpStream,
        backend: &'a mut BackendStream,
        pending: BytesMut,
        timeout: Duration,
        idle: Duration,
        epoch: u64,
        pass_socket: bool,
    ) -> Self {
        let stall = DEFAULT_WRITE_STALL;
        Adopted { client, backend, pending, timeout, stall, idle, epoch, sent: 0, pipe: None, pass_socket }
    }

    /// The same, with `stall` as the bound on a write to the client making no progress.
    pub fn with_write_stall(self, stall: Duration) -> Self {
        Adopted { stall, ..self }
    }
}

impl Adopted<'_> {
    /// Finishes the held response (if any) or serves the first whole request buffered (the one
    /// the connection was handed over for); then, for each further request the client sends
    /// (buffered, or arriving within `idle`), asks the dispatcher and serves it or hands back.
    /// Also returns the bytes written to the client (every byte its socket took). `Err`: the
    /// link to the dispatcher failed (the connection cannot be handed back).
    pub(crate) async fn run<A: Ask>(
        mut self,
        held: Option<Held>,
        ask: &mut A,
    ) -> refract_handover::Result<(Served, u64)> {
        let served = self.serve(held, ask).await?;
        Ok((served, self.sent))
    }

    async fn serve<A: Ask>(&mut self, held: Option<Held>, ask: &mut A) -> refract_handover::Result<Served> {
        let first = match held {
            Some(h) => beating(ask, self.finish_held(h)).await?,
            None => match whole_request(&self.pending) {
                Some((len, head)) => beating(ask, self.serve_one(len, head)).await?,
                None => return Ok(Served::Boundary(self.pending.to_vec())),
            },
        };
        if let Some(end) = first {
            return Ok(end);
        }
        let mut asked = 0;
        loop {
            ask.idle(asked).await?;
            let (len, head) = match beating(ask, self.incoming()).await? {
                Incoming::Request(len, head) => (len, head),
                Incoming::Boundary => return Ok(Served::Boundary(self.pending.to_vec())),
                Incoming::Gone(why) => return Ok(Served::Close(why)),
            };
            asked += 1;
            if !ask.next(asked, &self.pending[..len]).await? {
                return Ok(Served::Boundary(self.pending.to_vec()));
            }
            if let Some(end) = beating(ask, self.serve_one(len, head)).await? {
                return Ok(end);
            }
        }
    }

    /// Writes the held response; `Some` when the connection cannot go on.
    async fn finish_held(&mut self, h: Held) -> Option<Served> {
        let keep = h.keep_alive && h.head.keep_alive && h.head.body != BodyKind::UntilClose;
        if let Err(e) = self.finish(h).await {
            return Some(Served::Close(format!("response cut short: {e}")));
        }
        (!keep).then(|| Served::Close("the exchange asked for close".into()))
    }

    /// Serves the whole request of `len` bytes at the start of `pending`; `Some` when the
    /// connection cannot go on here.
    async fn serve_one(&mut self, len: usize, head: RequestHead) -> Option<Served> {
        let request = to_backend(self.pass_socket, &self.pending[..len], head.len, SPLICE_MIN);
        if let Err(e) = self.backend.write_all(&request).await {
            // Nothing reached the client: the dispatcher gets the request back and relays it.
            return Some(self.backend_failed(e));
        }
        let held = match read_response_head(self.backend, self.timeout, head.is_head()).await {
            Ok((buf, head_at, rh)) => Held::new(buf, head_at, rh, head.keep_alive),
            Err(e) => return Some(self.backend_failed(e)),
        };
        self.pending.advance(len);
        self.finish_held(held).await
    }

    /// The client's next whole request: buffered already, or read within the idle bound. What
    /// is read stays in `pending` whatever happens (it travels back with the hand-back).
    ///
    /// The idle bound counts from when the client has taken what was written: a response's
    /// last bytes may still sit in the socket (megabytes, when the backend wrote them itself
    /// or the client is slow), and a client reading them cannot send its next request yet.
    /// So while the bytes the client has not acknowledged keep shrinking, each idle period
    /// starts again; a client that takes nothing for `idle` gets the hand-back as before.
    async fn incoming(&mut self) -> Incoming {
        let mut deadline = tokio::time::Instant::now() + self.idle;
        let mut unacked = refract_handover::unacked(&*self.client).unwrap_or(0);
        loop {
            if let Some((len, head)) = whole_request(&self.pending) {
                return Incoming::Request(len, head);
            }
            if self.idle.is_zero() || !may_complete(&self.pending) {
                return Incoming::Boundary;
            }
            self.pending.reserve(READ_CHUNK.min(MAX_PENDING - self.pending.len()).max(1));
            match tokio::time::timeout_at(deadline, self.client.read_buf(&mut self.pending)).await {
                Err(_) => {
                    let now = refract_handover::unacked(&*self.client).unwrap_or(0);
                    if now > 0 && now < unacked {
                        unacked = now;
                        deadline = tokio::time::Instant::now() + self.idle;
                        continue;
                    }
                    return Incoming::Boundary;
                }
                Ok(Ok(0)) => return Incoming::Gone("the client closed the connection".into()),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Incoming::Gone(format!("client read failed: {e}")),
            }
        }
    }

    fn backend_failed(&self, e: std::io::Error) -> Served {
        tracing::debug!("backend failed before the response: {e}; handing the request back");
        Served::Boundary(self.pending.to_vec())
    }

    /// Writes a response whose head was read (tagged) and streams the rest of its body:
    /// spliced when its length is known and large, else copied.
    async fn finish(&mut self, mut h: Held) -> std::io::Result<()> {
        self.write(&h.buf[..h.head_at]).await?;
        self.write(&tag(&h.buf[h.head_at..h.head_at + h.head.len], self.epoch)).await?;
        h.buf.advance(h.head_at + h.head.len);
        if h.deferred {
            // Only a socket the operator allowed to pass goes (a backend deferring without
            // being asked gets `HERE`).
            if let (true, BackendStream::Unix(u)) = (self.pass_socket, &mut *self.backend) {
                let (done, wrote) = pass_client(u, self.client).await?;
                self.sent += wrote;
                return match (done, h.head.body) {
                    (true, BodyKind::Length(n)) if n == wrote => Ok(()),
                    (true, _) => {
                        Err(std::io::Error::other(format!("the backend wrote {wrote} body bytes, not the head's")))
                    }
                    (false, _) => Err(std::io::Error::other(format!("the backend failed after {wrote} body bytes"))),
                };
            }
            self.backend.write_all(&defer::HERE).await?;
        }
        let mut kind = h.head.body;
        if let BodyKind::Length(n) = kind {
            // What the head's reads brought of the body goes first, from user space.
            let here = h.buf.len().min(usize::try_from(n).unwrap_or(usize::MAX));
            self.write(&h.buf.split_to(here)).await?;
            kind = BodyKind::Length(n - here as u64);
            if n - here as u64 >= SPLICE_MIN {
                if let Some(pipe) = self.pipe.take().or_else(Pipe::open) {
                    return self.splice(pipe, n - here as u64).await;
                }
            }
        }
        let mut body = BodyReader::new(kind);
        while let Some(piece) = body.next(self.backend, &mut h.buf, self.timeout).await? {
            self.write(&piece).await?;
        }
        Ok(())
    }

    /// Splices the `len` bytes left of a body through `pipe`, kept for the next body unless
    /// this one failed (it may hold bytes of it).
    async fn splice(&mut self, mut pipe: Pipe, len: u64) -> std::io::Result<()> {
        let bounds = (self.timeout, self.stall);
        pipe.stream(self.backend, self.client, len, bounds, &mut self.sent).await?;
        self.pipe = Some(pipe);
        Ok(())
    }

    /// Writes to the client, counting what it took; `stall` passing without it taking a byte
    /// is an error (a client that stopped reading must not hold the agent and its backend).
    async fn write(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        while !bytes.is_empty() {
            let n = match tokio::time::timeout(self.stall, self.client.write(bytes)).await {
                Ok(r) => r?,
                Err(_) => return Err(stalled(self.stall)),
            };
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            bytes = &bytes[n..];
            self.sent += n as u64;
        }
        Ok(())
    }
}

/// Passes the client socket to the backend that deferred a body (`defer::SINK`) and waits for
/// its report: whether it wrote the whole body, and how many bytes it wrote.
async fn pass_client(u: &mut tokio::net::UnixStream, client: &TcpStream) -> std::io::Result<(bool, u64)> {
    use std::os::fd::AsFd;
    let mut at = 0;
    while at == 0 {
        u.writable().await?;
        match u.try_io(tokio::io::Interest::WRITABLE, || {
            refract_handover::send_with_fd(u.as_fd(), client.as_fd(), &defer::SINK)
        }) {
            Ok(n) => at = n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    // The socket went with the first byte; the rest of the word (if any) follows plainly.
    u.write_all(&defer::SINK[at..]).await?;
    let mut report = [0u8; defer::REPORT_LEN];
    u.read_exact(&mut report)
        .await
        .map_err(|e| if e.kind() == std::io::ErrorKind::UnexpectedEof { eof() } else { e })?;
    defer::parse_report(&report)
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "not a report on a deferred body"))
}

/// Runs `work` while `ask` keeps the link alive.
async fn beating<A: Ask, T>(ask: &mut A, work: impl Future<Output = T>) -> refract_handover::Result<T> {
    tokio::select! {
        r = work => Ok(r),
        r = ask.beat() => match r {
            Err(e) => Err(e),
            Ok(never) => match never {},
        },
    }
}

/// Reads interim responses and the final head of a response; returns what was read, where the
/// final head starts, and the head.
pub async fn read_response_head(
    s: &mut BackendStream,
    timeout: Duration,
    head_request: bool,
) -> std::io::Result<(BytesMut, usize, ResponseHead)> {
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut at = 0;
    loop {
        let parsed = ResponseHead::parse(&buf[at..], MAX_HEAD, head_request)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        match parsed {
            Some(h) if h.is_interim() => at += h.len,
            Some(h) => return Ok((buf, at, h)),
            None if read_more(s, &mut buf, timeout).await? == 0 => return Err(eof()),
            None => {}
        }
    }
}

/// Pulls a response body off the backend in pieces, whatever its framing.
#[derive(Debug)]
pub struct BodyReader {
    kind: BodyKind,
    left: u64,
    dec: ChunkedDecoder,
    done: bool,
}

impl BodyReader {
    /// A reader for a body of `kind`.
    pub fn new(kind: BodyKind) -> Self {
        let left = if let BodyKind::Length(n) = kind { n } else { 0 };
        BodyReader { kind, left, dec: ChunkedDecoder::new(), done: kind == BodyKind::None }
    }

    /// The next piece of the body (from `buf` first, then the backend); `None` at its end.
    pub async fn next(
        &mut self,
        s: &mut BackendStream,
        buf: &mut BytesMut,
        timeout: Duration,
    ) -> std::io::Result<Option<bytes::Bytes>> {
        loop {
            if self.done || (self.kind != BodyKind::Chunked && self.kind != BodyKind::UntilClose && self.left == 0) {
                return Ok(None);
            }
            if !buf.is_empty() {
                let take = match self.kind {
                    BodyKind::Length(_) => {
                        let take = self.left.min(buf.len() as u64) as usize;
                        self.left -= take as u64;
                        take
                    }
                    BodyKind::Chunked => {
                        let take = self
                            .dec
                            .advance(buf)
                            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
                        self.done = self.dec.is_done();
                        take
                    }
                    _ => buf.len(),
                };
                if take > 0 {
                    return Ok(Some(buf.split_to(take).freeze()));
                }
            }
            if read_more(s, buf, timeout).await? == 0 {
                if self.kind == BodyKind::UntilClose {
                    self.done = true;
                    return Ok(None);
                }
                return Err(eof());
            }
        }
    }
}

async fn read_more(s: &mut BackendStream, buf: &mut BytesMut, timeout: Duration) -> std::io::Result<usize> {
    buf.reserve(READ_CHUNK);
    match tokio::time::timeout(timeout, s.read_buf(buf)).await {
        Ok(r) => r,
        Err(_) => Err(timed_out()),
    }
}

/// The response head with `x-refract-handover: EPOCH` added before its blank line, so a
/// client (and the tests) can tell which responses came straight from the agent.
fn tag(head: &[u8], epoch: u64) -> Vec<u8> {
    let end = head.len().saturating_sub(2);
    let mut out = Vec::with_capacity(head.len() + 32);
    out.extend_from_slice(&head[..end]);
    out.extend_from_slice(format!("x-refract-handover: {epoch}\r\n\r\n").as_bytes());
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn whole_requests_only() {
        let get = b"GET /blob?bytes=1 HTTP/1.1\r\nhost: x\r\n\r\n";
        assert_eq!(whole_request(get).map(|(n, _)| n), Some(get.len()));
        assert!(whole_request(&get[..10]).is_none());
        let post = b"POST /blob HTTP/1.1\r\nhost: t\r\ncontent-length: 3\r\n\r\nab";
        assert!(whole_request(post).is_none());
        let post = b"POST /blob HTTP/1.1\r\nhost: t\r\ncontent-length: 3\r\n\r\nabcGET";
        assert_eq!(whole_request(post).map(|(n, _)| n), Some(post.len() - 3));
        assert!(whole_request(b"POST / HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n").is_none());
    }

    #[test]
    fn waiting_is_only_for_requests_that_can_be_asked_about() {
        assert!(may_complete(b""));
        assert!(may_complete(b"GET /blob?bytes=1 HT"));
        assert!(may_complete(b"POST /blob HTTP/1.1\r\nhost: t\r\ncontent-length: 3\r\n\r\nab"));
        assert!(
            !may_complete(b"POST / HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n"),
            "chunked: hand back"
        );
        let huge = format!("POST /blob HTTP/1.1\r\nhost: t\r\ncontent-length: {MAX_PENDING}\r\n\r\n");
        assert!(!may_complete(huge.as_bytes()), "a body beyond the bound: hand back");
        assert!(!may_complete(b"\x00\x01 not http\r\n\r\n"), "garbage: the dispatcher answers it");
        assert!(!may_complete(&vec![b'a'; MAX_PENDING]));
    }

    #[test]
    fn only_the_agent_asks_the_backend_to_defer_and_client_internal_headers_are_dropped() {
        let req = b"GET /blob?bytes=9 HTTP/1.1\r\nX-Refract-Defer: 1\r\nhost: t\r\nx-refract-deadline-ms: 1\r\n\r\n";
        let plain = b"GET /blob?bytes=9 HTTP/1.1\r\nhost: t\r\n\r\n";
        assert_eq!(&*to_backend(false, req, req.len(), 5), plain, "the client's header is dropped");
        let asked = to_backend(true, req, req.len(), 65536);
        assert_eq!(&*asked, b"GET /blob?bytes=9 HTTP/1.1\r\nhost: t\r\nx-refract-defer: 65536\r\n\r\n");
        assert!(matches!(to_backend(false, plain, plain.len(), 5), Cow::Borrowed(_)), "no copy without one");
        let post = b"POST /blob HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n\r\nab";
        assert_eq!(
            &*to_backend(true, post, post.len() - 2, 7),
            b"POST /blob HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\nx-refract-defer: 7\r\n\r\nab"
        );
    }

    #[test]
    fn the_tag_goes_before_the_blank_line() {
        assert_eq!(tag(b"HTTP/1.1 200 OK\r\n\r\n", 3), b"HTTP/1.1 200 OK\r\nx-refract-handover: 3\r\n\r\n");
    }
}
