//! Overload control: adaptive per-backend concurrency limits, CoDel-managed wait queues with
//! priorities, deadlines, a retry budget, peak-EWMA latency for balancing and per-user token
//! buckets, the latency windows that find slow outliers, a client's fair share of a backend's
//! slots, and the memory spilled for clients that stopped reading.

pub mod admission;
pub mod bucket;
pub mod budget;
pub mod ewma;
pub mod limit;
mod share;
#[cfg(test)]
mod sim;
pub mod spill;
pub mod window;

pub use admission::{Admission, AdmissionConfig, AdmissionView, Arrival, Outcome, Permit, Priority, Refusal};
pub use bucket::UserLimits;
pub use budget::RetryBudget;
pub use ewma::PeakEwma;
pub use limit::{AdaptiveLimit, LimitConfig};
pub use spill::{Spill, SpillBudget};
pub use window::LatencyWindow;
