//! Zone tiers: candidates in the caller's zone first, then its region, then anywhere
//! (`docs/reach-model.md`). A tier is passed over when none of its candidates can take the call: all out of
//! rotation, already tried, or scoring below the policy's floor.

use crate::peers::Scored;

/// How far a candidate is from the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(in crate::outbound) enum Tier {
    Zone,
    Region,
    Any,
}

impl Tier {
    pub(in crate::outbound) fn of(me: (&str, &str), peer: (&str, &str)) -> Self {
        let ((my_zone, my_region), (zone, region)) = (me, peer);
        if !my_zone.is_empty() && my_zone == zone {
            Tier::Zone
        } else if !my_region.is_empty() && my_region == region {
            Tier::Region
        } else {
            Tier::Any
        }
    }

    pub(in crate::outbound) fn as_str(self) -> &'static str {
        match self {
            Tier::Zone => "zone",
            Tier::Region => "region",
            Tier::Any => "any",
        }
    }
}

/// The candidates outside the nearest tier that can take the call, to be skipped by the pick
/// (together with those already tried). Empty when no tier can: the pick then sees everyone.
pub(in crate::outbound) fn outside_nearest(
    scored: &[Scored],
    tiers: &[Tier],
    tried: &[usize],
    floor: f64,
) -> Vec<usize> {
    let usable = |i: usize| {
        let s = &scored[i];
        let ready = s.excluded.is_none() && s.cap > 0.0 && !s.cooling_down;
        ready && s.factors.score >= floor && !tried.contains(&i)
    };
    let Some(nearest) = (0..scored.len())
        .filter(|i| usable(*i))
        .map(|i| tiers[i])
        .min()
    else {
        return Vec::new();
    };
    (0..scored.len()).filter(|i| tiers[*i] != nearest).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_follow_zone_then_region() {
        assert_eq!(Tier::of(("a", "r1"), ("a", "r1")), Tier::Zone);
        assert_eq!(Tier::of(("a", "r1"), ("b", "r1")), Tier::Region);
        assert_eq!(Tier::of(("a", "r1"), ("c", "r2")), Tier::Any);
        assert_eq!(
            Tier::of(("", ""), ("", "")),
            Tier::Any,
            "no zones declared: one tier"
        );
    }
}
