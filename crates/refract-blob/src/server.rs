//! The blob server's HTTP loop: one task per connection, requests answered in order.

use crate::pattern;
use bytes::{Buf, BytesMut};
use refract_http::classify::{classify_plan, RouteClass};
use refract_http::{defer, reply, BodyKind, ChunkedDecoder, RequestHead};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::Semaphore;

const MAX_HEAD: usize = 64 * 1024;
/// Largest body kept in memory (query plans); larger bodies are consumed and discarded.
const MAX_KEPT_BODY: usize = 1 << 20;
/// Blobs up to this size are sent in one write together with their head.
const SMALL_BLOB: u64 = 64 * 1024;

/// What a blob server has served.
#[derive(Debug, Default)]
pub struct Stats {
    /// Reads: `GET /blob` and read-only plans.
    pub reads: AtomicU64,
    /// Writes: `POST /blob` and plans with write operators.
    pub writes: AtomicU64,
    /// Plans with a TableLoad.
    pub loads: AtomicU64,
    /// Bodies written straight into a client socket an agent passed (`refract_http::defer`).
    pub passed: AtomicU64,
}

/// A blob server's identity and capacity.
#[derive(Debug, Clone)]
pub struct BlobServer {
    name: String,
    delay: Duration,
    permits: Option<Arc<Semaphore>>,
    /// Counters, shared with whoever wants to read them in-process.
    pub stats: Arc<Stats>,
}

impl BlobServer {
    /// A server named `name` that spends `delay_ms` per query, `concurrency` at a time (0 = any).
    pub fn new(name: String, delay_ms: u64, concurrency: usize) -> Self {
        BlobServer {
            name,
            delay: Duration::from_millis(delay_ms),
            permits: (concurrency > 0).then(|| Arc::new(Semaphore::new(concurrency))),
            stats: Arc::default(),
        }
    }

    fn stats_json(&self) -> String {
        serde_json::json!({
            "name": self.name,
            "reads": self.stats.reads.load(Relaxed),
            "writes": self.stats.writes.load(Relaxed),
            "loads": self.stats.loads.load(Relaxed),
            "passed": self.stats.passed.load(Relaxed),
        })
        .to_string()
    }

    /// Simulated query processing: wait for a slot, then the delay.
    async fn process(&self) {
        let _permit = match &self.permits {
            Some(p) => p.clone().acquire_owned().await.ok(),
            None => None,
        };
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
    }
}

/// A client connection: TCP, or a Unix socket for a co-located agent.
trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// The Unix socket, over which an agent can pass the client's socket for a deferred body.
    fn unix(&mut self) -> Option<&mut UnixStream> {
        None
    }
}
impl Io for TcpStream {}
impl Io for UnixStream {
    fn unix(&mut self) -> Option<&mut UnixStream> {
        Some(self)
    }
}

/// Serves connections from `listener` until it fails.
pub async fn serve(listener: TcpListener, server: BlobServer) -> anyhow::Result<()> {
    serve_shared(listener, Arc::new(server)).await
}

/// [`serve`] with the server shared, so that a TCP and a Unix listener count into one `/stats`.
pub async fn serve_shared(listener: TcpListener, server: Arc<BlobServer>) -> anyhow::Result<()> {
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        spawn_connection(&server, stream);
    }
}

/// Serves connections from a Unix listener (the agent on the same host) until it fails.
pub async fn serve_unix(listener: UnixListener, server: Arc<BlobServer>) -> anyhow::Result<()> {
    loop {
        let (stream, _) = listener.accept().await?;
        spawn_connection(&server, stream);
    }
}

fn spawn_connection(server: &Arc<BlobServer>, stream: impl Io) {
    let server = server.clone();
    tokio::spawn(refract_process::contain("blob connection", async move {
        if let Err(e) = connection(&server, stream).await {
            tracing::debug!(error = %e, "blob connection ended");
        }
    }));
}

async fn connection(srv: &BlobServer, mut s: impl Io) -> std::io::Result<()> {
    let mut buf = BytesMut::with_capacity(16 * 1024);
    loop {
        let head = match read_head(&mut s, &mut buf).await? {
            Ok(Some(h)) => h,
            Ok(None) => return Ok(()),
            Err(e) => {
                let msg = e.to_string();
                return s.write_all(&reply::error(e.status(), &msg, &[], true)).await;
            }
        };
        let defer = defer::header_value(&buf[..head.len], defer::DEFER).and_then(|v| v.parse().ok());
        buf.advance(head.len);
        let body = match read_body(&mut s, &mut buf, head.body).await? {
            Ok(b) => b,
            Err(e) => return s.write_all(&reply::error(400, &e.to_string(), &[], true)).await,
        };
        if defer.is_some() && !buf.is_empty() {
            // The agent waits for each response before it sends the next request, and the
            // answer to a deferred head must be the next thing on the connection.
            let msg = "a deferrable request must not be pipelined";
            return s.write_all(&reply::error(400, msg, &[], true)).await;
        }
        respond(srv, &mut s, &head, &body, defer).await?;
        if !head.keep_alive {
            return Ok(());
        }
    }
}

type Parsed<T> = std::io::Result<Result<T, refract_http::Error>>;

async fn read_head(s: &mut impl Io, buf: &mut BytesMut) -> Parsed<Option<RequestHead>> {
    loop {
        match RequestHead::parse(buf, MAX_HEAD) {
            Ok(Some(h)) => return Ok(Ok(Some(h))),
            Ok(None) => {}
            Err(e) => return Ok(Err(e)),
        }
        if s.read_buf(buf).await? == 0 {
            return Ok(Ok(None));
        }
    }
}

/// Reads a request body, keeping at most [`MAX_KEPT_BODY`] bytes of it.
async fn read_body(s: &mut impl Io, buf: &mut BytesMut, kind: BodyKind) -> Parsed<Vec<u8>> {
    let mut kept = Vec::new();
    let mut keep = |b: &[u8]| {
        let room = MAX_KEPT_BODY.saturating_sub(kept.len());
        kept.extend_from_slice(&b[..b.len().min(room)]);
    };
    match kind {
        BodyKind::None | BodyKind::UntilClose => {}
        BodyKind::Length(mut left) => loop {
            let n = left.min(buf.len() as u64) as usize;
            keep(&buf[..n]);
            buf.advance(n);
            left -= n as u64;
            if left == 0 {
                break;
            }
            fill(s, buf).await?;
        },
        BodyKind::Chunked => {
            let mut dec = ChunkedDecoder::new();
            let mut raw = Vec::new();
            loop {
                let n = match dec.advance(buf) {
                    Ok(n) => n,
                    Err(e) => return Ok(Err(e)),
                };
                raw.extend_from_slice(&buf[..n.min(MAX_KEPT_BODY.saturating_sub(raw.len()))]);
                buf.advance(n);
                if dec.is_done() {
                    break;
                }
                fill(s, buf).await?;
            }
            keep(&refract_http::chunked::decode_all(&raw));
        }
    }
    Ok(Ok(kept))
}

async fn fill(s: &mut impl Io, buf: &mut BytesMut) -> std::io::Result<()> {
    if s.read_buf(buf).await? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

async fn respond(
    srv: &BlobServer,
    s: &mut impl Io,
    head: &RequestHead,
    body: &[u8],
    defer: Option<u64>,
) -> std::io::Result<()> {
    let close = !head.keep_alive;
    match (head.method.as_str(), head.path()) {
        ("GET", "/blob") => get_blob(srv, s, head, close, defer).await,
        ("POST", "/blob") => {
            srv.process().await;
            srv.stats.writes.fetch_add(1, Relaxed);
            s.write_all(&ok_json(srv, &format!("{{\"written\":{}}}", body.len()), close)).await
        }
        ("POST", "/query") => query(srv, s, body, close).await,
        ("GET", "/stats") => {
            s.write_all(&reply::response(200, "application/json", srv.stats_json().as_bytes(), close)).await
        }
        (_, "/blob" | "/query" | "/stats") => s.write_all(&reply::error(405, "method not allowed", &[], close)).await,
        _ => s.write_all(&reply::error(404, "no such path", &[("path", head.path())], close)).await,
    }
}

fn ok_json(srv: &BlobServer, body: &str, close: bool) -> Vec<u8> {
    let conn = if close { "connection: close\r\n" } else { "" };
    let mut out = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nx-served-by: {}\r\n{conn}\r\n",
        body.len(),
        srv.name
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

async fn query(srv: &BlobServer, s: &mut impl Io, body: &[u8], close: bool) -> std::io::Result<()> {
    srv.process().await;
    let class = classify_plan(body);
    let counter = match class {
        RouteClass::All => &srv.stats.loads,
        RouteClass::Write | RouteClass::Procedure => &srv.stats.writes,
        RouteClass::Read => &srv.stats.reads,
    };
    counter.fetch_add(1, Relaxed);
    let result = serde_json::json!({ "served_by": srv.name, "kind": class.as_str(), "rows": [] }).to_string();
    s.write_all(&ok_json(srv, &result, close)).await
}

/// `bytes`, `seed` and `chunked` of a blob request.
struct BlobParams {
    bytes: u64,
    seed: u64,
    chunked: bool,
}

fn blob_params(head: &RequestHead) -> Option<BlobParams> {
    let mut bytes = None;
    let (mut seed, mut chunked) = (0, false);
    for (k, v) in form_urlencoded::parse(head.query().unwrap_or("").as_bytes()) {
        match &*k {
            "bytes" => bytes = Some(v.parse().ok()?),
            "seed" => seed = v.parse().ok()?,
            "chunked" => chunked = v == "1" || v == "true",
            _ => {}
        }
    }
    Some(BlobParams { bytes: bytes?, seed, chunked })
}

async fn get_blob(
    srv: &BlobServer,
    s: &mut impl Io,
    head: &RequestHead,
    close: bool,
    defer: Option<u64>,
) -> std::io::Result<()> {
    let Some(p) = blob_params(head) else {
        return s.write_all(&reply::error(400, "need bytes=N (and optional seed=S) as integers", &[], close)).await;
    };
    srv.process().await;
    srv.stats.reads.fetch_add(1, Relaxed);
    if p.chunked {
        return chunked_blob(srv, s, p.bytes, p.seed, close).await;
    }
    let (n, seed) = (p.bytes, p.seed);
    let conn = if close { "connection: close\r\n" } else { "" };
    let mut out = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: {n}\r\nx-served-by: {}\r\n{conn}\r\n",
        srv.name
    )
    .into_bytes();
    if n <= SMALL_BLOB {
        let mut off = 0;
        while off < n {
            let chunk = pattern::slice(off, seed, (n - off) as usize);
            out.extend_from_slice(chunk);
            off += chunk.len() as u64;
        }
        return s.write_all(&out).await;
    }
    if let (Some(at_least), Some(unix)) = (defer, s.unix()) {
        if n >= at_least && !head.is_head() {
            return deferred(srv, unix, out, n, seed).await;
        }
    }
    s.write_all(&out).await?;
    write_pattern(s, n, seed, &mut 0).await
}

/// A deferred body (`refract_http::defer`): the head goes with `x-refract-deferred`, then the
/// agent says where the body goes: here, or the client's socket it passes along, which this
/// server writes the body to itself (no hop through the agent) before it reports.
async fn deferred(srv: &BlobServer, u: &mut UnixStream, head: Vec<u8>, n: u64, seed: u64) -> std::io::Result<()> {
    let head = defer::with_header(&head, head.len(), defer::DEFERRED, "1");
    u.write_all(&head).await?;
    let (word, fd) = answer(u).await?;
    match (word, fd) {
        (defer::HERE, None) => write_pattern(u, n, seed, &mut 0).await,
        (defer::SINK, Some(fd)) => {
            let client = std::net::TcpStream::from(fd);
            client.set_nonblocking(true)?;
            let mut client = TcpStream::from_std(client)?;
            let mut written = 0u64;
            let done = tokio::select! {
                r = write_pattern(&mut client, n, seed, &mut written) => r.is_ok(),
                () = agent_gone(u) => false,
            };
            if !done {
                // Whatever the client got is short of the length in the head: reset it, so it
                // cannot take a cut body for a whole one.
                let _ = client.set_zero_linger();
            }
            drop(client);
            if done {
                srv.stats.passed.fetch_add(1, Relaxed);
            }
            u.write_all(&defer::report(done, written)).await
        }
        _ => Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "not an answer to a deferred head")),
    }
}

/// The agent's 4-byte answer to a deferred head and the socket passed with it, if any.
async fn answer(u: &UnixStream) -> std::io::Result<([u8; 4], Option<std::os::fd::OwnedFd>)> {
    let (mut word, mut got, mut fd) = ([0u8; 4], 0, None);
    while got < word.len() {
        u.readable().await?;
        match u.try_io(Interest::READABLE, || refract_handover::recv_with_fd(u.as_fd(), &mut word[got..])) {
            Ok((0, _)) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok((k, passed)) => {
                got += k;
                fd = fd.or(passed);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok((word, fd))
}

/// Writes the `n` pattern bytes of a body; `written` (from 0) counts the bytes the socket took.
async fn write_pattern(s: &mut (impl AsyncWrite + Unpin), n: u64, seed: u64, written: &mut u64) -> std::io::Result<()> {
    while *written < n {
        let chunk = pattern::slice(*written, seed, (n - *written).min(1 << 20) as usize);
        let k = s.write(chunk).await?;
        if k == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        *written += k as u64;
    }
    Ok(())
}

/// Returns once the agent closed its end (or sent something it must not, mid-body): nobody
/// is left to hand the connection back, so the body stops.
async fn agent_gone(u: &UnixStream) {
    loop {
        if u.readable().await.is_err() {
            return;
        }
        match u.try_read(&mut [0u8; 1]) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            _ => return,
        }
    }
}

/// The same blob with `Transfer-Encoding: chunked` (chunks of at most 64 000 bytes).
async fn chunked_blob(srv: &BlobServer, s: &mut impl Io, n: u64, seed: u64, close: bool) -> std::io::Result<()> {
    let conn = if close { "connection: close\r\n" } else { "" };
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ntransfer-encoding: chunked\r\nx-served-by: {}\r\n{conn}\r\n",
        srv.name
    );
    s.write_all(head.as_bytes()).await?;
    let mut off = 0u64;
    while off < n {
        let chunk = pattern::slice(off, seed, (n - off).min(64_000) as usize);
        let mut out = format!("{:x}\r\n", chunk.len()).into_bytes();
        out.extend_from_slice(chunk);
        out.extend_from_slice(b"\r\n");
        s.write_all(&out).await?;
        off += chunk.len() as u64;
    }
    s.write_all(b"0\r\n\r\n").await
}
