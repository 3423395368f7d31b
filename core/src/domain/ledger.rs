//! What a ledger row records.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Topup,
    AutoTopup,
    Promo,
    StarterCredit,
    RunFee,
    ServingUsage,
    TrainingEstimate,
    TrainingRun,
}

impl EntryKind {
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
