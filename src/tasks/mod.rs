//! Async tasks (`docs/tasks.md`): a `prefer: respond-async` call is stored before it is
//! answered `202`, run through the async fallback chain by a runner that holds a lease on it,
//! and ends done, failed, or escalated to a person — surviving restarts of the sidecar.

pub mod api;
pub mod callback;
pub mod deliver;
mod journal;
pub mod model;
mod queue;
pub mod runner;
pub mod store;
pub mod view;

pub(crate) use journal::AttemptNote;
pub(crate) use journal::Chain;
pub(crate) use journal::Journal;
pub(crate) use queue::wants_async;
pub(crate) use queue::Queue;
pub use queue::TASKS_PATH;
