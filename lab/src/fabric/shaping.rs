//! Link shaping: the tbf parameters that make a veth behave like a NIC of a given rate.
//!
//! Measured on the lab (two hosts, tbf on both ends, one TCP flow, 1500-byte MTU, veth with
//! GSO): at 1gbit a burst of 16 KiB gives 0.86 Gbit/s of goodput, 32 KiB 0.92, 64 KiB 0.90–0.95
//! (noisy), 128 KiB and more a steady 0.956, which is line rate (1448 payload bytes per
//! 1514-byte frame). A burst below one GSO super-packet (64 KiB) makes tbf split or stall
//! them. So: burst = 1 ms worth of the rate, at least 128 KiB; queue limit = burst + 5 ms worth
//! of the rate (a NIC-like queue that keeps TCP busy without bufferbloat).

use crate::support::units::Rate;

/// Minimum tbf bucket: two GSO super-packets.
const MIN_BURST: u64 = 128 * 1024;
/// Queueing allowed beyond the bucket, in microseconds of the rate.
const QUEUE_US: u64 = 5_000;
/// The bucket, in microseconds of the rate.
const BURST_US: u64 = 1_000;

/// tbf parameters in tc's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tbf {
    /// Bits per second.
    pub rate_bps: u64,
    /// Bucket size in bytes.
    pub burst: u64,
    /// Queue size in bytes.
    pub limit: u64,
}

impl Tbf {
    /// The parameters for a rate, or `None` for an unshaped link.
    pub fn for_rate(rate: Rate) -> Option<Tbf> {
        let Rate::BitsPerSec(rate_bps) = rate else {
            return None;
        };
        let bytes_per_us = |us: u64| rate_bps / 8 * us / 1_000_000;
        let burst = bytes_per_us(BURST_US).max(MIN_BURST);
        let limit = burst + bytes_per_us(QUEUE_US);
        Some(Tbf { rate_bps, burst, limit })
    }

    /// The arguments after `tc qdisc replace dev IF root`.
    pub fn tc_args(&self) -> Vec<String> {
        vec![
            "tbf".into(),
            "rate".into(),
            format!("{}bit", self.rate_bps),
            "burst".into(),
            self.burst.to_string(),
            "limit".into(),
            self.limit.to_string(),
        ]
    }

    /// One line for the report.
    pub fn describe(&self) -> String {
        format!(
            "tbf rate {} burst {} B limit {} B on both ends of every link",
            Rate::BitsPerSec(self.rate_bps),
            self.burst,
            self.limit
        )
    }
}

/// How the links are shaped, for the report.
pub fn describe(rate: Rate) -> String {
    match Tbf::for_rate(rate) {
        Some(t) => t.describe(),
        None => "no qdisc (unshaped veth)".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_gigabit() {
        let t = Tbf::for_rate(Rate::BitsPerSec(1_000_000_000)).expect("shaped");
        assert_eq!(t.burst, 131_072);
        assert_eq!(t.limit, 131_072 + 625_000);
        assert_eq!(t.tc_args().join(" "), "tbf rate 1000000000bit burst 131072 limit 756072");
    }

    #[test]
    fn fast_and_none() {
        let t = Tbf::for_rate(Rate::BitsPerSec(10_000_000_000)).expect("shaped");
        assert_eq!(t.burst, 1_250_000);
        assert_eq!(Tbf::for_rate(Rate::Unlimited), None);
        assert!(describe(Rate::Unlimited).contains("no qdisc"));
    }
}
