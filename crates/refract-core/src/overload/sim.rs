//! A simulated backend behind one [`Admission`], in paused time: `workers` requests at once,
//! `service` each, first come first served inside (like `refract blob-server --concurrency
//! --delay-ms`), and Poisson arrivals at a multiple of its capacity. It shows what admission
//! alone does to the latency of admitted requests, without the lab's CPU noise.

use super::admission::{Admission, AdmissionConfig, Outcome, Priority};
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// What one run saw.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// Latency (arrival → answer) of admitted requests, milliseconds, sorted.
    pub admitted_ms: Vec<f64>,
    /// Time admitted requests waited in refract's queue, milliseconds, sorted.
    pub queued_ms: Vec<f64>,
    /// Requests refused.
    pub refused: usize,
    /// The limit at the end.
    pub limit: usize,
}

impl Seen {
    pub(crate) fn p(&self, q: f64) -> f64 {
        pct(&self.admitted_ms, q)
    }
}

pub(crate) fn pct(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// A backend: `workers` at once, `service` each.
pub(crate) struct Backend {
    slots: Arc<Semaphore>,
    service: Duration,
}

impl Backend {
    pub(crate) fn new(workers: usize, service: Duration) -> Arc<Backend> {
        Arc::new(Backend { slots: Arc::new(Semaphore::new(workers)), service })
    }

    async fn serve(&self) {
        let _slot = self.slots.acquire().await;
        tokio::time::sleep(self.service).await;
    }
}

/// Offers `rate` requests per second for `for_` (Poisson, seeded), each with a `timeout`
/// deadline; waits until all are answered. Only arrivals after `measure_from` are recorded.
pub(crate) async fn offer(
    adm: &Arc<Admission>,
    backend: &Arc<Backend>,
    rate: f64,
    for_: Duration,
    timeout: Duration,
    seed: u64,
) -> Seen {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut rng = StdRng::seed_from_u64(seed);
    let start = Instant::now();
    let mut at = start;
    let mut tasks = Vec::new();
    loop {
        let gap: f64 = -(1.0 - rng.gen::<f64>()).ln() / rate;
        at += Duration::from_secs_f64(gap);
        if at - start >= for_ {
            break;
        }
        tokio::time::sleep_until(at).await;
        let (adm, backend, seen) = (adm.clone(), backend.clone(), seen.clone());
        tasks.push(tokio::spawn(async move {
            let arrived = Instant::now();
            match adm.acquire(Priority::Normal, Some(arrived + timeout)).await {
                Ok(permit) => {
                    let queued = arrived.elapsed();
                    backend.serve().await;
                    permit.finish(Outcome::Success);
                    let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
                    s.admitted_ms.push(arrived.elapsed().as_secs_f64() * 1e3);
                    s.queued_ms.push(queued.as_secs_f64() * 1e3);
                }
                Err(_) => seen.lock().unwrap_or_else(|p| p.into_inner()).refused += 1,
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let mut s = std::mem::take(&mut *seen.lock().unwrap_or_else(|p| p.into_inner()));
    s.admitted_ms.sort_by(f64::total_cmp);
    s.queued_ms.sort_by(f64::total_cmp);
    s.limit = adm.view().limit;
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 8 workers × 10 ms: 800 requests/s.
    const CAPACITY: f64 = 800.0;

    #[tokio::test(start_paused = true)]
    async fn admitted_latency_at_three_times_capacity() {
        let adm = Admission::new(AdmissionConfig::default());
        let backend = Backend::new(8, Duration::from_millis(10));
        let timeout = Duration::from_secs(1);
        let _warm = offer(&adm, &backend, 0.5 * CAPACITY, Duration::from_secs(1), timeout, 1).await;
        let low = offer(&adm, &backend, 0.5 * CAPACITY, Duration::from_secs(5), timeout, 2).await;
        for (i, level) in [1.0, 1.5, 2.0].into_iter().enumerate() {
            let s = offer(&adm, &backend, level * CAPACITY, Duration::from_secs(5), timeout, 10 + i as u64).await;
            eprintln!(
                "{level}x: p50 {:.1} p99 {:.1} queued p50 {:.1} p99 {:.1} limit {} goodput {:.0}/s refused {}",
                s.p(0.5),
                s.p(0.99),
                pct(&s.queued_ms, 0.5),
                pct(&s.queued_ms, 0.99),
                s.limit,
                s.admitted_ms.len() as f64 / 5.0,
                s.refused
            );
        }
        let high = offer(&adm, &backend, 3.0 * CAPACITY, Duration::from_secs(5), timeout, 3).await;
        let good = high.admitted_ms.len() as f64 / 5.0;
        eprintln!(
            "0.5x: p50 {:.1} p99 {:.1} limit {}; 3x: p50 {:.1} p99 {:.1} queued p50 {:.1} p99 {:.1} limit {} goodput {good:.0}/s refused {}",
            low.p(0.5),
            low.p(0.99),
            low.limit,
            high.p(0.5),
            high.p(0.99),
            pct(&high.queued_ms, 0.5),
            pct(&high.queued_ms, 0.99),
            high.limit,
            high.refused
        );
        assert!(high.p(0.99) <= 2.0 * low.p(0.99), "p99 at 3x {:.1} ms vs {:.1} ms at 0.5x", high.p(0.99), low.p(0.99));
        assert!(good >= 0.9 * CAPACITY, "goodput {good:.0}/s");
    }
}
