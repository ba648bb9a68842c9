//! **equal-pair**: two identical agents (4–6 ms, seeded), *one* caller making one
//! call at a time for 60 s; half way, exactly one call (whichever agent gets it) takes 17 ms:
//! both agents are slow until one business call reaches either, then normal again. Agent A's
//! lowest and highest share over each 10 s window, before the slow call and after it (goal:
//! 35–65 % in every window).

use std::time::{Duration, Instant};

use crate::scenario::Scenario;
use crate::scenario::{PAIR_LATENCY, PAIR_SLOW};
use crate::support::measures::{range, share, Observed};
use crate::support::Slot;
use crate::Mode;

/// Agent A's share is read over each window of this length.
const PAIR_WINDOW: Duration = Duration::from_secs(10);

pub(crate) struct Measures {
    /// Agent A's lowest and highest share over each window, before the slow sample and after it.
    before: Option<(f64, f64)>,
    after: Option<(f64, f64)>,
}

/// Exactly one slow call. Both agents take `PAIR_SLOW` for the next business call to reach
/// either (the one caller makes one call at a time), then are normal again.
pub(crate) async fn slow_sample(slots: &[Slot]) {
    let total = || slots.iter().map(Slot::reached).sum::<u64>();
    let set = |mode: Mode| {
        for agent in slots.iter().filter_map(|s| s.agent.as_ref()) {
            agent.set_mode(mode);
        }
    };
    let before = total();
    set(Mode::Slow);
    let deadline = Instant::now() + Duration::from_secs(2);
    while total() == before && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // The call has read its mode by now; the next cannot start before it ends.
    tokio::time::sleep(Duration::from_millis(5)).await;
    set(Mode::Normal);
}

pub(crate) fn measure(o: &Observed) -> Measures {
    let windows = |from: Duration, to: Duration| {
        let count =
            ((to.saturating_sub(from)).as_secs_f64() / PAIR_WINDOW.as_secs_f64()).round() as u32;
        range((0..count).filter_map(move |k| {
            let start = from + PAIR_WINDOW * k;
            share(o.samples, 0, start, start + PAIR_WINDOW)
        }))
    };
    Measures {
        before: windows(Duration::ZERO, o.fault_at),
        after: windows(o.fault_at, o.end()),
    }
}

/// The equal-pair table, if it ran.
pub(crate) fn print(rows: &[(Scenario, &str, &Measures)]) {
    if rows.is_empty() {
        return;
    }
    let span = |r: Option<(f64, f64)>| {
        r.map_or("-".to_owned(), |(lo, hi)| {
            format!("{:.0}–{:.0}%", 100.0 * lo, 100.0 * hi)
        })
    };
    println!(
        "\nequal-pair: two agents at {}–{} ms, one caller, one call at a time; one call of {} ms half way",
        PAIR_LATENCY.min.as_millis(),
        PAIR_LATENCY.max.as_millis(),
        PAIR_SLOW.as_millis()
    );
    println!(
        "{:<18} {:<12} {:>14} {:>14}",
        "scenario", "router", "A before", "A after"
    );
    for (scenario, router, m) in rows {
        println!(
            "{:<18} {:<12} {:>14} {:>14}",
            scenario.name(),
            router,
            span(m.before),
            span(m.after)
        );
    }
    println!(
        "agent A's lowest–highest share over each {} s window, before and after the slow call (goal: \
         35–65 % in every window).",
        PAIR_WINDOW.as_secs()
    );
}
