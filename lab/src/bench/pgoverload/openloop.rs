//! The open loop: Poisson arrivals (the seeded [`Schedule`] `bench overload` uses, so every
//! target sees the same arrivals), each statement on an idle connection of a shared pool or a
//! new one (at most `max_conns`), latency from its scheduled start (no coordinated omission),
//! as `pgbench -R` measures. Unlike pgbench 15, an error does not end a client: each statement
//! is recorded as served, refused (53300 / 57014), timed out (no answer within the client
//! timeout: its connection is closed) or failed.

use super::conn::PgConn;
use crate::bench::loadgen::schedule::Schedule;
use refract_pg::testkit::{DATABASE, PASSWORD, USER};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// How one statement ended.
#[derive(Debug, Clone, PartialEq)]
pub enum End {
    /// Answered without error.
    Served,
    /// Refused with this SQLSTATE (`53300`, `57014`).
    Refused(String),
    /// No answer within the client timeout.
    Timeout,
    /// Anything else: another SQLSTATE, a broken or unavailable connection.
    Error(String),
}

/// One statement: how it ended and when, in ms from its scheduled start.
#[derive(Debug, Clone)]
pub struct Shot {
    /// How it ended.
    pub end: End,
    /// Milliseconds from its scheduled start to its answer.
    pub ms: f64,
}

/// Connections shared by the statements of a run (and kept between the runs of a target).
#[derive(Debug)]
pub struct Pool {
    addr: SocketAddr,
    idle: Mutex<Vec<PgConn>>,
    open: Mutex<usize>,
    max: usize,
}

impl Pool {
    /// An empty pool of at most `max` connections to `addr`.
    pub fn new(addr: SocketAddr, max: usize) -> Arc<Pool> {
        Arc::new(Pool { addr, idle: Mutex::new(vec![]), open: Mutex::new(0), max })
    }

    /// Opens `n` connections ahead of a run (logging in costs a SCRAM exchange).
    pub async fn prefill(self: &Arc<Self>, n: usize) -> anyhow::Result<()> {
        for _ in 0..n.min(self.max) {
            let c = self.connect().await.map_err(|e| anyhow::anyhow!("{e}"))?;
            self.checkin(c);
        }
        Ok(())
    }

    async fn connect(&self) -> Result<PgConn, String> {
        {
            let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
            if *open >= self.max {
                return Err("no free connection under the cap".into());
            }
            *open += 1;
        }
        let c = PgConn::connect(self.addr, USER, PASSWORD, DATABASE).await;
        c.map_err(|e| {
            self.closed();
            format!("{e:#}")
        })
    }

    fn closed(&self) {
        *self.open.lock().unwrap_or_else(PoisonError::into_inner) -= 1;
    }

    fn checkin(&self, c: PgConn) {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner).push(c);
    }

    async fn checkout(&self) -> Result<PgConn, String> {
        let idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
        match idle {
            Some(c) => Ok(c),
            None => self.connect().await,
        }
    }

    /// One statement, scheduled at `due`.
    async fn shot(self: Arc<Self>, sql: Arc<str>, due: Instant, timeout: Duration) -> Shot {
        let ms = || due.elapsed().as_secs_f64() * 1000.0;
        let mut c = match self.checkout().await {
            Ok(c) => c,
            Err(e) => return Shot { end: End::Error(e), ms: ms() },
        };
        let left = timeout.saturating_sub(due.elapsed());
        let end = match tokio::time::timeout(left, c.query(&sql)).await {
            Err(_) => End::Timeout,
            Ok(Err(e)) => End::Error(format!("{e:#}")),
            Ok(Ok(None)) => End::Served,
            Ok(Ok(Some(code))) if code == "53300" || code == "57014" => End::Refused(code),
            Ok(Ok(Some(code))) => End::Error(code),
        };
        let took = ms();
        if matches!(end, End::Timeout | End::Error(_)) {
            self.closed(); // the connection's state is unknown: dropped
        } else {
            self.checkin(c);
        }
        Shot { end, ms: took }
    }
}

/// Runs `sql` at `rate` per second for `secs` through `pool`; every shot, in arrival order.
pub async fn run(pool: &Arc<Pool>, sql: &str, rate: f64, secs: f64, seed: u64, timeout: Duration) -> Vec<Shot> {
    let schedule = Schedule::poisson(rate, Duration::from_secs_f64(secs), seed);
    let sql: Arc<str> = sql.into();
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(schedule.len());
    for at in schedule.arrivals {
        let due = start + at;
        tokio::time::sleep_until(due).await;
        tasks.push(tokio::spawn(pool.clone().shot(sql.clone(), due, timeout)));
    }
    let mut shots = Vec::with_capacity(tasks.len());
    for t in tasks {
        if let Ok(s) = t.await {
            shots.push(s);
        }
    }
    shots
}
