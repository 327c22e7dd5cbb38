//! refract's test backend, standing in for the paper's stored procedure that returns a result of
//! a requested size. `GET /blob?bytes=N&seed=S` streams N bytes where byte i is `(i + S) % 251`;
//! `POST /blob` is a write; `POST /query` takes a Hyrise-R plan; `GET /stats` counts what it
//! served. `--delay-ms` and `--concurrency` give it a real capacity.
//!
//! # Layout
//! - [`pattern`]: the blob byte pattern, shared with tests that check bodies byte-exact.
//! - `server`: the HTTP server (one task per connection, requests served in order).

pub mod pattern;
mod server;

pub use server::{serve, serve_shared, serve_unix, BlobServer, Stats};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `refract blob-server` options.
#[derive(clap::Args, Debug, Clone)]
pub struct BlobArgs {
    /// Address to listen on.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Name reported in `x-served-by` and `/stats`.
    #[arg(long)]
    pub name: String,
    /// Simulated processing time per query, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub delay_ms: u64,
    /// Queries processed at once (others wait); 0 = unbounded.
    #[arg(long, default_value_t = 0)]
    pub concurrency: usize,
    /// Also listen on this Unix socket (for an agent on the same host; `backend_socket` in its
    /// config). A stale socket file left there is replaced.
    #[arg(long)]
    pub unix: Option<PathBuf>,
}

/// How long the blob server may take to stop after SIGTERM or SIGINT before its watchdog
/// ends it (it drains nothing: its connections close at once).
pub const STOP_BOUND: std::time::Duration = std::time::Duration::from_secs(2);

/// Runs a blob server until SIGINT/SIGTERM.
pub fn run(args: BlobArgs) -> anyhow::Result<()> {
    refract_process::watchdog::start(|| STOP_BOUND)?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let served = rt.block_on(serve_until_stopped(args));
    rt.shutdown_timeout(std::time::Duration::from_millis(200));
    served
}

async fn serve_until_stopped(args: BlobArgs) -> anyhow::Result<()> {
    // Before the listener opens: a stop signal is never missed.
    let mut stop = refract_process::StopSignals::install()?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    tracing::info!(addr = %args.listen, name = %args.name, "blob server listening");
    let server = Arc::new(BlobServer::new(args.name, args.delay_ms, args.concurrency));
    let unix = match &args.unix {
        Some(path) => Some(bind_unix(path)?),
        None => None,
    };
    let on_unix = async {
        match unix {
            Some(l) => serve_unix(l, server.clone()).await,
            None => std::future::pending().await,
        }
    };
    let r = tokio::select! {
        r = serve_shared(listener, server.clone()) => r,
        r = on_unix => r,
        signal = stop.recv() => {
            tracing::info!(signal, "signal received: stopping");
            Ok(())
        }
    };
    if let Some(path) = &args.unix {
        let _ = std::fs::remove_file(path);
    }
    r
}

/// Binds a Unix listener at `path`, replacing a socket file a previous run left there (but
/// never another kind of file).
pub fn bind_unix(path: &Path) -> anyhow::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            anyhow::bail!("{} exists and is not a socket; not replacing it", path.display());
        }
        std::fs::remove_file(path)?;
    }
    let l = tokio::net::UnixListener::bind(path).map_err(|e| anyhow::anyhow!("listen on {}: {e}", path.display()))?;
    tracing::info!(path = %path.display(), "blob server listening on a Unix socket");
    Ok(l)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn a_stale_socket_is_replaced_but_never_another_file() {
        let dir = std::env::temp_dir().join(format!("rf-blob-unix-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("b.sock");
        let first = bind_unix(&sock).unwrap();
        drop(first); // the file stays behind, as after a killed run
        assert!(sock.exists());
        let again = bind_unix(&sock).unwrap();
        let srv = Arc::new(BlobServer::new("u".into(), 0, 0));
        tokio::spawn(serve_unix(again, srv.clone()));
        let mut c = tokio::net::UnixStream::connect(&sock).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        c.write_all(b"GET /blob?bytes=300&seed=9 HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n").await.unwrap();
        let mut got = Vec::new();
        c.read_to_end(&mut got).await.unwrap();
        let body = &got[got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4..];
        assert_eq!((body.len(), pattern::first_mismatch(body, 0, 9)), (300, None));
        assert_eq!(srv.stats.reads.load(std::sync::atomic::Ordering::Relaxed), 1);
        let plain = dir.join("data");
        std::fs::write(&plain, b"keep me").unwrap();
        let e = bind_unix(&plain).unwrap_err().to_string();
        assert!(e.contains("not a socket"), "{e}");
        assert_eq!(std::fs::read(&plain).unwrap(), b"keep me");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
