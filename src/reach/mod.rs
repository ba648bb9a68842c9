//! The reachability model, pure: estimates from signals, the reach score, and the per-agent state
//! machine. No I/O; every function takes the clock as an argument, so tests run on virtual time.

mod estimate;
mod log;
mod score;
mod state;
mod trend;
mod view;

pub use estimate::{
    percentile, recent_tau_s, select_percentile, EstimateParams, EstimateSnapshot, Estimates, Load,
    Signal, UNKNOWN_AVAILABILITY,
};
pub use log::{TransitionLog, TransitionRecord, TRANSITIONS_KEPT};
pub use score::{
    capability_match, cost, score, score_one, Factors, Inputs, Own, Published, Scoring, Theirs,
    Weights,
};
pub use state::{
    shown, Event, QualityMark, State, StateMachine, StateParams, Transition, TRANSITIONS,
};
pub use view::{ReachView, ViewSnapshot};
