//! Overload control: adaptive per-backend concurrency limits, CoDel-managed wait queues with
//! priorities, deadlines, a retry budget, peak-EWMA latency for balancing and per-user token
//! buckets, the latency windows that find slow outliers, and a client's fair share of a
//! backend's slots.

pub mod admission;
pub mod bucket;
pub mod budget;
pub mod ewma;
pub mod limit;
mod share;
#[cfg(test)]
mod sim;
pub mod window;

pub use admission::{Admission, AdmissionConfig, AdmissionView, Arrival, Outcome, Permit, Priority, Refusal};
pub use bucket::UserLimits;
pub use budget::RetryBudget;
pub use ewma::PeakEwma;
pub use limit::{AdaptiveLimit, LimitConfig};
pub use window::LatencyWindow;
