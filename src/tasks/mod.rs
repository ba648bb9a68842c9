//! Async tasks (`docs/tasks.md`): a `prefer: respond-async` call is stored before it is
//! answered `202`, run through the async fallback chain by a runner that holds a lease on it,
//! and ends done, failed, or escalated to a person — surviving restarts of the sidecar.

pub(crate) mod api;
pub(crate) mod callback;
pub mod deliver;
mod journal;
pub(crate) mod model;
mod queue;
pub(crate) mod runner;
pub(crate) mod store;
pub(crate) mod view;

pub(crate) use journal::{AttemptNote, Chain, Journal};
pub use queue::TASKS_PATH;
pub(crate) use queue::{wants_async, Queue};
