//! `refract bench overload`: [`run`](mod@run) measures (the capacity, then offered load below and past
//! it, the slow-replica and retrying-client scenarios) on the processes of [`rig`], with the
//! options of [`args`]; [`results`] holds what it measured, which [`report`] and [`plot`]
//! turn into `docs/overload.md` and its figures. The outputs read the results and the
//! options, never the runner.

pub mod args;
pub mod plot;
pub mod report;
pub mod results;
pub mod rig;
pub mod run;

pub use args::{OverloadArgs, OverloadOptions};
pub use run::run;
