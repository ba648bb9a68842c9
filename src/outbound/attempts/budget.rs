//! Retry pacing: a budget per capability and full-jitter backoff between attempts.
//!
//! Why a budget and not just a maximum per call: when every agent fails at once (a shared model
//! backend rate-limits the fleet), "up to 2 retries" per call triples the load on whatever is
//! left — a retry storm (`docs/reach-model.md`). A budget lets retries add at most a fraction of the
//! recent traffic (plus a small floor, so quiet callers can still retry), as linkerd and Finagle
//! do; tower's `TpsBudget` keeps the books.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower::retry::budget::{Budget, TpsBudget};

use crate::config::RetryPolicy;

/// One budget per capability, rebuilt when the policy's budget changes.
#[derive(Debug, Default)]
pub(in crate::outbound) struct RetryBudgets {
    budgets: Mutex<crate::fast_hash::FastMap<String, (BudgetKey, Arc<TpsBudget>)>>,
}

/// The policy values a budget was built from.
#[derive(Clone, Copy, Debug, PartialEq)]
struct BudgetKey {
    ttl: Duration,
    min_per_second: u32,
    ratio: f32,
}

impl RetryBudgets {
    /// The budget for `capability` under `policy`.
    pub(in crate::outbound) fn get(
        &self,
        capability: &str,
        policy: &RetryPolicy,
    ) -> Arc<TpsBudget> {
        // TpsBudget asserts its ranges; the policy's values are clamped into them.
        let key = BudgetKey {
            ttl: policy
                .budget
                .ttl
                .get()
                .clamp(Duration::from_secs(1), Duration::from_secs(60)),
            min_per_second: policy.budget.min_per_second.min(1_000_000),
            ratio: (policy.budget.ratio as f32).clamp(0.0, 1000.0),
        };
        let mut budgets = self.budgets.lock().unwrap_or_else(|p| p.into_inner());
        match budgets.get(capability) {
            Some((k, budget)) if *k == key => budget.clone(),
            _ => {
                let budget = Arc::new(TpsBudget::new(key.ttl, key.min_per_second, key.ratio));
                budgets.insert(capability.to_owned(), (key, budget.clone()));
                budget
            }
        }
    }
}

/// A call was made: it earns the capability `ratio` of a retry.
pub(in crate::outbound) fn deposit(budget: &TpsBudget) {
    budget.deposit();
}

/// Takes one retry from the budget; false when it is spent.
pub(in crate::outbound) fn withdraw(budget: &TpsBudget) -> bool {
    budget.withdraw()
}

/// Full-jitter exponential backoff before retry number `retry` (1-based): a uniform draw in
/// `0..=min(max, base · 2^(retry−1))`, so callers that failed together do not retry together.
pub(in crate::outbound) fn backoff(
    retry: u32,
    base: Duration,
    max: Duration,
    random: f64,
) -> Duration {
    let ceiling = base
        .saturating_mul(1u32 << retry.saturating_sub(1).min(16))
        .min(max);
    ceiling.mul_f64(random.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HumanDuration;

    fn policy(ratio: f64, min_per_second: u32) -> RetryPolicy {
        let mut p = RetryPolicy::default();
        p.budget.ratio = ratio;
        p.budget.min_per_second = min_per_second;
        p.budget.ttl = HumanDuration::from_secs(10);
        p
    }

    #[tokio::test(start_paused = true)]
    async fn retries_are_a_fraction_of_recent_calls() {
        let budgets = RetryBudgets::default();
        let b = budgets.get("c", &policy(0.2, 0));
        for _ in 0..10 {
            deposit(&b);
        }
        assert!(withdraw(&b) && withdraw(&b), "20% of 10 calls is 2 retries");
        assert!(!withdraw(&b), "a third retry would exceed the budget");
    }

    #[tokio::test(start_paused = true)]
    async fn the_floor_refills_with_time_and_old_calls_expire() {
        let budgets = RetryBudgets::default();
        let b = budgets.get("c", &policy(0.0, 1));
        let mut granted = 0;
        while withdraw(&b) {
            granted += 1;
        }
        assert_eq!(granted, 10, "1/s over a 10 s window");
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(withdraw(&b), "the floor is back once the window has passed");
    }

    #[test]
    fn a_changed_policy_builds_a_new_budget() {
        let budgets = RetryBudgets::default();
        let a = budgets.get("c", &policy(0.2, 10));
        assert!(Arc::ptr_eq(&a, &budgets.get("c", &policy(0.2, 10))));
        assert!(!Arc::ptr_eq(&a, &budgets.get("c", &policy(0.5, 10))));
    }

    #[test]
    fn backoff_is_jittered_under_an_exponential_ceiling() {
        let (base, max) = (Duration::from_millis(25), Duration::from_secs(1));
        assert_eq!(backoff(1, base, max, 1.0), Duration::from_millis(25));
        assert_eq!(backoff(3, base, max, 1.0), Duration::from_millis(100));
        assert_eq!(backoff(10, base, max, 1.0), max);
        assert_eq!(backoff(3, base, max, 0.5), Duration::from_millis(50));
        assert_eq!(backoff(3, base, max, 0.0), Duration::ZERO);
    }
}
