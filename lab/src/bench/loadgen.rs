//! The load generator behind `refract bench overload` (hidden `refract bench loadgen`): open
//! loop — Poisson arrivals at a set rate, whatever the answers do — or closed loop (N workers
//! back to back, to find a capacity). Every request goes over a pooled keep-alive connection,
//! carries the client timeout as `x-refract-timeout-ms`, and ends as one [`Record`].
//!
//! Latency counts from the scheduled start, not the send, so that a late sender cannot hide
//! queueing (no coordinated omission).
//!
//! Inside: [`schedule`] (arrival times), [`pool`] (the connections), [`summary`] (the
//! statistics).

pub mod pool;
pub mod schedule;
pub mod summary;

use crate::support::sh;
use crate::support::units::parse_duration;
use anyhow::{bail, Context, Result};
use clap::Args;
use pool::{Failure, Pool};
use schedule::Schedule;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use summary::{Outcome, Record};
use tokio::time::Instant;

/// What one run does.
#[derive(Debug, Clone, Args)]
pub struct Spec {
    /// `IP:PORT` to send to.
    #[arg(long)]
    pub target: SocketAddr,
    /// Open loop: arrivals per second (Poisson).
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// How long arrivals are scheduled (or the closed loop runs).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Client timeout per attempt, ms; also sent as `x-refract-timeout-ms`.
    #[arg(long, default_value_t = 1000)]
    pub timeout_ms: u64,
    /// Most connections open at once; an arrival finding all busy at the maximum fails.
    #[arg(long, default_value_t = 2000)]
    pub max_conns: usize,
    /// Payload size asked for (`GET /blob?bytes=N`).
    #[arg(long, default_value_t = 64)]
    pub bytes: u64,
    /// Seed of the arrival schedule.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Retry once on a timeout or an error (not on a refusal).
    #[arg(long)]
    pub retry: bool,
    /// Closed loop with this many workers instead of the open loop (0 = open loop).
    #[arg(long, default_value_t = 0)]
    pub closed: usize,
}

/// What a run prints (JSON on stdout).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Output {
    /// Seconds the schedule (or the closed loop) spanned.
    pub duration_s: f64,
    /// One per request.
    pub records: Vec<Record>,
}

/// `refract bench loadgen`: run and print the JSON output.
pub fn main(spec: &Spec) -> Result<()> {
    let out = run_blocking(spec)?;
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}

/// Run on a fresh two-thread runtime.
pub fn run_blocking(spec: &Spec) -> Result<Output> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    Ok(rt.block_on(run(spec)))
}

/// Run on the current runtime.
pub async fn run(spec: &Spec) -> Output {
    let shared = Arc::new(Shared {
        pool: Pool::new(spec.target, spec.max_conns),
        request: request_bytes(spec),
        timeout: Duration::from_millis(spec.timeout_ms),
        retry: spec.retry,
    });
    let records = if spec.closed > 0 {
        closed_loop(&shared, spec.closed, spec.duration).await
    } else {
        open_loop(&shared, &Schedule::poisson(spec.rate, spec.duration, spec.seed)).await
    };
    Output { duration_s: spec.duration.as_secs_f64(), records }
}

/// What every request task needs.
struct Shared {
    pool: Pool,
    request: Vec<u8>,
    timeout: Duration,
    retry: bool,
}

/// The request, the same every time.
pub fn request_bytes(spec: &Spec) -> Vec<u8> {
    format!(
        "GET /blob?bytes={} HTTP/1.1\r\nHost: {}\r\nx-refract-timeout-ms: {}\r\n\r\n",
        spec.bytes, spec.target, spec.timeout_ms
    )
    .into_bytes()
}

/// Fire each request at its scheduled time, each in its own task; collect them all. Every
/// task ends within its timeouts, so this ends too.
async fn open_loop(shared: &Arc<Shared>, schedule: &Schedule) -> Vec<Record> {
    let t0 = Instant::now() + Duration::from_millis(20);
    let mut tasks = Vec::with_capacity(schedule.len());
    for &offset in &schedule.arrivals {
        let due = t0 + offset;
        tokio::time::sleep_until(due).await;
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move { one_request(&shared, t0, due).await }));
    }
    let mut records = Vec::with_capacity(tasks.len());
    for t in tasks {
        if let Ok(r) = t.await {
            records.push(r);
        }
    }
    records
}

/// `workers` clients back to back until `duration` has passed.
async fn closed_loop(shared: &Arc<Shared>, workers: usize, duration: Duration) -> Vec<Record> {
    let t0 = Instant::now();
    let end = t0 + duration;
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let shared = shared.clone();
            tokio::spawn(async move {
                let mut v = Vec::new();
                while Instant::now() < end {
                    v.push(one_request(&shared, t0, Instant::now()).await);
                }
                v
            })
        })
        .collect();
    let mut records = Vec::new();
    for t in tasks {
        records.extend(t.await.unwrap_or_default());
    }
    records
}

/// One logical request due at `due`: an attempt, and in retry mode a second one after a
/// timeout or an error.
async fn one_request(shared: &Shared, t0: Instant, due: Instant) -> Record {
    let lag_us = due.elapsed().as_micros() as u64;
    let mut attempts = 1;
    let mut r = attempt(shared, due + shared.timeout).await;
    if shared.retry && matches!(r.0, Outcome::Timeout | Outcome::Error) {
        attempts = 2;
        r = attempt(shared, Instant::now() + shared.timeout).await;
    }
    let (outcome, status, backend) = r;
    Record {
        start_us: (due - t0).as_micros() as u64,
        latency_us: due.elapsed().as_micros() as u64,
        status,
        outcome,
        attempts,
        lag_us,
        backend,
    }
}

/// One attempt that must end by `deadline`.
async fn attempt(shared: &Shared, deadline: Instant) -> (Outcome, u16, Option<String>) {
    match tokio::time::timeout_at(deadline, shared.pool.exchange(&shared.request)).await {
        Err(_) => (Outcome::Timeout, 0, None),
        Ok(Err(Failure::PoolFull | Failure::Io(_))) => (Outcome::Error, 0, None),
        Ok(Ok(reply)) => {
            let outcome = match reply.status {
                200 => Outcome::Ok,
                503 => Outcome::Refused,
                _ => Outcome::Error,
            };
            (outcome, reply.status, reply.served_by)
        }
    }
}

/// The command that runs `spec` in namespace `ns` (this same binary, `bench loadgen`).
pub fn command(ns: Option<&str>, spec: &Spec) -> Result<Command> {
    let exe = std::env::current_exe().context("locating the refract binary")?;
    let mut args = vec![
        "bench".to_string(),
        "loadgen".into(),
        format!("--target={}", spec.target),
        format!("--rate={}", spec.rate),
        format!("--duration={}ms", spec.duration.as_millis()),
        format!("--timeout-ms={}", spec.timeout_ms),
        format!("--max-conns={}", spec.max_conns),
        format!("--bytes={}", spec.bytes),
        format!("--seed={}", spec.seed),
        format!("--closed={}", spec.closed),
    ];
    if spec.retry {
        args.push("--retry".into());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut c = sh::cmd(ns, &exe.to_string_lossy(), &args);
    c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).env("RUST_LOG", "warn");
    Ok(c)
}

/// Start `spec` in each namespace at once; wait for all and parse their outputs.
pub fn run_parallel(runs: &[(Option<&str>, Spec)]) -> Result<Vec<Output>> {
    let mut children: Vec<(String, Child)> = Vec::new();
    for (ns, spec) in runs {
        let mut c = command(*ns, spec)?;
        let shown = sh::show(&c);
        children.push((shown.clone(), c.spawn().with_context(|| format!("cannot start `{shown}`"))?));
    }
    children
        .into_iter()
        .map(|(shown, child)| {
            let out = child.wait_with_output().with_context(|| format!("waiting for `{shown}`"))?;
            if !out.status.success() {
                bail!("`{shown}` failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
            }
            serde_json::from_slice(&out.stdout).with_context(|| format!("parsing the output of `{shown}`"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use refract_blob::{serve, BlobServer};
    use summary::Summary;

    fn spec(target: SocketAddr) -> Spec {
        Spec {
            target,
            rate: 400.0,
            duration: Duration::from_millis(1000),
            timeout_ms: 500,
            max_conns: 64,
            bytes: 64,
            seed: 5,
            retry: false,
            closed: 0,
        }
    }

    async fn blob(delay_ms: u64, concurrency: usize) -> SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        tokio::spawn(serve(l, BlobServer::new("t1".into(), delay_ms, concurrency)));
        addr
    }

    #[test]
    fn request_carries_the_deadline() {
        let s = spec("127.0.0.1:9".parse().expect("addr"));
        let text = String::from_utf8(request_bytes(&s)).expect("utf8");
        assert_eq!(text, "GET /blob?bytes=64 HTTP/1.1\r\nHost: 127.0.0.1:9\r\nx-refract-timeout-ms: 500\r\n\r\n");
    }

    /// Loopback smoke test: 1 s of Poisson arrivals at 400/s against a blob server with room
    /// to spare; everything succeeds, on few connections, attributed to the server.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn open_loop_against_a_blob_server() {
        let addr = blob(2, 0).await;
        let out = run(&spec(addr)).await;
        let s = Summary::of(&out.records, out.duration_s);
        assert!((300..500).contains(&s.sent), "sent {}", s.sent);
        assert_eq!(s.ok, s.sent, "{s:?}");
        assert!(s.p50_ms.expect("p50") >= 2.0, "{s:?}");
        assert!(out.records.iter().all(|r| r.backend.as_deref() == Some("t1")));
    }

    /// Overload on loopback: a 5 ms, 1-slot server (200/s) offered 400/s with a 100 ms timeout
    /// times requests out; the closed loop finds the capacity.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn overload_times_out_and_closed_loop_finds_capacity() {
        let addr = blob(5, 1).await;
        let mut s = spec(addr);
        s.timeout_ms = 100;
        let out = run(&s).await;
        let sum = Summary::of(&out.records, out.duration_s);
        assert!(sum.timeouts > 0 && sum.ok > 0, "{sum:?}");
        assert!(sum.goodput < 260.0, "{sum:?}");
        // A fresh server: the first still works through what the timed-out clients left.
        s.target = blob(5, 1).await;
        s.closed = 4;
        s.duration = Duration::from_millis(600);
        let out = run(&s).await;
        let sum = Summary::of(&out.records, out.duration_s);
        assert!((100.0..=210.0).contains(&sum.goodput), "{sum:?}");
    }

    #[tokio::test]
    async fn refused_connections_are_errors_and_retried() {
        // A port with no listener: every attempt fails to connect.
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        drop(l);
        let mut s = spec(addr);
        s.rate = 50.0;
        s.duration = Duration::from_millis(200);
        s.retry = true;
        let out = run(&s).await;
        assert!(!out.records.is_empty());
        assert!(out.records.iter().all(|r| r.outcome == Outcome::Error && r.attempts == 2));
    }
}
