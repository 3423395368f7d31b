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
}

impl EntryKind {
    /// The kind stored as `text`.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == text)
    }

    pub const ALL: [Self; 8] = [
        Self::Topup,
        Self::AutoTopup,
        Self::Promo,
        Self::StarterCredit,
        Self::RunFee,
        Self::ServingUsage,
        Self::TrainingEstimate,
        Self::TrainingRun,
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
        }
    }
}

impl std::fmt::Display for EntryKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
