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

pub use journal::{AttemptNote, Chain, Journal};
pub use queue::{wants_async, Queue, Submitted, CALLBACK, PREFER, PRIORITY, TASKS_PATH};
