//! Overload control: adaptive per-backend concurrency limits, CoDel-managed wait queues with
//! priorities, deadlines, a retry budget and peak-EWMA latency for balancing.

pub mod admission;
pub mod budget;
pub mod ewma;
pub mod limit;

pub use admission::{Admission, AdmissionConfig, Outcome, Permit, Priority, Refusal};
pub use budget::RetryBudget;
pub use ewma::PeakEwma;
pub use limit::{AdaptiveLimit, LimitConfig};
