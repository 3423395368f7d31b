//! Statuses keel owns beyond a job's: an uploaded eval run's and a flash environment's
//! provisioning on the hub. (A run's and a flash run's status are the clients' own text,
//! 1..64 characters, and stay text: the spec leaves their values open.)

use sea_orm::{DeriveActiveEnum, EnumIter};
use serde::{Deserialize, Serialize};

/// An uploaded eval run's status (the uploader's, `completed` when it names none).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, EnumIter, DeriveActiveEnum,
)]
#[serde(rename_all = "lowercase")]
#[sea_orm(rs_type = "String", db_type = "Text")]
pub enum EvalStatus {
    #[default]
    #[sea_orm(string_value = "completed")]
    Completed,
    #[sea_orm(string_value = "failed")]
    Failed,
}

impl EvalStatus {
    pub const ALL: [Self; 2] = [Self::Completed, Self::Failed];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Failed => "failed",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

/// Where a flash environment's provisioning on the hub stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, EnumIter, DeriveActiveEnum)]
#[serde(rename_all = "lowercase")]
#[sea_orm(rs_type = "String", db_type = "Text")]
pub enum HubStatus {
    /// To be provisioned (new, or changed since).
    #[sea_orm(string_value = "pending")]
    Pending,
    #[sea_orm(string_value = "provisioned")]
    Provisioned,
}

impl HubStatus {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Provisioned => "provisioned",
        }
    }
}
