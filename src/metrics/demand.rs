//! The fleet's demand per capability (`reach_capability_demand_ratio`,
//! `reach_capability_capacity`), rendered from the last refresh's table.
//!
//! Why not the exporter's gauges: a capability no member serves any longer must lose its series
//! (an autoscaler would otherwise read its last ratio forever), and the exporter cannot forget a
//! series. The table is replaced whole on every refresh, so the series are exactly the
//! capabilities the fleet publishes now.

use std::fmt::Write as _;

use super::peers::{escape, number};

pub(super) const DEMAND_RATIO: &str = "reach_capability_demand_ratio";
pub(super) const CAPACITY: &str = "reach_capability_capacity";

const DEMAND_RATIO_HELP: &str = "The fleet's calls in flight and queued over the concurrency slots in rotation, by capability (the same value from every sidecar; docs/kubernetes.md).";
const CAPACITY_HELP: &str = "Concurrency slots (max_concurrency) of the agents serving each capability that are in rotation, fleet-wide.";

/// What the fleet's view says of one capability, for its gauges.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct CapabilityGauges {
    pub(crate) demand_ratio: f64,
    pub(crate) capacity: u64,
}

/// The last refresh's figures, by capability name.
#[derive(Debug, Default)]
pub(super) struct FleetDemand {
    rows: Vec<(String, CapabilityGauges)>,
}

// === impl FleetDemand ===

impl FleetDemand {
    /// Replaces every row: a capability left out loses its series.
    pub(super) fn set<'a>(&mut self, fleet: impl IntoIterator<Item = (&'a str, CapabilityGauges)>) {
        self.rows = fleet
            .into_iter()
            .map(|(name, gauges)| (name.to_owned(), gauges))
            .collect();
    }

    /// Both families in the Prometheus text format; nothing while no capability is known.
    pub(super) fn render(&self, out: &mut String) {
        if self.rows.is_empty() {
            return;
        }
        let _ = writeln!(out, "# HELP {DEMAND_RATIO} {DEMAND_RATIO_HELP}");
        let _ = writeln!(out, "# TYPE {DEMAND_RATIO} gauge");
        for (name, g) in &self.rows {
            let name = escape(name);
            let ratio = number(g.demand_ratio);
            let _ = writeln!(out, "{DEMAND_RATIO}{{capability=\"{name}\"}} {ratio}");
        }
        out.push('\n');
        let _ = writeln!(out, "# HELP {CAPACITY} {CAPACITY_HELP}");
        let _ = writeln!(out, "# TYPE {CAPACITY} gauge");
        for (name, g) in &self.rows {
            let name = escape(name);
            let _ = writeln!(out, "{CAPACITY}{{capability=\"{name}\"}} {}", g.capacity);
        }
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demand(name: &str, demand_ratio: f64, capacity: u64) -> (&str, CapabilityGauges) {
        let gauges = CapabilityGauges {
            demand_ratio,
            capacity,
        };
        (name, gauges)
    }

    fn rendered(table: &FleetDemand) -> String {
        let mut out = String::new();
        table.render(&mut out);
        out
    }

    #[test]
    fn one_series_per_capability_and_a_gone_capability_loses_its_series() {
        let mut table = FleetDemand::default();
        table.set([demand("review", 0.5, 12), demand("summarize", 0.0, 4)]);
        let text = rendered(&table);
        assert!(text.contains("reach_capability_demand_ratio{capability=\"review\"} 0.5\n"));
        assert!(text.contains("reach_capability_capacity{capability=\"review\"} 12\n"));
        assert!(text.contains("reach_capability_demand_ratio{capability=\"summarize\"} 0\n"));
        assert_eq!(text.matches("# TYPE").count(), 2, "{text}");

        table.set([demand("review", 0.25, 12)]);
        let text = rendered(&table);
        assert!(!text.contains("summarize"), "{text}");
        table.set([]);
        assert_eq!(rendered(&table), "");
    }
}
