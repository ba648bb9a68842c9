//! The reachability model, pure: estimates from signals, the reach score, and the per-agent state
//! machine. No I/O; every function takes the clock as an argument, so tests run on virtual time.

mod estimate;
mod log;
mod score;
mod state;
mod trend;
mod view;

pub use estimate::percentile;
#[cfg(test)]
pub(crate) use estimate::Estimates;
pub(crate) use estimate::{recent_tau_s, select_percentile, EstimateParams, EstimateSnapshot};
pub(crate) use estimate::{Load, Signal};
pub(crate) use log::{TransitionLog, TransitionRecord, TRANSITIONS_KEPT};
#[cfg(test)]
pub(crate) use score::score;
pub(crate) use score::{score_one, Factors, Inputs, Own, Published, Theirs, Weights};
pub use state::State;
pub(crate) use state::{shown, Event, QualityMark, StateParams, Transition, TRANSITIONS};
pub(crate) use view::{ReachView, ViewSnapshot};
