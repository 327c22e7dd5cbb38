//! `refract bench streams` (hidden): the client `bench cluster` runs in a client host. Each
//! connection keeps `pipeline` requests for blobs in flight (sizes taken in turn, each with its
//! own seed), checks every body byte against the blob pattern, and on `--ports` binds the given
//! source port (so that `bench cluster` can choose which dispatcher rf-r's hash sends it to).
//! Prints one JSON line per connection at the end ([`ConnResult`]).

use crate::support::units::{parse_duration, ByteSize};
use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// What one run does.
#[derive(Debug, Clone, Args)]
pub struct StreamsSpec {
    /// `IP:PORT` to send to.
    #[arg(long)]
    pub target: SocketAddr,
    /// Connections (ignored when `--ports` is given: one per port).
    #[arg(long, default_value_t = 2)]
    pub connections: usize,
    /// Source ports to bind, one connection each.
    #[arg(long, value_delimiter = ',')]
    pub ports: Vec<u16>,
    /// The client host's own address (with `--ports`).
    #[arg(long)]
    pub source: Option<Ipv4Addr>,
    /// How long each connection sends requests.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Blob sizes, taken in turn (K = 1024).
    #[arg(long, default_value = "1K,64K,1M", value_delimiter = ',', value_parser = ByteSize::parse)]
    pub sizes: Vec<ByteSize>,
    /// Requests in flight per connection.
    #[arg(long, default_value_t = 2)]
    pub pipeline: usize,
}

/// One connection's outcome.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ConnResult {
    /// Its source port.
    pub port: u16,
    /// Complete, byte-exact responses.
    pub responses: u64,
    /// Body bytes received in them.
    pub bytes: u64,
    /// What ended it early, if anything (a reset, EOF, a wrong byte, a non-200).
    pub error: Option<String>,
    /// When, after the connection's start.
    pub error_after_ms: Option<u64>,
    /// Seconds it ran.
    pub seconds: f64,
}

/// Runs the connections and prints their lines.
pub fn main(spec: &StreamsSpec) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let results = rt.block_on(async {
        let mut tasks = vec![];
        let binds: Vec<Option<u16>> = if spec.ports.is_empty() {
            vec![None; spec.connections]
        } else {
            spec.ports.iter().map(|p| Some(*p)).collect()
        };
        for (i, port) in binds.into_iter().enumerate() {
            let spec = spec.clone();
            tasks.push(tokio::spawn(async move { one(&spec, i as u64, port).await }));
        }
        let mut out = vec![];
        for t in tasks {
            out.push(
                t.await.unwrap_or_else(|e| ConnResult { error: Some(format!("task: {e}")), ..Default::default() }),
            );
        }
        out
    });
    for r in results {
        println!("{}", serde_json::to_string(&r)?);
    }
    Ok(())
}

async fn connect(spec: &StreamsSpec, port: Option<u16>) -> Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    if let Some(port) = port {
        let source = spec.source.context("--ports needs --source")?;
        socket.set_reuseaddr(true)?;
        socket.bind(SocketAddr::V4(SocketAddrV4::new(source, port)))?;
    }
    let stream = tokio::time::timeout(Duration::from_secs(3), socket.connect(spec.target)).await??;
    stream.set_nodelay(true)?;
    Ok(stream)
}

async fn one(spec: &StreamsSpec, conn: u64, port: Option<u16>) -> ConnResult {
    let started = Instant::now();
    let mut r = ConnResult::default();
    let mut stream = match connect(spec, port).await {
        Ok(s) => s,
        Err(e) => {
            r.error = Some(format!("connect: {e}"));
            r.error_after_ms = Some(0);
            return r;
        }
    };
    r.port = stream.local_addr().map(|a| a.port()).unwrap_or_default();
    let deadline = started + spec.duration;
    let mut next = 0u64; // requests sent
    let mut in_flight = std::collections::VecDeque::new();
    let mut buf = Vec::with_capacity(1 << 20);
    let outcome: Result<()> = async {
        loop {
            while in_flight.len() < spec.pipeline.max(1) && Instant::now() < deadline {
                let size = spec.sizes[(next as usize) % spec.sizes.len().max(1)].0;
                let seed = conn * 1_000_003 + next;
                let req = format!("GET /blob?bytes={size}&seed={seed} HTTP/1.1\r\nHost: {}\r\n\r\n", spec.target);
                stream.write_all(req.as_bytes()).await?;
                in_flight.push_back((size, seed));
                next += 1;
            }
            let Some((size, seed)) = in_flight.pop_front() else { return Ok(()) };
            read_response(&mut stream, &mut buf, size, seed).await?;
            r.responses += 1;
            r.bytes += size;
        }
    }
    .await;
    r.seconds = started.elapsed().as_secs_f64();
    if let Err(e) = outcome {
        r.error = Some(format!("{e:#}"));
        r.error_after_ms = Some(started.elapsed().as_millis() as u64);
    }
    r
}

/// Reads one response (its head, then `size` body bytes, checked against the pattern).
async fn read_response(stream: &mut TcpStream, buf: &mut Vec<u8>, size: u64, seed: u64) -> Result<()> {
    let head_len = loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        if let httparse::Status::Complete(n) = resp.parse(buf)? {
            if resp.code != Some(200) {
                bail!("status {:?}", resp.code);
            }
            let length = resp.headers.iter().find(|h| h.name.eq_ignore_ascii_case("content-length"));
            let length: u64 =
                length.and_then(|h| std::str::from_utf8(h.value).ok()?.parse().ok()).context("no content-length")?;
            if length != size {
                bail!("content-length {length}, asked for {size}");
            }
            break n;
        }
        fill(stream, buf).await?;
    };
    buf.drain(..head_len);
    let mut offset = 0u64;
    while offset < size {
        if buf.is_empty() {
            fill(stream, buf).await?;
        }
        let take = (buf.len() as u64).min(size - offset) as usize;
        if let Some(at) = first_mismatch(&buf[..take], offset, seed) {
            bail!("wrong byte at offset {at} of a {size}-byte blob");
        }
        buf.drain(..take);
        offset += take as u64;
    }
    Ok(())
}

async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<()> {
    let mut chunk = [0u8; 65536];
    let n = stream.read(&mut chunk).await?;
    if n == 0 {
        bail!("connection closed");
    }
    buf.extend_from_slice(&chunk[..n]);
    Ok(())
}

/// The first offset where `data` (the blob with `seed` from `offset` on) is wrong, compared a
/// slice of the pattern at a time.
fn first_mismatch(data: &[u8], offset: u64, seed: u64) -> Option<u64> {
    let mut done = 0usize;
    while done < data.len() {
        let want = refract_blob::pattern::slice(offset + done as u64, seed, data.len() - done);
        let got = &data[done..done + want.len()];
        if got != want {
            return refract_blob::pattern::first_mismatch(got, offset + done as u64, seed);
        }
        done += want.len();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_is_the_blob_servers() {
        let data: Vec<u8> = (0..1000u64).map(|i| refract_blob::pattern::byte_at(i + 17, 5)).collect();
        assert_eq!(first_mismatch(&data, 17, 5), None);
        let mut wrong = data.clone();
        wrong[400] ^= 1;
        assert_eq!(first_mismatch(&wrong, 17, 5), Some(417));
    }
}
