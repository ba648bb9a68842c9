//! The reachability model, pure: estimates from signals, the reach score, and the per-agent state
//! machine. No I/O; every function takes the clock as an argument, so tests run on virtual time.

mod estimate;
mod log;
mod score;
mod state;
mod trend;
mod view;

pub use estimate::percentile;
pub(crate) use estimate::recent_tau_s;
pub(crate) use estimate::select_percentile;
pub(crate) use estimate::EstimateParams;
pub(crate) use estimate::EstimateSnapshot;
#[cfg(test)]
pub(crate) use estimate::Estimates;
pub(crate) use estimate::Load;
pub(crate) use estimate::Signal;
pub(crate) use log::TransitionLog;
pub(crate) use log::TransitionRecord;
pub(crate) use log::TRANSITIONS_KEPT;
#[cfg(test)]
pub(crate) use score::score;
pub(crate) use score::score_one;
pub(crate) use score::Factors;
pub(crate) use score::Inputs;
pub(crate) use score::Own;
pub(crate) use score::Published;
pub(crate) use score::Theirs;
pub(crate) use score::Weights;
pub(crate) use state::shown;
pub(crate) use state::Event;
pub(crate) use state::QualityMark;
pub use state::State;
pub(crate) use state::StateParams;
pub(crate) use state::Transition;
pub(crate) use state::TRANSITIONS;
pub(crate) use view::ReachView;
pub(crate) use view::ViewSnapshot;
