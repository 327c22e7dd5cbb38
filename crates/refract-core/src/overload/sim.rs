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
    /// How long refused requests waited for their refusal, milliseconds, sorted.
    pub refused_ms: Vec<f64>,
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
        self.serve_for(self.service).await;
    }

    async fn serve_for(&self, service: Duration) {
        let _slot = self.slots.acquire().await;
        tokio::time::sleep(service).await;
    }
}

/// A closed loop: `clients` each send `per_client` requests one after the other (no deadline),
/// the next when the previous is answered; service times are log-uniform from 10 µs to
/// `longest` (a mix of tiny and large reads). Returns what was seen.
pub(crate) async fn closed_loop(
    adm: &Arc<Admission>,
    backend: &Arc<Backend>,
    clients: usize,
    per_client: usize,
    longest: Duration,
) -> Seen {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let span = (longest.as_secs_f64() / 1e-5).ln();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (adm, backend, seen) = (adm.clone(), backend.clone(), seen.clone());
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(c as u64);
                for _ in 0..per_client {
                    let service = Duration::from_secs_f64(1e-5 * (rng.gen::<f64>() * span).exp());
                    let arrived = Instant::now();
                    match adm.acquire(Priority::Normal, None).await {
                        Ok(permit) => {
                            backend.serve_for(service).await;
                            permit.finish(Outcome::Success);
                            let ms = arrived.elapsed().as_secs_f64() * 1e3;
                            seen.lock().unwrap_or_else(|p| p.into_inner()).admitted_ms.push(ms);
                        }
                        Err(_) => seen.lock().unwrap_or_else(|p| p.into_inner()).refused += 1,
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    let mut s = std::mem::take(&mut *seen.lock().unwrap_or_else(|p| p.into_inner()));
    s.admitted_ms.sort_by(f64::total_cmp);
    s.limit = adm.view().limit;
    s
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
                Err(_) => {
                    let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
                    s.refused += 1;
                    s.refused_ms.push(arrived.elapsed().as_secs_f64() * 1e3);
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let mut s = std::mem::take(&mut *seen.lock().unwrap_or_else(|p| p.into_inner()));
    s.admitted_ms.sort_by(f64::total_cmp);
    s.queued_ms.sort_by(f64::total_cmp);
    s.refused_ms.sort_by(f64::total_cmp);
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
                "{level}x: p50 {:.1} p99 {:.1} queued p50 {:.1} p99 {:.1} limit {} goodput {:.0}/s refused {} (p99 {:.1})",
                s.p(0.5),
                s.p(0.99),
                pct(&s.queued_ms, 0.5),
                pct(&s.queued_ms, 0.99),
                s.limit,
                s.admitted_ms.len() as f64 / 5.0,
                s.refused,
                pct(&s.refused_ms, 0.99)
            );
        }
        let high = offer(&adm, &backend, 3.0 * CAPACITY, Duration::from_secs(5), timeout, 3).await;
        let good = high.admitted_ms.len() as f64 / 5.0;
        eprintln!(
            "0.5x: p50 {:.1} p99 {:.1} limit {}; 3x: p50 {:.1} p99 {:.1} queued p50 {:.1} p99 {:.1} limit {} goodput {good:.0}/s refused {} (p99 {:.1})",
            low.p(0.5),
            low.p(0.99),
            low.limit,
            high.p(0.5),
            high.p(0.99),
            pct(&high.queued_ms, 0.5),
            pct(&high.queued_ms, 0.99),
            high.limit,
            high.refused,
            pct(&high.refused_ms, 0.99)
        );
        assert!(high.p(0.99) <= 2.0 * low.p(0.99), "p99 at 3x {:.1} ms vs {:.1} ms at 0.5x", high.p(0.99), low.p(0.99));
        assert!(good >= 0.9 * CAPACITY, "goodput {good:.0}/s");
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_loop_is_served_in_full() {
        // 64 clients, each request 10 µs to 50 ms, a backend of 8 workers: the queue stands
        // (56 waiting) but cannot grow past the population, so nothing is refused.
        let adm = Admission::new(AdmissionConfig::default());
        let backend = Backend::new(8, Duration::from_millis(10));
        let s = closed_loop(&adm, &backend, 64, 64, Duration::from_millis(50)).await;
        eprintln!(
            "closed loop: served {} refused {} p99 {:.1} ms limit {}",
            s.admitted_ms.len(),
            s.refused,
            s.p(0.99),
            s.limit
        );
        assert_eq!((s.admitted_ms.len(), s.refused), (4096, 0));
    }

    /// `examples/loopback.toml`'s replicas: blob servers of 4 workers × 20 ms behind the
    /// default admission, half load then three times the capacity.
    #[tokio::test(start_paused = true)]
    async fn loopback_example_p99_at_three_times_capacity() {
        let capacity = 200.0;
        let adm = Admission::new(AdmissionConfig::default());
        let backend = Backend::new(4, Duration::from_millis(20));
        let timeout = Duration::from_secs(1);
        let low = offer(&adm, &backend, 0.5 * capacity, Duration::from_secs(10), timeout, 2).await;
        let high = offer(&adm, &backend, 3.0 * capacity, Duration::from_secs(10), timeout, 3).await;
        let good = high.admitted_ms.len() as f64 / 10.0;
        eprintln!(
            "0.5x: p99 {:.1}; 3x: p50 {:.1} p95 {:.1} p98 {:.1} p99 {:.1} limit {} goodput {good:.0}/s refused {}",
            low.p(0.99),
            high.p(0.5),
            high.p(0.95),
            high.p(0.98),
            high.p(0.99),
            high.limit,
            high.refused
        );
        assert!(high.p(0.99) <= 2.0 * low.p(0.99), "p99 at 3x {:.1} ms vs {:.1} ms at 0.5x", high.p(0.99), low.p(0.99));
        assert!(good >= 0.9 * capacity, "goodput {good:.0}/s");
    }
}
