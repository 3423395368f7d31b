//! `keel admin`: the operator's commands, over the same core services the HTTP routes use
//! (and the same bodies and views: a grant's bounds are `ManualGrantBody`'s, `--json` prints
//! what the API answers). Each command builds the core without its loops
//! ([`keel_core::Core::for_command`]), runs, then drains it (a grant's ledger commit, a
//! credit's requeue). Exit codes: 0 done, 1 refused (the message says why), 2 usage or
//! configuration.

use std::io::Write;

use clap::Subcommand;
use serde::Serialize;
use serde_json::json;

use crate::error::ApiError;
use keel_core::config::Settings;
use keel_core::domain::{ApiKeyId, JobAction, JobId, JobStatus, OrgId};
use keel_core::Core;

/// What `keel admin --help` says after the commands.
pub const ADMIN_HELP: &str = "\
Every command reads the same configuration and database as `keel serve` (KEEL_DATABASE_URL,
KEEL_CONFIG_DIR, KEEL_PROFILE, KEEL__SECTION__KEY). On PostgreSQL a change is announced to the
running instances as the HTTP route announces it (a revoked key is refused at once, a resumed
queue wakes waiting claims). On SQLite the running instance sees it when its caches expire
(keys within proxy.auth_cache_ttl_ms; claims at their next look).
Exit codes: 0 done, 1 refused (the message says why), 2 usage or configuration error.";

/// A refusal or a usage error, with the exit code it is.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The command was understood and refused (not found, conflict, insufficient...): 1.
    #[error("{0}")]
    Refused(String),
    /// The command or the configuration is wrong: 2.
    #[error("{0}")]
    Usage(String),
}

impl AdminError {
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Refused(_) => 1,
            Self::Usage(_) => 2,
        }
    }
}

/// A service's refusal as the API words it; a body the API would answer 422 to is a usage
/// error (its fields named as the body names them).
impl From<ApiError> for AdminError {
    fn from(err: ApiError) -> Self {
        match err {
            ApiError::Validation(issues) => Self::Usage(
                issues
                    .iter()
                    .map(|issue| {
                        let at: Vec<String> = issue
                            .loc
                            .iter()
                            .skip(1)
                            .map(|l| l.as_str().map_or_else(|| l.to_string(), str::to_owned))
                            .collect();
                        format!("{}: {}", at.join("."), issue.msg)
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
            other => Self::Refused(other.to_string()),
        }
    }
}

fn refused(err: impl Into<ApiError>) -> AdminError {
    AdminError::from(err.into())
}

#[derive(Debug, Subcommand)]
pub enum OrgsAction {
    /// Every organization: id, slug, name, creation.
    List,
}

#[derive(Debug, Subcommand)]
pub enum KeysAction {
    /// The organization's API keys (never their secrets).
    List {
        #[arg(long)]
        org: String,
    },
    /// A new API key of the organization; its secret is printed this once.
    Create {
        #[arg(long)]
        org: String,
        /// The key's name.
        #[arg(long)]
        name: Option<String>,
    },
    /// Revokes one of the organization's keys (refused at once on every instance).
    Revoke {
        #[arg(long)]
        org: String,
        /// The key's id.
        key_id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum GrantsAction {
    /// Grants credit, once per idempotency key (as POST /api/internal/billing/grants).
    Add {
        #[arg(long)]
        org: String,
        #[arg(long)]
        amount_cents: i64,
        #[arg(long)]
        reason: String,
        /// When the credit expires (RFC 3339); never by default.
        #[arg(long)]
        expires_at: Option<String>,
        /// The grant's key: the same key and body again grants nothing more.
        #[arg(long)]
        idempotency_key: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum QueueAction {
    /// Every action's queue: paused or not, jobs by status.
    Status,
    /// Pauses an action's queue: claims of it hand out nothing until resumed.
    Pause { action: String },
    /// Resumes an action's queue; waiting claims look again.
    Resume { action: String },
}

#[derive(Debug, Subcommand)]
pub enum JobsAction {
    /// The organization's jobs, newest first.
    List {
        #[arg(long)]
        org: String,
        /// Only jobs in this status (queued, running, failed...).
        #[arg(long)]
        status: Option<String>,
        /// At most this many (1..200).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=200))]
        limit: u64,
    },
    /// Puts a failed, blocked or user-stopped job back in the queue.
    Retry { job_id: String },
}

#[derive(Debug, Subcommand)]
pub enum WebhooksAction {
    /// The organization's webhook endpoints (never their secrets).
    List {
        #[arg(long)]
        org: String,
    },
}

/// A command of `keel admin` other than `bootstrap`.
#[derive(Debug)]
pub enum Command {
    Session { user: String },
    Orgs(OrgsAction),
    Keys(KeysAction),
    Grants(GrantsAction),
    Queue(QueueAction),
    Jobs(JobsAction),
    Webhooks(WebhooksAction),
}

/// What a command prints: a table by default, the API's JSON with `--json`.
struct Printed {
    json: serde_json::Value,
    header: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Printed {
    fn table<T: Serialize>(
        json: &T,
        header: Vec<&'static str>,
        rows: Vec<Vec<String>>,
    ) -> Result<Self, AdminError> {
        Ok(Self {
            json: serde_json::to_value(json).map_err(|e| AdminError::Refused(e.to_string()))?,
            header,
            rows,
        })
    }

    fn write(&self, as_json: bool) -> anyhow::Result<()> {
        let mut out = std::io::stdout().lock();
        if as_json {
            serde_json::to_writer_pretty(&mut out, &self.json)?;
            writeln!(out)?;
            return Ok(());
        }
        let mut table = tabwriter::TabWriter::new(out).padding(2);
        writeln!(table, "{}", self.header.join("\t"))?;
        for row in &self.rows {
            let cells: Vec<String> = row.iter().map(|c| cell(c)).collect();
            writeln!(table, "{}", cells.join("\t"))?;
        }
        table.flush()?;
        Ok(())
    }
}

/// A value as one table cell: names, URLs and errors are anyone's text, so a tab or line
/// break is a space and any other control character (a terminal escape) is shown escaped.
fn cell(value: &str) -> String {
    value
        .chars()
        .map(|c| match c {
            '\t' | '\n' | '\r' => " ".to_owned(),
            c if c.is_control() => c.escape_unicode().to_string(),
            c => c.to_string(),
        })
        .collect()
}

fn org_of(raw: &str) -> Result<OrgId, AdminError> {
    OrgId::parse(raw).map_err(|e| AdminError::Usage(format!("--org: {e}")))
}

fn action_of(raw: &str) -> Result<JobAction, AdminError> {
    JobAction::parse(raw).ok_or_else(|| {
        let known: Vec<&str> = JobAction::ALL.iter().map(|a| a.as_str()).collect();
        AdminError::Usage(format!("unknown action {raw:?} (one of {})", known.join(", ")))
    })
}

fn time(at: Option<chrono::DateTime<chrono::Utc>>) -> String {
    at.map_or_else(
        || "-".into(),
        |at| at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    )
}

/// Runs one command and prints its answer.
pub async fn run(command: Command, as_json: bool, settings: Settings) -> anyhow::Result<()> {
    if let Command::Session { user } = &command {
        return session(user, as_json, &settings).await;
    }
    // Bodies are checked against their schemas as the routes check them.
    crate::openapi::install_components();
    let db = keel_core::database::connect(&settings.database).await?;
    Core::prepare(&settings.database, &db).await?;
    let core = Core::for_command(db, settings)?;
    let printed = execute(&core, command).await;
    core.shutdown().await;
    printed?.write(as_json)
}

/// `session --user`: a session token for an existing user (by id or e-mail).
async fn session(user: &str, as_json: bool, settings: &Settings) -> anyhow::Result<()> {
    let Some(keys) = keel_core::auth::session::SessionKeys::new(&settings.auth.session_secret) else {
        return Err(AdminError::Usage(
            "KEEL_SESSION_SECRET is not set: keel issues no session tokens".into(),
        )
        .into());
    };
    let db = keel_core::database::connect(&settings.database).await?;
    Core::prepare(&settings.database, &db).await?;
    let found = keel_core::auth::service::find_user(&db, user).await?;
    db.close().await.ok();
    let Some(found) = found else {
        return Err(AdminError::Refused(format!("no user with the id or e-mail {user:?}")).into());
    };
    let token = keys.issue(found.id.as_str(), settings.auth.session_ttl_secs)?;
    let expires_at = chrono::Utc::now() + chrono::Duration::seconds(settings.auth.session_ttl_secs);
    let mut out = std::io::stdout().lock();
    match as_json {
        true => {
            let answer = json!({"userId": found.id, "email": found.email, "sessionToken": token, "expiresAt": expires_at});
            serde_json::to_writer_pretty(&mut out, &answer)?;
            writeln!(out)?;
        }
        // The token alone, so `TOKEN=$(keel admin session --user ...)` works.
        false => writeln!(out, "{token}")?,
    }
    Ok(())
}

async fn execute(core: &Core, command: Command) -> Result<Printed, AdminError> {
    match command {
        Command::Session { .. } => Err(AdminError::Usage("session is run apart".into())),
        Command::Orgs(OrgsAction::List) => {
            let orgs = keel_core::orgs::service::all(&core.db).await.map_err(refused)?;
            let rows = orgs
                .iter()
                .map(|o| {
                    vec![
                        o.id.to_string(),
                        o.slug.clone(),
                        o.name.clone(),
                        time(Some(o.created_at)),
                    ]
                })
                .collect();
            let view: Vec<serde_json::Value> = orgs
                .iter()
                .map(|o| json!({"orgId": o.id, "slug": o.slug, "name": o.name, "createdAt": o.created_at}))
                .collect();
            Printed::table(
                &json!({"orgs": view}),
                vec!["ORG ID", "SLUG", "NAME", "CREATED"],
                rows,
            )
        }
        Command::Keys(action) => keys(core, action).await,
        Command::Grants(GrantsAction::Add {
            org,
            amount_cents,
            reason,
            expires_at,
            idempotency_key,
        }) => {
            // The route's body and header rules, then its service.
            let body =
                json!({"orgId": org, "amountCents": amount_cents, "reason": reason, "expiresAt": expires_at});
            let body: crate::billing::dto::ManualGrantBody =
                crate::http::extract::parse_checked_body(body.to_string().as_bytes())?;
            let key = crate::http::extract::IdempotencyKeyHeader::check(
                idempotency_key.as_bytes(),
                vec!["header".into(), "idempotency-key".into()],
            )?;
            let operator = std::env::var("USER").unwrap_or_else(|_| "operator".into());
            let grant = keel_core::billing::service::manual_grant(
                &core.billing,
                &body.org_id,
                keel_core::billing::service::ManualGrant {
                    amount: body.amount_cents,
                    reason: body.reason,
                    expires_at: body.expires_at,
                    priority: body.priority,
                    key,
                    created_by: format!("cli:{operator}"),
                },
            )
            .await
            .map_err(refused)?;
            let view = crate::billing::dto::ManualGrantView {
                reason: grant.reason.clone(),
                created_by: grant.created_by.clone(),
                grant: crate::billing::dto::GrantView::from(grant),
            };
            let row = vec![
                view.grant.grant_id.clone(),
                view.grant.kind.clone(),
                format!("{:.2}", view.grant.original_microcents.get() as f64 / 1e8),
                view.grant.expires_at.map_or("-".into(), |at| at.to_rfc3339()),
                view.reason.clone(),
            ];
            Printed::table(
                &view,
                vec!["GRANT ID", "KIND", "AMOUNT ($)", "EXPIRES", "REASON"],
                vec![row],
            )
        }
        Command::Queue(action) => queue(core, action).await,
        Command::Jobs(action) => jobs(core, action).await,
        Command::Webhooks(WebhooksAction::List { org }) => {
            let org = org_of(&org)?;
            let endpoints =
                keel_core::webhooks::service::endpoints(&core.webhooks, std::slice::from_ref(&org))
                    .await
                    .map_err(refused)?;
            let views: Vec<crate::webhooks::dto::EndpointView> = endpoints
                .into_iter()
                .map(crate::webhooks::dto::EndpointView::from)
                .collect();
            let rows = views
                .iter()
                .map(|e| {
                    vec![
                        e.endpoint_id.clone(),
                        e.url.clone(),
                        e.enabled.to_string(),
                        e.events.join(","),
                        e.disabled_reason.clone().unwrap_or_default(),
                    ]
                })
                .collect();
            Printed::table(
                &crate::webhooks::dto::EndpointList { endpoints: views },
                vec!["ENDPOINT ID", "URL", "ENABLED", "EVENTS", "DISABLED BECAUSE"],
                rows,
            )
        }
    }
}

async fn keys(core: &Core, action: KeysAction) -> Result<Printed, AdminError> {
    match action {
        KeysAction::List { org } => {
            let org = org_of(&org)?;
            if !keel_core::orgs::service::exists(&core.db, &org)
                .await
                .map_err(refused)?
            {
                return Err(AdminError::Refused(format!("no organization {org}")));
            }
            let keys: Vec<crate::keys::dto::ApiKeyView> =
                keel_core::keys::service::list(&core.db, &org, chrono::Utc::now())
                    .await
                    .map_err(refused)?
                    .into_iter()
                    .map(crate::keys::dto::ApiKeyView::from)
                    .collect();
            let rows = keys
                .iter()
                .map(|k| {
                    vec![
                        k.api_key_id.clone(),
                        k.name.clone().unwrap_or_default(),
                        k.prefix.clone(),
                        time(Some(k.created_at)),
                        time(k.revoked_at),
                        time(k.last_used_at),
                    ]
                })
                .collect();
            Printed::table(
                &crate::keys::dto::ApiKeyList { keys },
                vec!["KEY ID", "NAME", "PREFIX", "CREATED", "REVOKED", "LAST USED"],
                rows,
            )
        }
        KeysAction::Create { org, name } => {
            let org = org_of(&org)?;
            let created = keel_core::keys::service::create(
                &core.db,
                &org,
                name.as_deref(),
                &keel_core::keys::KeySettings::default(),
                chrono::Utc::now(),
            )
            .await
            .map_err(refused)?;
            let view = crate::orgs::dto::CreatedKeyResponse {
                api_key_id: created.api_key_id.into(),
                key: created.secret,
            };
            let row = vec![view.api_key_id.clone(), view.key.clone()];
            Printed::table(&view, vec!["KEY ID", "KEY (shown this once)"], vec![row])
        }
        KeysAction::Revoke { org, key_id } => {
            let org = org_of(&org)?;
            let key_id = ApiKeyId::parse(&key_id).map_err(|e| AdminError::Usage(format!("key id: {e}")))?;
            keel_core::keys::service::revoke(&core.db, &core.cluster, &org, &key_id)
                .await
                .map_err(refused)?;
            Printed::table(
                &json!({"revoked": true, "apiKeyId": key_id}),
                vec!["KEY ID", "REVOKED"],
                vec![vec![key_id.to_string(), "true".into()]],
            )
        }
    }
}

async fn queue(core: &Core, action: QueueAction) -> Result<Printed, AdminError> {
    let queues = match action {
        QueueAction::Status => keel_core::queue::service::action_queues(&core.jobs)
            .await
            .map_err(refused)?,
        QueueAction::Pause { action } => {
            vec![keel_core::queue::service::pause(&core.jobs, action_of(&action)?)
                .await
                .map_err(refused)?]
        }
        QueueAction::Resume { action } => {
            vec![keel_core::queue::service::resume(&core.jobs, action_of(&action)?)
                .await
                .map_err(refused)?]
        }
    };
    let count = |q: &keel_core::queue::service::ActionQueue, status: JobStatus| {
        q.counts
            .iter()
            .find(|(s, _)| *s == status)
            .map_or(0, |(_, n)| *n)
            .to_string()
    };
    let rows = queues
        .iter()
        .map(|q| {
            vec![
                q.action.to_string(),
                if q.paused { "paused" } else { "running" }.into(),
                count(q, JobStatus::Queued),
                count(q, JobStatus::Scheduled),
                count(q, JobStatus::Running),
                count(q, JobStatus::Failed),
            ]
        })
        .collect();
    let views: Vec<crate::queue::internal::ActionQueueView> = queues
        .into_iter()
        .map(crate::queue::internal::ActionQueueView::from)
        .collect();
    let json = match views.len() {
        1 => serde_json::to_value(&views[0]),
        _ => serde_json::to_value(json!({"actions": views})),
    }
    .map_err(|e| AdminError::Refused(e.to_string()))?;
    Printed::table(
        &json,
        vec!["ACTION", "STATE", "QUEUED", "SCHEDULED", "RUNNING", "FAILED"],
        rows,
    )
}

async fn jobs(core: &Core, action: JobsAction) -> Result<Printed, AdminError> {
    // A retry answers the job itself (as its route does); a list, the list.
    let retry = matches!(action, JobsAction::Retry { .. });
    let found = match action {
        JobsAction::List { org, status, limit } => {
            let org = org_of(&org)?;
            let status = match status {
                Some(raw) => vec![JobStatus::parse(&raw)
                    .ok_or_else(|| AdminError::Usage(format!("unknown status {raw:?}")))?],
                None => Vec::new(),
            };
            let filter = keel_core::queue::JobFilter {
                status,
                ..Default::default()
            };
            keel_core::queue::service::jobs_page(&core.jobs, std::slice::from_ref(&org), &filter, limit)
                .await
                .map_err(refused)?
                .0
        }
        JobsAction::Retry { job_id } => {
            let job_id = JobId::parse(&job_id).map_err(|e| AdminError::Usage(format!("job id: {e}")))?;
            let job = keel_core::queue::service::job_for_worker(&core.jobs, &job_id)
                .await
                .map_err(refused)?;
            vec![keel_core::queue::service::retry_job(&core.jobs, &job)
                .await
                .map_err(refused)?]
        }
    };
    let rows = found
        .iter()
        .map(|j| {
            vec![
                j.id.to_string(),
                j.action.to_string(),
                j.status.to_string(),
                j.attempts.to_string(),
                time(Some(j.created_at)),
                j.error.clone().unwrap_or_default().chars().take(60).collect(),
            ]
        })
        .collect();
    let views = crate::queue::views(&core.jobs, &found).await?;
    let json = match (retry, views.first()) {
        (true, Some(view)) => serde_json::to_value(view),
        _ => serde_json::to_value(json!({"jobs": views, "count": views.len()})),
    }
    .map_err(|e| AdminError::Refused(e.to_string()))?;
    Printed::table(
        &json,
        vec!["JOB ID", "ACTION", "STATUS", "ATTEMPTS", "CREATED", "ERROR"],
        rows,
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cell_is_one_line_without_terminal_escapes() {
        assert_eq!(super::cell("Acme\tRobotics\nInc"), "Acme Robotics Inc");
        assert_eq!(super::cell("\u{1b}[31mred"), "\\u{1b}[31mred");
        assert_eq!(super::cell("café"), "café");
    }
}
