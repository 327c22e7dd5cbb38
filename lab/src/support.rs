//! Helpers every part of the lab uses: running commands ([`sh`]), the lab's state directory
//! ([`state`]), sizes, rates and durations ([`units`]), Ctrl-C ([`interrupt`]).

pub mod interrupt;
pub mod sh;
pub mod state;
pub mod units;
