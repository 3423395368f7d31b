//! Credit grants, the pure part: which credit a debit draws from. Every credit is a grant;
//! a debit takes from the active grants in draw order (lower priority first, then the
//! soonest expiry, then the oldest) and what no grant covers is overdraft, which the next
//! credit pays first. The balance is always the remaining grants less the overdraft.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::domain::Microcents;

/// A grant as the planner sees it (an active one: something remains, not expired).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub id: String,
    pub remaining: Microcents,
    pub priority: i32,
    pub expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

impl Grant {
    /// The draw order's key: priority, then soonest expiry (none last), then oldest, then id
    /// (by byte). PostgreSQL's debit function checks the same order (`sql/postgres.rs`,
    /// `DEBIT_FUNCTION_TEXT`): a change here is a change there.
    fn order_key(&self) -> (i32, bool, Option<DateTime<Utc>>, DateTime<Utc>, &str) {
        (
            self.priority,
            self.expires_at.is_none(),
            self.expires_at,
            self.created_at,
            self.id.as_str(),
        )
    }
}

/// What one operation took from, or gave to, a grant (signed: a debit's draws are negative).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Draw {
    #[serde(rename = "grantId")]
    pub grant_id: String,
    pub microcents: Microcents,
}

/// An organization's active grants in draw order, and its overdraft.
#[derive(Debug, Clone, Default)]
pub struct Book {
    grants: Vec<Grant>,
    overdraft: Microcents,
}

impl Book {
    /// The book of `grants` (any order) for an account at `balance`: the overdraft is what
    /// the balance lacks of the grants' sum (never negative).
    pub fn new(mut grants: Vec<Grant>, balance: Microcents) -> Self {
        grants.retain(|g| g.remaining > Microcents::ZERO);
        grants.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
        let held: Microcents = grants.iter().fold(Microcents::ZERO, |sum, g| sum + g.remaining);
        let overdraft = if held > balance {
            held + -balance
        } else {
            Microcents::ZERO
        };
        Self { grants, overdraft }
    }

    pub fn grants(&self) -> &[Grant] {
        &self.grants
    }

    pub fn overdraft(&self) -> Microcents {
        self.overdraft
    }

    /// The remaining grants less the overdraft.
    pub fn balance(&self) -> Microcents {
        self.grants
            .iter()
            .fold(Microcents::ZERO, |sum, g| sum + g.remaining)
            + -self.overdraft
    }

    /// A new grant of `grant.remaining` (its full amount): the overdraft is paid from it
    /// first. Answers what the grant keeps.
    pub fn credit(&mut self, mut grant: Grant) -> Microcents {
        let paid = std::cmp::min(self.overdraft, grant.remaining);
        self.overdraft = self.overdraft + -paid;
        grant.remaining = grant.remaining + -paid;
        let kept = grant.remaining;
        if kept > Microcents::ZERO {
            let at = self
                .grants
                .partition_point(|g| g.order_key() <= grant.order_key());
            self.grants.insert(at, grant);
        }
        kept
    }

    /// Takes `amount` (positive) from the grants in draw order; what they lack becomes
    /// overdraft. Answers the draws (negative amounts), in order.
    pub fn debit(&mut self, amount: Microcents) -> Vec<Draw> {
        let mut left = amount;
        let mut draws = Vec::new();
        while left > Microcents::ZERO {
            let Some(first) = self.grants.first_mut() else {
                break;
            };
            let take = std::cmp::min(first.remaining, left);
            first.remaining = first.remaining + -take;
            left = left + -take;
            draws.push(Draw {
                grant_id: first.id.clone(),
                microcents: -take,
            });
            if first.remaining == Microcents::ZERO {
                self.grants.remove(0);
            }
        }
        self.overdraft = self.overdraft + left;
        draws
    }

    /// Ends a grant: answers what remained of it (none when it is not active).
    pub fn expire(&mut self, grant_id: &str) -> Microcents {
        match self.grants.iter().position(|g| g.id == grant_id) {
            Some(i) => self.grants.remove(i).remaining,
            None => Microcents::ZERO,
        }
    }

    /// The remaining amount of an active grant.
    pub fn remaining(&self, grant_id: &str) -> Option<Microcents> {
        self.grants.iter().find(|g| g.id == grant_id).map(|g| g.remaining)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn grant(id: usize, remaining: i64, priority: i32, expires_in_days: Option<i64>) -> Grant {
        let epoch = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        Grant {
            id: format!("g{id:03}"),
            remaining: Microcents(remaining),
            priority,
            expires_at: expires_in_days.map(|d| epoch + chrono::Duration::days(d)),
            created_at: epoch + chrono::Duration::seconds(id as i64),
        }
    }

    #[test]
    fn a_debit_spanning_three_grants_draws_in_order() {
        let mut book = Book::new(
            vec![
                grant(1, 500, 50, None),     // paid, never expires: last
                grant(2, 300, 10, Some(30)), // promotional, expires later
                grant(3, 200, 10, Some(5)),  // promotional, expires first
            ],
            Microcents(1000),
        );
        let draws = book.debit(Microcents(700));
        let got: Vec<(&str, i64)> = draws
            .iter()
            .map(|d| (d.grant_id.as_str(), d.microcents.get()))
            .collect();
        assert_eq!(got, [("g003", -200), ("g002", -300), ("g001", -200)]);
        assert_eq!(book.balance(), Microcents(300));
        assert_eq!(book.overdraft(), Microcents::ZERO);
    }

    #[test]
    fn past_every_grant_is_overdraft_and_the_next_credit_pays_it_first() {
        let mut book = Book::new(vec![grant(1, 100, 50, None)], Microcents(100));
        book.debit(Microcents(250));
        assert_eq!(
            (book.balance(), book.overdraft()),
            (Microcents(-150), Microcents(150))
        );
        assert!(book.grants().is_empty());
        assert_eq!(book.credit(grant(2, 100, 50, None)), Microcents::ZERO);
        assert_eq!(book.overdraft(), Microcents(50));
        assert_eq!(book.credit(grant(3, 500, 10, Some(3))), Microcents(450));
        assert_eq!(
            (book.balance(), book.overdraft()),
            (Microcents(450), Microcents::ZERO)
        );
    }

    #[test]
    fn a_negative_balance_without_grants_is_overdraft() {
        let book = Book::new(Vec::new(), Microcents(-42));
        assert_eq!(
            (book.balance(), book.overdraft()),
            (Microcents(-42), Microcents(42))
        );
    }

    #[derive(Debug, Clone)]
    enum Step {
        Credit {
            amount: i64,
            priority: i32,
            expires_in_days: Option<i64>,
        },
        Debit(i64),
        Expire(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (
                1_i64..5_000,
                prop_oneof![Just(10), Just(50)],
                proptest::option::of(0_i64..60)
            )
                .prop_map(|(amount, priority, expires_in_days)| Step::Credit {
                    amount,
                    priority,
                    expires_in_days
                }),
            (1_i64..8_000).prop_map(Step::Debit),
            (0_usize..40).prop_map(Step::Expire),
        ]
    }

    proptest! {
        /// For any sequence of credits, debits and expiries: the remaining grants less the
        /// overdraft is the balance; no grant goes below zero; there is overdraft only when no
        /// grant remains; and every debit drew in the order rule's order.
        #[test]
        fn the_grants_less_the_overdraft_are_the_balance(steps in proptest::collection::vec(step(), 0..60)) {
            let mut book = Book::new(Vec::new(), Microcents::ZERO);
            let mut balance = Microcents::ZERO;
            let mut made = 0;
            for step in steps {
                match step {
                    Step::Credit { amount, priority, expires_in_days } => {
                        made += 1;
                        book.credit(grant(made, amount, priority, expires_in_days));
                        balance = balance + Microcents(amount);
                    }
                    Step::Debit(amount) => {
                        let before: Vec<Grant> = book.grants().to_vec();
                        let draws = book.debit(Microcents(amount));
                        balance = balance + Microcents(-amount);
                        // The draws are a prefix of the order, each but the last emptying its grant.
                        for (i, draw) in draws.iter().enumerate() {
                            prop_assert_eq!(&draw.grant_id, &before[i].id);
                            if i + 1 < draws.len() {
                                prop_assert_eq!(-draw.microcents, before[i].remaining);
                            }
                        }
                    }
                    Step::Expire(i) => {
                        let id = format!("g{i:03}");
                        let gone = book.expire(&id);
                        balance = balance + -gone;
                    }
                }
                prop_assert_eq!(book.balance(), balance);
                prop_assert!(book.grants().iter().all(|g| g.remaining > Microcents::ZERO));
                prop_assert!(book.overdraft() >= Microcents::ZERO);
                prop_assert!(book.overdraft() == Microcents::ZERO || book.grants().is_empty());
                let keys: Vec<_> = book.grants().iter().map(Grant::order_key).collect();
                prop_assert!(keys.windows(2).all(|w| w[0] <= w[1]));
            }
        }
    }
}
