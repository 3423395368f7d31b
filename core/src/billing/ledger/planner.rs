//! The pure part of the ledger: decides each operation of one organization's batch, in
//! order, against its locked account, and gathers the rows to write. No I/O.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use entities::billing_account;
use serde::Serialize;

use super::grants::{Book, Draw, Grant};
use super::ops::{
    AccountAfter, AutoTopup, BatchResult, LedgerError, LedgerOp, LedgerPolicy, OnDuplicate, Outcome,
    ServingUsageRow, SettledPayment, SideEffect, MAX_AUTO_TOPUP_DECLINES,
};
use crate::domain::{Cents, EntryKind, GrantKind, Microcents, OrgId};

/// How a group finds the idempotency keys it repeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KeyCheck {
    /// Look every key up before planning.
    LookUp,
    /// Plan as if every key were new and let the unique index say otherwise: the entries
    /// are inserted with `ON CONFLICT DO NOTHING`, and if one was skipped the whole
    /// transaction is dropped and the group planned again with `LookUp` (PostgreSQL).
    Optimistic,
}

/// Keys already applied, per (organization, idempotency key), with their signed amounts.
pub(super) type Applied = HashMap<(OrgId, String), Microcents>;

/// A ledger entry to insert (its JSON is the row).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(super) struct EntryRow {
    pub org_id: OrgId,
    pub kind: &'static str,
    pub amount: Microcents,
    pub balance_after: Microcents,
    pub idempotency_key: Option<String>,
    pub reason: String,
    /// The grants the entry changed, `[{grantId, microcents}]` (JSON text; none: none).
    pub grants: Option<String>,
}

/// A grant a credit makes (its JSON is the row).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(super) struct GrantRow {
    pub id: String,
    pub org_id: OrgId,
    pub kind: &'static str,
    pub original: Microcents,
    /// What is left once the batch is applied.
    pub remaining: Microcents,
    pub priority: i32,
    pub expires_at: Option<DateTime<Utc>>,
    pub reason: String,
    pub created_by: Option<String>,
    pub idempotency_key: Option<String>,
    pub request_hash: Option<String>,
}

/// An existing grant as the batch leaves it (its JSON is the row of the update).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(super) struct GrantChange {
    pub id: String,
    pub remaining: Microcents,
    /// The expiry sweep ended it.
    pub expired: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PromoRow {
    pub org_id: OrgId,
    pub code: String,
    pub amount: Cents,
}

/// An account's planned balance and starter-credit flag after its batch (a JSON row of
/// the balance update).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(super) struct BalanceRow {
    pub org_id: OrgId,
    pub balance: Microcents,
    pub starter: bool,
}

impl BalanceRow {
    /// `account` as this row leaves it.
    pub fn account_after(
        &self,
        account: &billing_account::Model,
        now: DateTime<Utc>,
    ) -> billing_account::Model {
        billing_account::Model {
            balance_microcents: self.balance,
            starter_credit_granted: self.starter,
            updated_at: now,
            ..account.clone()
        }
    }
}

/// Rows a group writes, gathered while planning.
#[derive(Debug)]
pub(super) struct Writes {
    /// How this attempt checks idempotency keys.
    pub check: KeyCheck,
    pub entries: Vec<EntryRow>,
    pub usage_rows: Vec<ServingUsageRow>,
    seen_requests: HashSet<String>,
    pub promo_rows: Vec<PromoRow>,
    pub balances: Vec<BalanceRow>,
    pub settled_auto_topups: Vec<OrgId>,
    pub settled_payments: Vec<SettledPayment>,
    /// An optimistic plan refused a keyed operation: its outcome needs the key looked up.
    pub keys_unchecked: bool,
    /// What the batch announces to webhook endpoints (written by the same transaction).
    pub events: Vec<LedgerEvent>,
    /// Grants the batch's credits make, and existing grants it changed.
    pub new_grants: Vec<GrantRow>,
    pub grant_changes: Vec<GrantChange>,
    /// Each organization's active grants once the batch is applied (the account cache's).
    pub grants_after: Vec<(OrgId, Vec<Grant>)>,
    /// Default priorities, and the balance under which `billing.balance.low` fires for an
    /// organization without an auto top-up threshold (none: never).
    policy: Option<LedgerPolicy>,
}

/// A webhook event a planned batch announces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum LedgerEvent {
    /// A top-up or auto top-up was credited (its entry is found by its key once written).
    Credited {
        org_id: OrgId,
        kind: crate::domain::EntryKind,
        idempotency_key: String,
    },
    /// What was left of a grant expired.
    CreditExpired {
        org_id: OrgId,
        grant_id: String,
        microcents: Microcents,
    },
    /// The balance fell from at or above the threshold to under it.
    BalanceLow {
        org_id: OrgId,
        balance: Microcents,
        threshold: Cents,
    },
}

impl Writes {
    pub fn new(check: KeyCheck) -> Self {
        Self {
            check,
            entries: Vec::new(),
            usage_rows: Vec::new(),
            seen_requests: HashSet::new(),
            promo_rows: Vec::new(),
            balances: Vec::new(),
            settled_auto_topups: Vec::new(),
            settled_payments: Vec::new(),
            keys_unchecked: false,
            events: Vec::new(),
            new_grants: Vec::new(),
            grant_changes: Vec::new(),
            grants_after: Vec::new(),
            policy: None,
        }
    }

    /// Plans with `policy`: its grant priorities and its low-balance threshold.
    pub fn policy(mut self, policy: LedgerPolicy) -> Self {
        self.policy = Some(policy);
        self
    }
}

fn draws_json(draws: &[Draw]) -> Option<String> {
    (!draws.is_empty()).then(|| serde_json::to_string(draws).unwrap_or_default())
}

/// Decides every operation of one organization, in order, against its locked account.
/// `applied` and `usage` are what is already recorded; both learn this batch's writes.
#[allow(clippy::too_many_arguments)]
pub(super) fn plan(
    org_id: &OrgId,
    account: &billing_account::Model,
    grants: &[Grant],
    ops: &[LedgerOp],
    applied: &mut Applied,
    usage: &mut HashMap<String, ServingUsageRow>,
    writes: &mut Writes,
    now: DateTime<Utc>,
) -> BatchResult {
    let mut balance = account.balance_microcents;
    let mut book = Book::new(grants.to_vec(), balance);
    let before: HashMap<&str, Microcents> = grants.iter().map(|g| (g.id.as_str(), g.remaining)).collect();
    let mut made: Vec<usize> = Vec::new();
    let mut expired: HashSet<String> = HashSet::new();
    let policy = writes.policy.unwrap_or_default();
    // The organization's auto top-up threshold when it has one, else the configured one.
    let low_threshold = match (account.auto_topup_enabled, account.auto_topup_threshold_cents) {
        (true, Some(threshold)) => Some(threshold),
        _ => writes.policy.map(|p| p.low_balance),
    };
    let mut starter_granted = account.starter_credit_granted;
    let mut changed = false;
    // A grant past its expiry is neither drawn nor counted: before the batch's operations,
    // each lapsed grant ends as the sweep would end it (the same keyed `expiry` entry, so
    // whichever comes first writes it, once). Their outcomes are nobody's.
    let lapsed: Vec<LedgerOp> = book
        .grants()
        .iter()
        .filter(|g| g.expires_at.is_some_and(|at| at <= now))
        .map(|g| LedgerOp::expiry(&g.id))
        .collect();
    let mut expired_amounts = Vec::new();
    let mut outcomes = Vec::with_capacity(lapsed.len() + ops.len());
    for op in lapsed.iter().chain(ops) {
        // A serving request already metered (globally, by request id) is a replay.
        if let SideEffect::ServingUsage(row) = &op.side {
            if let Some(original) = usage.get(&row.request_id) {
                outcomes.push(Ok(Outcome {
                    amount: -original.charged_microcents,
                    balance,
                    replayed: true,
                    serving: Some(original.clone()),
                }));
                continue;
            }
        }
        let key = op
            .idempotency_key
            .as_ref()
            .map(|k| (org_id.to_owned(), k.clone()));
        if let Some(original) = key.as_ref().and_then(|k| applied.get(k)) {
            outcomes.push(match op.on_duplicate {
                OnDuplicate::Replay => Ok(Outcome {
                    amount: *original,
                    balance,
                    replayed: true,
                    serving: None,
                }),
                OnDuplicate::Conflict => Err(LedgerError::Duplicate),
            });
            continue;
        }
        let amount = match &op.side {
            SideEffect::Expire { grant_id } => -book.remaining(grant_id).unwrap_or(Microcents::ZERO),
            _ => op.amount,
        };
        if let SideEffect::Expire { grant_id } = &op.side {
            expired.insert(grant_id.clone());
            if amount == Microcents::ZERO {
                // Nothing left of it (or not active): ended without an entry.
                book.expire(grant_id);
                outcomes.push(Ok(Outcome {
                    amount,
                    balance,
                    replayed: false,
                    serving: None,
                }));
                continue;
            }
        }
        let after = balance + amount;
        let refusal = if matches!(op.side, SideEffect::StarterCredit) && starter_granted {
            Some(LedgerError::Duplicate)
        } else if amount < Microcents::ZERO
            && !op.may_overdraw
            && !matches!(op.side, SideEffect::Expire { .. })
            && after < Microcents::ZERO
        {
            Some(LedgerError::InsufficientFunds {
                balance,
                needed: -amount,
            })
        } else {
            None
        };
        if let Some(refusal) = refusal {
            if key.is_some() && writes.check == KeyCheck::Optimistic {
                // A refusal writes no entry, so the unique index cannot tell whether this was
                // a replay (answered as such whatever the balance): look the keys up.
                writes.keys_unchecked = true;
            }
            outcomes.push(Err(refusal));
            continue;
        }
        if let Some(threshold) = low_threshold {
            if balance >= threshold.micros() && after < threshold.micros() {
                writes.events.push(LedgerEvent::BalanceLow {
                    org_id: org_id.to_owned(),
                    balance: after,
                    threshold,
                });
            }
        }
        if let (EntryKind::Topup | EntryKind::AutoTopup, Some(key)) = (op.kind, &op.idempotency_key) {
            if amount > Microcents::ZERO {
                writes.events.push(LedgerEvent::Credited {
                    org_id: org_id.to_owned(),
                    kind: op.kind,
                    idempotency_key: key.clone(),
                });
            }
        }
        balance = after;
        changed = true;
        // What the entry does to the grants: a credit makes one (paying any overdraft first),
        // a debit draws in order, an expiry ends its grant.
        let draws = if let SideEffect::Expire { grant_id } = &op.side {
            book.expire(grant_id);
            expired_amounts.push(-amount);
            writes.events.push(LedgerEvent::CreditExpired {
                org_id: org_id.to_owned(),
                grant_id: grant_id.clone(),
                microcents: -amount,
            });
            vec![Draw {
                grant_id: grant_id.clone(),
                microcents: amount,
            }]
        } else if amount > Microcents::ZERO {
            let terms = op.grant.as_deref().cloned().unwrap_or_default();
            let kind = terms.kind.unwrap_or_else(|| GrantKind::of_entry(op.kind));
            let id = uuid::Uuid::new_v4().to_string();
            let priority = terms.priority.unwrap_or_else(|| policy.priority(kind));
            let kept = book.credit(Grant {
                id: id.clone(),
                remaining: amount,
                priority,
                expires_at: terms.expires_at,
                created_at: now,
            });
            made.push(writes.new_grants.len());
            writes.new_grants.push(GrantRow {
                id: id.clone(),
                org_id: org_id.to_owned(),
                kind: kind.as_str(),
                original: amount,
                remaining: kept,
                priority,
                expires_at: terms.expires_at,
                reason: op.reason.clone(),
                created_by: terms.created_by,
                idempotency_key: terms.idempotency_key,
                request_hash: terms.request_hash,
            });
            vec![Draw {
                grant_id: id,
                microcents: kept,
            }]
        } else {
            book.debit(-amount)
        };
        writes.entries.push(EntryRow {
            org_id: org_id.to_owned(),
            kind: op.kind.as_str(),
            amount,
            balance_after: balance,
            idempotency_key: op.idempotency_key.clone(),
            reason: op.reason.clone(),
            grants: draws_json(&draws),
        });
        if let Some(key) = key {
            applied.insert(key, amount);
        }
        if let Some(payment) = &op.payment {
            writes.settled_payments.push((**payment).clone());
        }
        let mut serving = None;
        match &op.side {
            SideEffect::None | SideEffect::Expire { .. } => {}
            SideEffect::ServingUsage(row) => {
                if writes.seen_requests.insert(row.request_id.clone()) {
                    writes.usage_rows.push(row.clone());
                }
                usage.insert(row.request_id.clone(), row.clone());
                serving = Some(row.clone());
            }
            SideEffect::PromoGrant { code, cents } => writes.promo_rows.push(PromoRow {
                org_id: org_id.to_owned(),
                code: code.clone(),
                amount: *cents,
            }),
            SideEffect::StarterCredit => starter_granted = true,
            SideEffect::AutoTopupCredited => writes.settled_auto_topups.push(org_id.to_owned()),
        }
        outcomes.push(Ok(Outcome {
            amount,
            balance,
            replayed: false,
            serving,
        }));
    }
    // The grants as the batch leaves them: new ones with what they kept, changed ones.
    for i in made {
        let row = &mut writes.new_grants[i];
        row.remaining = book.remaining(&row.id).unwrap_or(Microcents::ZERO);
    }
    for grant in grants {
        let now_left = book.remaining(&grant.id).unwrap_or(Microcents::ZERO);
        let ended = expired.contains(&grant.id);
        if before.get(grant.id.as_str()) != Some(&now_left) || ended {
            writes.grant_changes.push(GrantChange {
                id: grant.id.clone(),
                remaining: now_left,
                expired: ended,
            });
        }
    }
    for id in &expired {
        // An expiry of a grant that was not active (spent already): still marked ended.
        if !before.contains_key(id.as_str()) {
            writes.grant_changes.push(GrantChange {
                id: id.clone(),
                remaining: Microcents::ZERO,
                expired: true,
            });
        }
    }
    writes
        .grants_after
        .push((org_id.to_owned(), book.grants().to_vec()));
    if changed {
        writes.balances.push(BalanceRow {
            org_id: org_id.to_owned(),
            balance,
            starter: starter_granted,
        });
    }
    let auto_topup = match (
        account.auto_topup_enabled,
        account.auto_topup_threshold_cents,
        account.auto_topup_amount_cents,
        &account.payment_method_id,
    ) {
        (true, Some(threshold), Some(amount), Some(_))
            if account.auto_topup_declines < MAX_AUTO_TOPUP_DECLINES =>
        {
            Some(AutoTopup { threshold, amount })
        }
        _ => None,
    };
    outcomes.drain(..lapsed.len());
    BatchResult {
        outcomes,
        account: Some(AccountAfter {
            balance,
            auto_topup,
            expired: expired_amounts,
        }),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::billing::ledger::EntryKind;
    use crate::domain::{IdempotencyKey, RunId};

    const ORG: &str = "org-1";

    fn org() -> OrgId {
        OrgId::parse(ORG).unwrap()
    }

    fn account(balance: i64) -> billing_account::Model {
        let now = Utc::now();
        billing_account::Model {
            org_id: org(),
            customer_id: None,
            balance_microcents: Microcents(balance),
            payment_method_id: None,
            pm_brand: None,
            pm_last4: None,
            pm_exp_month: None,
            pm_exp_year: None,
            auto_topup_enabled: false,
            auto_topup_threshold_cents: None,
            auto_topup_amount_cents: None,
            auto_topup_declines: 0,
            auto_topup_started_at: None,
            starter_credit_granted: false,
            auto_topup_monthly_limit_cents: None,
            auto_topup_limit_notified_month: None,
            created_at: now,
            updated_at: now,
        }
    }

    /// Operations as the routes build them: credits, fees (no overdraw), serving charges
    /// (overdraw, with a usage row), a starter credit, keyed from a small pool so keys and
    /// request ids repeat.
    fn op() -> impl Strategy<Value = LedgerOp> {
        let amount = 0_i64..5_000_000;
        (0_u8..5, amount, proptest::option::of(0_u8..6)).prop_map(|(shape, micros, key)| {
            let key_text = key.map(|k| format!("k{k}"));
            let micros = Microcents(micros);
            match shape {
                0 => LedgerOp::credit(
                    EntryKind::Topup,
                    micros,
                    key_text.as_deref().map(IdempotencyKey::payment),
                    "top-up",
                ),
                1 => LedgerOp::debit(
                    EntryKind::RunFee,
                    micros,
                    key_text
                        .as_deref()
                        .and_then(|k| RunId::parse(k).ok())
                        .map(|k| IdempotencyKey::run_fee(&k)),
                    "run fee",
                ),
                2 => {
                    let request = key_text.unwrap_or_else(|| "r".into());
                    LedgerOp::debit(
                        EntryKind::ServingUsage,
                        micros,
                        Some(IdempotencyKey::serving(&request)),
                        "serving",
                    )
                    .overdrawing()
                    .with_side(SideEffect::ServingUsage(ServingUsageRow {
                        request_id: request,
                        org_id: org(),
                        adapter_id: None,
                        model: "m".into(),
                        prompt_tokens: 1,
                        completion_tokens: 1,
                        cost_microcents: micros,
                        charged_microcents: micros,
                    }))
                }
                3 => LedgerOp::credit(
                    EntryKind::StarterCredit,
                    micros,
                    Some(IdempotencyKey::starter_credit()),
                    "starter",
                )
                .once_only()
                .with_side(SideEffect::StarterCredit),
                _ => LedgerOp::debit(
                    EntryKind::TrainingRun,
                    micros,
                    key_text
                        .as_deref()
                        .and_then(|k| RunId::parse(k).ok())
                        .map(|k| IdempotencyKey::training_run(&k)),
                    "training run",
                )
                .overdrawing(),
            }
        })
    }

    struct Planned {
        outcomes: Vec<Result<Outcome, LedgerError>>,
        writes: Writes,
        balance: Microcents,
    }

    fn plan_all(
        start: i64,
        ops: &[LedgerOp],
        applied: &mut Applied,
        usage: &mut HashMap<String, ServingUsageRow>,
    ) -> Planned {
        let mut writes = Writes::new(KeyCheck::LookUp);
        // A positive start is one paid grant (as the migration makes it).
        let grants: Vec<Grant> = (start > 0)
            .then(|| Grant {
                id: "migrated".into(),
                remaining: Microcents(start),
                priority: 50,
                expires_at: None,
                created_at: Utc::now(),
            })
            .into_iter()
            .collect();
        let result = plan(
            &org(),
            &account(start),
            &grants,
            ops,
            applied,
            usage,
            &mut writes,
            Utc::now(),
        );
        let balance = result.account.map(|a| a.balance).unwrap_or_default();
        Planned {
            outcomes: result.outcomes,
            writes,
            balance,
        }
    }

    proptest! {
        #[test]
        fn the_balance_is_the_start_plus_the_sum_of_the_entries(
            start in -1_000_000_i64..10_000_000,
            ops in proptest::collection::vec(op(), 0..40),
        ) {
            let planned = plan_all(start, &ops, &mut HashMap::new(), &mut HashMap::new());
            let mut running = Microcents(start);
            for entry in &planned.writes.entries {
                running = running + entry.amount;
                prop_assert_eq!(entry.balance_after, running);
            }
            prop_assert_eq!(planned.balance, running);
            let written: Vec<_> = planned.outcomes.iter().flatten().filter(|o| !o.replayed).collect();
            prop_assert_eq!(written.len(), planned.writes.entries.len());
            if let Some(row) = planned.writes.balances.first() {
                prop_assert_eq!(row.balance, running);
            }
        }

        #[test]
        fn a_replayed_key_changes_nothing(
            start in 0_i64..10_000_000,
            ops in proptest::collection::vec(op(), 1..30),
        ) {
            let (mut applied, mut usage) = (HashMap::new(), HashMap::new());
            let first = plan_all(start, &ops, &mut applied, &mut usage);
            // Every operation whose key was applied, sent again.
            let applied_again: Vec<LedgerOp> = ops
                .iter()
                .filter(|op| {
                    op.idempotency_key
                        .as_ref()
                        .is_some_and(|k| applied.contains_key(&(org(), k.clone())))
                })
                .cloned()
                .collect();
            let again = plan_all(first.balance.get(), &applied_again, &mut applied, &mut usage);
            prop_assert!(again.writes.entries.is_empty());
            prop_assert!(again.writes.usage_rows.is_empty());
            prop_assert!(again.writes.balances.is_empty());
            prop_assert_eq!(again.balance, first.balance);
            for (op, outcome) in applied_again.iter().zip(&again.outcomes) {
                match outcome {
                    Ok(o) => prop_assert!(o.replayed),
                    // A one-time grant answers 409 instead.
                    Err(e) => prop_assert!(*e == LedgerError::Duplicate && op.on_duplicate == OnDuplicate::Conflict),
                }
            }
        }

        #[test]
        fn nothing_overdraws_unless_the_operation_allows_it(
            start in 0_i64..3_000_000,
            ops in proptest::collection::vec(op(), 0..40),
        ) {
            let planned = plan_all(start, &ops, &mut HashMap::new(), &mut HashMap::new());
            let mut balance = Microcents(start);
            for (op, outcome) in ops.iter().zip(&planned.outcomes) {
                match outcome {
                    Ok(o) if !o.replayed => {
                        if !op.may_overdraw && op.amount < Microcents::ZERO {
                            prop_assert!(o.balance >= Microcents::ZERO, "{:?} overdrew to {}", op.kind, o.balance);
                        }
                        balance = o.balance;
                    }
                    Err(LedgerError::InsufficientFunds { balance: seen, needed }) => {
                        prop_assert!(!op.may_overdraw);
                        prop_assert_eq!(*seen, balance);
                        prop_assert!(balance + -*needed < Microcents::ZERO);
                    }
                    _ => {}
                }
            }
        }

        #[test]
        fn a_batch_comes_to_what_its_operations_do_one_by_one(
            start in -1_000_000_i64..10_000_000,
            ops in proptest::collection::vec(op(), 0..40),
        ) {
            let batch = plan_all(start, &ops, &mut HashMap::new(), &mut HashMap::new());
            let (mut applied, mut usage) = (HashMap::new(), HashMap::new());
            let mut account_now = account(start);
            let mut grants_now: Vec<Grant> = (start > 0)
                .then(|| Grant { id: "migrated".into(), remaining: Microcents(start), priority: 50, expires_at: None, created_at: Utc::now() })
                .into_iter()
                .collect();
            let mut outcomes = Vec::new();
            let mut entries = Vec::new();
            let mut usage_rows = Vec::new();
            for op in &ops {
                let mut writes = Writes::new(KeyCheck::LookUp);
                let result = plan(&org(), &account_now, &grants_now, std::slice::from_ref(op), &mut applied, &mut usage, &mut writes, Utc::now());
                if let Some(row) = writes.balances.first() {
                    account_now = row.account_after(&account_now, account_now.updated_at);
                }
                if let Some((_, after)) = writes.grants_after.pop() {
                    grants_now = after;
                }
                outcomes.extend(result.outcomes);
                entries.extend(writes.entries);
                usage_rows.extend(writes.usage_rows);
            }
            // A credit's grant id is new each time it is planned: compare the rest.
            let strip = |entries: Vec<EntryRow>| -> Vec<EntryRow> {
                entries.into_iter().map(|e| EntryRow { grants: None, ..e }).collect()
            };
            prop_assert_eq!(outcomes, batch.outcomes);
            prop_assert_eq!(strip(entries), strip(batch.writes.entries));
            prop_assert_eq!(usage_rows, batch.writes.usage_rows);
            prop_assert_eq!(account_now.balance_microcents, batch.balance);
        }
    }

    #[test]
    fn a_lapsed_grant_ends_before_the_batch_and_is_never_drawn() {
        let now = Utc::now();
        let grant = |id: &str, remaining: i64, priority: i32, expires_at| Grant {
            id: id.into(),
            remaining: Microcents(remaining),
            priority,
            expires_at,
            created_at: now - chrono::Duration::days(1),
        };
        let grants = [
            grant("lapsed", 300, 10, Some(now - chrono::Duration::seconds(1))),
            grant("paid", 500, 50, None),
        ];
        let fee = LedgerOp::debit(
            EntryKind::RunFee,
            Microcents(100),
            Some(IdempotencyKey::run_fee(&RunId::parse("r1").unwrap())),
            "fee",
        );
        // The sweep's own operation in the same batch finds the grant already ended.
        let sweep = LedgerOp::expiry("lapsed");
        let mut writes = Writes::new(KeyCheck::LookUp);
        let result = plan(
            &org(),
            &account(800),
            &grants,
            &[fee, sweep],
            &mut HashMap::new(),
            &mut HashMap::new(),
            &mut writes,
            now,
        );
        assert_eq!(
            result.outcomes.len(),
            2,
            "only the batch's operations are answered"
        );
        assert_eq!(result.outcomes[0].as_ref().unwrap().balance, Microcents(400));
        assert_eq!(result.outcomes[1], Err(LedgerError::Duplicate));
        let kinds: Vec<&str> = writes.entries.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, ["expiry", "run_fee"]);
        assert_eq!(writes.entries[0].amount, Microcents(-300));
        assert_eq!(
            writes.entries[0].idempotency_key.as_deref(),
            Some("expiry:lapsed")
        );
        assert!(writes.entries[1].grants.as_deref().unwrap().contains("paid"));
        assert_eq!(result.account.unwrap().expired, vec![Microcents(300)]);
        let ended = writes.grant_changes.iter().find(|c| c.id == "lapsed").unwrap();
        assert!(ended.expired && ended.remaining == Microcents::ZERO);
    }

    #[test]
    fn an_optimistic_plan_that_refuses_a_keyed_operation_asks_for_the_keys() {
        let mut writes = Writes::new(KeyCheck::Optimistic);
        let fee = LedgerOp::debit(
            EntryKind::RunFee,
            Microcents(5),
            Some(IdempotencyKey::run_fee(&RunId::parse("r1").unwrap())),
            "fee",
        );
        let result = plan(
            &org(),
            &account(0),
            &[],
            &[fee],
            &mut HashMap::new(),
            &mut HashMap::new(),
            &mut writes,
            Utc::now(),
        );
        assert!(matches!(
            result.outcomes[0],
            Err(LedgerError::InsufficientFunds { .. })
        ));
        assert!(writes.keys_unchecked);
        assert!(writes.entries.is_empty() && writes.balances.is_empty());
    }
}
