use sea_orm::entity::prelude::*;

/// One case of an eval run, in upload order.
#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "eval_cases")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub eval_run_id: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub position: i32,
    pub case_id: Option<String>,
    pub input: Option<String>,
    pub expected: Option<String>,
    pub actual: Option<String>,
    pub score: Option<f64>,
    pub success: Option<bool>,
    pub reason: Option<String>,
    pub error: Option<String>,
    pub metrics: Option<String>,
    pub latency_ms: Option<i64>,
    pub total_tokens: Option<i64>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
