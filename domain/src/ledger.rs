//! What a ledger row records.

use sea_orm::{DeriveActiveEnum, EnumIter};

#[derive(Debug, Clone, Copy, PartialEq, Eq, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "Text")]
pub enum EntryKind {
    #[sea_orm(string_value = "topup")]
    Topup,
    #[sea_orm(string_value = "auto_topup")]
    AutoTopup,
    #[sea_orm(string_value = "promo")]
    Promo,
    #[sea_orm(string_value = "starter_credit")]
    StarterCredit,
    #[sea_orm(string_value = "run_fee")]
    RunFee,
    #[sea_orm(string_value = "serving_usage")]
    ServingUsage,
    #[sea_orm(string_value = "training_estimate")]
    TrainingEstimate,
    #[sea_orm(string_value = "training_run")]
    TrainingRun,
    /// An operator's goodwill credit or refund (a manual grant).
    #[sea_orm(string_value = "manual")]
    Manual,
    /// What was left of a credit grant when it expired (negative).
    #[sea_orm(string_value = "expiry")]
    Expiry,
}

impl EntryKind {
    /// The kind stored as `text`.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == text)
    }

    pub const ALL: [Self; 10] = [
        Self::Topup,
        Self::AutoTopup,
        Self::Promo,
        Self::StarterCredit,
        Self::RunFee,
        Self::ServingUsage,
        Self::TrainingEstimate,
        Self::TrainingRun,
        Self::Manual,
        Self::Expiry,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Topup => "topup",
            Self::AutoTopup => "auto_topup",
            Self::Promo => "promo",
            Self::StarterCredit => "starter_credit",
            Self::RunFee => "run_fee",
            Self::ServingUsage => "serving_usage",
            Self::TrainingEstimate => "training_estimate",
            Self::TrainingRun => "training_run",
            Self::Manual => "manual",
            Self::Expiry => "expiry",
        }
    }
}

impl std::fmt::Display for EntryKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What kind of credit a grant is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "Text")]
pub enum GrantKind {
    #[sea_orm(string_value = "starter")]
    Starter,
    #[sea_orm(string_value = "promo")]
    Promo,
    #[sea_orm(string_value = "topup")]
    Topup,
    #[sea_orm(string_value = "auto_topup")]
    AutoTopup,
    #[sea_orm(string_value = "manual")]
    Manual,
    #[sea_orm(string_value = "refund")]
    Refund,
    /// A balance as it stood when grants came (one per organization).
    #[sea_orm(string_value = "migrated")]
    Migrated,
}

impl GrantKind {
    pub const ALL: [Self; 7] = [
        Self::Starter,
        Self::Promo,
        Self::Topup,
        Self::AutoTopup,
        Self::Manual,
        Self::Refund,
        Self::Migrated,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starter => "starter",
            Self::Promo => "promo",
            Self::Topup => "topup",
            Self::AutoTopup => "auto_topup",
            Self::Manual => "manual",
            Self::Refund => "refund",
            Self::Migrated => "migrated",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == text)
    }

    /// The grant a credit of `entry` makes.
    pub fn of_entry(entry: EntryKind) -> Self {
        match entry {
            EntryKind::Topup => Self::Topup,
            EntryKind::AutoTopup => Self::AutoTopup,
            EntryKind::Promo => Self::Promo,
            EntryKind::StarterCredit => Self::Starter,
            EntryKind::Manual => Self::Manual,
            // A debit's kind given back (a training run cheaper than its estimate).
            _ => Self::Refund,
        }
    }
}

impl std::fmt::Display for GrantKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
