//! Where the CPU goes during a run: the machine's busy and idle time (`/proc/stat`) and one
//! dispatcher's user and system time (`/proc/PID/stat`), sampled before and after, so that a
//! report can give CPU per request and the ceiling it implies. On the lab's 2-core machine the
//! clients, the backends, the dispatcher and the kernel's networking share the CPUs, so a
//! dispatcher's speed at small sizes is bounded by what the others cost per request.

use std::time::Duration;

/// Machine-wide CPU time (all CPUs summed), in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MachineTicks {
    /// Every column of the `cpu` line (guest time is already part of user time and is left out).
    pub total: u64,
    /// `idle` + `iowait`.
    pub idle: u64,
}

impl MachineTicks {
    /// Parses the aggregate `cpu ` line of `/proc/stat`.
    pub fn parse(stat: &str) -> Option<MachineTicks> {
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let v: Vec<u64> = line.split_whitespace().skip(1).map(str::parse).collect::<Result<_, _>>().ok()?;
        if v.len() < 4 {
            return None;
        }
        // user nice system idle iowait irq softirq steal [guest guest_nice]
        let total = v.iter().take(8).sum();
        let idle = v[3] + v.get(4).copied().unwrap_or(0);
        Some(MachineTicks { total, idle })
    }

    /// Now, from `/proc/stat`.
    pub fn now() -> Option<MachineTicks> {
        MachineTicks::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }
}

/// One process's CPU time, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProcTicks {
    /// `utime`.
    pub user: u64,
    /// `stime`.
    pub system: u64,
}

impl ProcTicks {
    /// Parses `/proc/PID/stat`. The command name (field 2) is in parentheses and may hold
    /// spaces or parentheses itself, so fields are counted from the last `)`.
    pub fn parse(stat: &str) -> Option<ProcTicks> {
        let rest = &stat[stat.rfind(')')? + 1..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        // After the name: state (3) ppid pgrp session tty_nr tpgid flags minflt cminflt majflt
        // cmajflt utime (14) stime (15): indices 11 and 12 here.
        Some(ProcTicks { user: f.get(11)?.parse().ok()?, system: f.get(12)?.parse().ok()? })
    }

    /// Now, for `pid`.
    pub fn of(pid: u32) -> Option<ProcTicks> {
        ProcTicks::parse(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
    }
}

/// Clock ticks per second (`getconf CLK_TCK`; the kernel's `USER_HZ`, 100 on Linux's
/// mainstream architectures, which is the fallback).
/// Asked once per process.
pub fn ticks_per_sec() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<f64>().ok())
            .filter(|t| *t > 0.0)
            .unwrap_or(100.0)
    })
}

/// A sample taken before a run.
#[derive(Debug, Clone, Copy)]
pub struct Before {
    machine: Option<MachineTicks>,
    pid: Option<u32>,
    process: Option<ProcTicks>,
}

impl Before {
    /// Samples the machine and, if given, the dispatcher process `pid`.
    pub fn take(pid: Option<u32>) -> Before {
        Before { machine: MachineTicks::now(), pid, process: pid.and_then(ProcTicks::of) }
    }

    /// The CPU used since, for a run that completed `requests`. `None` if `/proc` could not be
    /// read.
    pub fn finish(&self, requests: f64) -> Option<CpuUse> {
        let after = MachineTicks::now()?;
        let process = match (self.pid, self.process) {
            (Some(pid), Some(p0)) => ProcTicks::of(pid).map(|p1| (p0, p1)),
            _ => None,
        };
        Some(CpuUse::between(self.machine?, after, process, requests, ticks_per_sec()))
    }
}

/// CPU used during one run.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CpuUse {
    /// Requests completed (summed over the clients).
    pub requests: f64,
    /// CPU time busy, all CPUs.
    pub busy: Duration,
    /// CPU time idle, all CPUs.
    pub idle: Duration,
    /// The dispatcher's user and system time, if there is a dispatcher and it was found.
    pub dispatcher: Option<(Duration, Duration)>,
}

impl CpuUse {
    /// From two samples of each.
    pub fn between(
        m0: MachineTicks,
        m1: MachineTicks,
        process: Option<(ProcTicks, ProcTicks)>,
        requests: f64,
        ticks_per_sec: f64,
    ) -> CpuUse {
        let secs = |ticks: u64| Duration::from_secs_f64(ticks as f64 / ticks_per_sec);
        let total = m1.total.saturating_sub(m0.total);
        let idle = m1.idle.saturating_sub(m0.idle);
        CpuUse {
            requests,
            busy: secs(total.saturating_sub(idle)),
            idle: secs(idle),
            dispatcher: process
                .map(|(p0, p1)| (secs(p1.user.saturating_sub(p0.user)), secs(p1.system.saturating_sub(p0.system)))),
        }
    }
}

/// Several runs' CPU use, summed, per request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PerRequest {
    /// Share of the CPU time that was idle.
    pub idle_share: f64,
    /// Busy CPU (all processes and the kernel) per request, µs.
    pub busy_us: f64,
    /// The dispatcher's user time per request, µs.
    pub user_us: Option<f64>,
    /// The dispatcher's system time per request, µs.
    pub system_us: Option<f64>,
}

impl PerRequest {
    /// Sums `runs`; `None` without requests.
    pub fn of(runs: &[CpuUse]) -> Option<PerRequest> {
        let requests: f64 = runs.iter().map(|r| r.requests).sum();
        if requests <= 0.0 {
            return None;
        }
        let sum = |f: &dyn Fn(&CpuUse) -> Duration| runs.iter().map(f).sum::<Duration>().as_secs_f64();
        let busy = sum(&|r| r.busy);
        let idle = sum(&|r| r.idle);
        let with_proc = runs.iter().all(|r| r.dispatcher.is_some());
        let us = |s: f64| s * 1e6 / requests;
        Some(PerRequest {
            idle_share: if busy + idle > 0.0 { idle / (busy + idle) } else { 0.0 },
            busy_us: us(busy),
            user_us: with_proc.then(|| us(sum(&|r| r.dispatcher.map_or(Duration::ZERO, |d| d.0)))),
            system_us: with_proc.then(|| us(sum(&|r| r.dispatcher.map_or(Duration::ZERO, |d| d.1)))),
        })
    }

    /// The request rate these runs would have reached on `cores` CPUs if the dispatcher had
    /// spent no user-space time and no CPU had been idle, everything else per request (the
    /// kernel's networking, the clients, the backends, the dispatcher's system calls) staying
    /// as measured: `cores / (busy - user)` per second. An estimate of the most a dispatcher
    /// with the same kernel work per request could reach on the same machine when the CPUs are
    /// the bottleneck.
    pub fn ceiling(&self, cores: usize) -> Option<f64> {
        let rest = self.busy_us - self.user_us?;
        (rest > 0.0).then(|| cores as f64 * 1e6 / rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_ticks_come_from_the_aggregate_line() {
        let stat = "cpu  100 5 50 800 20 1 24 3 7 0\ncpu0 50 2 25 400 10 0 12 1 0 0\nintr 1 2 3\n";
        let m = MachineTicks::parse(stat).unwrap();
        // guest (7) is already inside user, so it is not added again.
        assert_eq!(m, MachineTicks { total: 100 + 5 + 50 + 800 + 20 + 1 + 24 + 3, idle: 820 });
        assert_eq!(MachineTicks::parse("cpu0 1 2 3 4\n"), None, "no aggregate line");
        assert_eq!(MachineTicks::parse("cpu  1 x 3 4\n"), None);
    }

    #[test]
    fn process_ticks_are_counted_from_the_last_parenthesis() {
        let stat = "4242 (my (odd) proc) S 1 4242 4242 0 -1 4194560 500 0 0 0 731 264 0 0 20 0 3 0";
        assert_eq!(ProcTicks::parse(stat), Some(ProcTicks { user: 731, system: 264 }));
        assert_eq!(ProcTicks::parse("4242 (x) S 1 2"), None, "too short");
        assert_eq!(ProcTicks::parse("no parenthesis"), None);
    }

    #[test]
    fn our_own_process_and_the_machine_can_be_read() {
        let m = MachineTicks::now().expect("/proc/stat");
        assert!(m.total >= m.idle && m.total > 0);
        let me = ProcTicks::of(std::process::id()).expect("/proc/self/stat");
        // Burn some CPU so that user time cannot stay at zero ticks.
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(60) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let later = ProcTicks::of(std::process::id()).unwrap();
        assert!(later.user + later.system > me.user + me.system, "{me:?} then {later:?}");
    }

    #[test]
    fn per_request_figures_and_the_ceiling() {
        let m0 = MachineTicks { total: 1000, idle: 300 };
        // 2 CPUs for 5 s at 100 ticks/s: 1000 ticks, 100 of them idle.
        let m1 = MachineTicks { total: 2000, idle: 400 };
        let p0 = ProcTicks { user: 10, system: 20 };
        let p1 = ProcTicks { user: 60, system: 320 };
        let run = CpuUse::between(m0, m1, Some((p0, p1)), 100_000.0, 100.0);
        assert_eq!(run.busy, Duration::from_secs(9));
        assert_eq!(run.idle, Duration::from_secs(1));
        assert_eq!(run.dispatcher, Some((Duration::from_millis(500), Duration::from_secs(3))));
        let pr = PerRequest::of(&[run, run]).unwrap();
        assert!((pr.idle_share - 0.1).abs() < 1e-12);
        assert!((pr.busy_us - 90.0).abs() < 1e-9, "{pr:?}");
        assert!((pr.user_us.unwrap() - 5.0).abs() < 1e-9);
        assert!((pr.system_us.unwrap() - 30.0).abs() < 1e-9);
        // 2 CPUs / (90 - 5) µs per request.
        assert!((pr.ceiling(2).unwrap() - 2e6 / 85.0).abs() < 1e-6);
    }

    #[test]
    fn without_the_dispatcher_in_every_run_there_is_no_ceiling() {
        let m0 = MachineTicks { total: 0, idle: 0 };
        let m1 = MachineTicks { total: 100, idle: 50 };
        let with = CpuUse::between(m0, m1, Some((ProcTicks::default(), ProcTicks { user: 1, system: 1 })), 10.0, 100.0);
        let without = CpuUse::between(m0, m1, None, 10.0, 100.0);
        let pr = PerRequest::of(&[with, without]).unwrap();
        assert_eq!((pr.user_us, pr.system_us, pr.ceiling(2)), (None, None, None));
        assert_eq!(PerRequest::of(&[]), None);
        assert_eq!(PerRequest::of(&[CpuUse::default()]), None, "no requests");
    }
}
