//! The `keel` command line: serve, migrate, admin.

use std::io::Write;

use clap::{Parser, Subcommand};
use migration::{Migrator, MigratorTrait};
use serde::Serialize;

use crate::startup::Application;
use crate::telemetry;
use keel_core::config::Settings;
use keel_core::database;

/// `keel serve --help`: the settings an operator sets first, with their variables.
const SERVE_SETTINGS: &str = "\
Settings (environment variables; every other setting is KEEL__SECTION__KEY, see config/default.toml):
  KEEL_LISTEN                 address to serve: HOST:PORT, localhost:PORT or PORT [127.0.0.1:8080]
  KEEL_DATABASE_URL           sqlite://PATH?mode=rwc or postgres://USER@HOST:PORT/DB [sqlite://keel.db?mode=rwc]
  KEEL_INTERNAL_KEYS          operator/worker keys, comma-separated (empty: those routes answer 401)
  KEEL_SESSION_SECRET         HS256 secret of session tokens and console cookies (empty: sessions refused)
  KEEL_PAYMENTS               simulated | stripe [simulated]
  KEEL_STRIPE_SECRET_KEY      Stripe secret key (required with KEEL_PAYMENTS=stripe)
  KEEL_STRIPE_WEBHOOK_SECRET  Stripe webhook signing secret
  KEEL_SERVING_URL            serving layer base URL (POST /api/sample)
  KEEL_PROVIDER_OPENAI_URL    provider bases of the recording proxy (also _ANTHROPIC_, _OPENROUTER_, _GOOGLE_)
  KEEL_PROFILE                config/<profile>.toml merged over the defaults (production: JSON logs)
  KEEL_CONFIG_DIR             directory of default.toml and the profile files [./config]
  RUST_LOG                    log filter [info]
Several instances share one PostgreSQL: give each the same KEEL_DATABASE_URL, KEEL_INTERNAL_KEYS
and KEEL_SESSION_SECRET (docs/OPERATIONS.md).";

#[derive(Debug, Parser)]
#[command(name = "keel", version, about = "keel: model-training platform backend")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP service (the default): applies migrations, then serves.
    #[command(after_help = SERVE_SETTINGS)]
    Serve,
    /// Apply or inspect database migrations.
    Migrate {
        #[command(subcommand)]
        action: MigrateAction,
    },
    /// Traces of the recording proxy, through the HTTP API.
    Traces {
        #[command(subcommand)]
        action: TracesAction,
    },
    /// Datasets, through the HTTP API.
    Datasets {
        #[command(subcommand)]
        action: DatasetsAction,
    },
    /// Operator tasks, on the database directly (docs/OPERATIONS.md, "The operator's command line").
    #[command(after_help = crate::admin::ADMIN_HELP)]
    Admin {
        /// JSON (the API's shapes) instead of a table.
        #[arg(long, global = true)]
        json: bool,
        #[command(subcommand)]
        action: AdminAction,
    },
}

#[derive(Debug, Subcommand)]
pub enum MigrateAction {
    /// Apply every pending migration.
    Up,
    /// Roll back the newest applied migration.
    Down,
    /// List migrations and whether each is applied.
    Status,
}

#[derive(Debug, Subcommand)]
pub enum TracesAction {
    /// Write a project's traces as JSONL (one record a line), with progress on stderr: the
    /// newest --limit, or with --all every one, page by page.
    Export {
        /// The project's id.
        #[arg(long)]
        project: String,
        /// records ({input, output}), prompts ({input}), raw (stored traces), openai-chat
        /// (OpenAI's fine-tuning format: {"messages": [...]} with the reply last) or otlp-json
        /// (OTLP/JSON ExportTraceServiceRequest lines, a span per trace, GenAI conventions).
        #[arg(long, default_value = "records", value_parser = ["records", "prompts", "raw", "openai-chat", "otlp-json"])]
        format: String,
        /// Newest traces to export (with --all: traces per page), 1..1000.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u16).range(1..=1000))]
        limit: u16,
        /// Every trace of the project, newest to oldest, page by page.
        #[arg(long)]
        all: bool,
        /// Go on with the interrupted export into --out (from FILE.cursor beside it).
        #[arg(long, requires_all = ["all", "out"])]
        resume: bool,
        /// Only traces recorded at or after this time (RFC 3339).
        #[arg(long)]
        since: Option<String>,
        /// Only traces recorded before this time (RFC 3339).
        #[arg(long)]
        until: Option<String>,
        /// Only traces of this model.
        #[arg(long)]
        model: Option<String>,
        /// Only traces with this tag.
        #[arg(long)]
        tag: Option<String>,
        /// `NAME:VALUE`: only traces whose score NAME is at least VALUE.
        #[arg(long)]
        min_score: Option<String>,
        /// Output file, written as FILE.part and renamed at the end (an existing FILE stays
        /// as it was if the export fails); standard output when absent.
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        /// keel's base URL.
        #[arg(long, env = "KEEL_URL", default_value = "http://127.0.0.1:8080")]
        base_url: String,
        /// A keel API key (or a session token) of the project's organization.
        #[arg(long, env = "KEEL_API_KEY", hide_env_values = true)]
        api_key: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum DatasetsAction {
    /// Write a dataset version's lines of one split as JSONL, with progress on stderr,
    /// checked against the version's SHA-256 at the end (exit 1 if they differ).
    Export {
        /// The dataset's id.
        #[arg(long)]
        dataset: String,
        /// The version (the latest when absent).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        version: Option<u32>,
        /// openai-chat (OpenAI's fine-tuning format), records ({input, output}) or prompts ({input}).
        #[arg(long, default_value = "openai-chat", value_parser = clap::builder::PossibleValuesParser::new(keel_core::datasets::LineFormat::NAMES.iter().copied()))]
        format: String,
        /// train, validation or all.
        #[arg(long, default_value = "all", value_parser = clap::builder::PossibleValuesParser::new(keel_core::datasets::SplitPart::NAMES.iter().copied()))]
        split: String,
        /// Go on with the interrupted download into --out (its whole lines are kept).
        #[arg(long, requires = "out")]
        resume: bool,
        /// Output file, written as FILE.part and renamed once its digest matches; standard
        /// output when absent.
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        /// keel's base URL.
        #[arg(long, env = "KEEL_URL", default_value = "http://127.0.0.1:8080")]
        base_url: String,
        /// A keel API key (or a session token) of the dataset's organization.
        #[arg(long, env = "KEEL_API_KEY", hide_env_values = true)]
        api_key: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum AdminAction {
    /// A session token for an existing user (by id or e-mail), e.g. an owner's after 24 h.
    Session {
        /// The user's id or e-mail.
        #[arg(long)]
        user: String,
    },
    /// Organizations.
    Orgs {
        #[command(subcommand)]
        action: crate::admin::OrgsAction,
    },
    /// An organization's API keys.
    Keys {
        #[command(subcommand)]
        action: crate::admin::KeysAction,
    },
    /// Credit grants.
    Grants {
        #[command(subcommand)]
        action: crate::admin::GrantsAction,
    },
    /// The training-job queue's actions.
    Queue {
        #[command(subcommand)]
        action: crate::admin::QueueAction,
    },
    /// An organization's training jobs.
    Jobs {
        #[command(subcommand)]
        action: crate::admin::JobsAction,
    },
    /// An organization's webhook endpoints.
    Webhooks {
        #[command(subcommand)]
        action: crate::admin::WebhooksAction,
    },
    /// Create an organization, its owner and an API key; print them with a session token as JSON.
    Bootstrap {
        /// Organization name.
        #[arg(long)]
        org: String,
        /// The owner's user id (a session token's `sub`).
        #[arg(long)]
        owner: String,
        /// The owner's email.
        #[arg(long)]
        email: Option<String>,
        /// Make another organization even if one already has this name.
        #[arg(long)]
        another: bool,
    },
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Bootstrapped {
    org_id: String,
    slug: String,
    user_id: String,
    api_key_id: String,
    api_key: String,
    /// `null` when no session secret is configured.
    session_token: Option<String>,
}

pub async fn run(cli: Cli, settings: Settings) -> anyhow::Result<()> {
    let command = cli.command.unwrap_or(Command::Serve);
    let mut telemetry_settings = settings.telemetry.clone();
    if matches!(command, Command::Traces { .. } | Command::Datasets { .. }) {
        // Per-request log lines would measure the terminal, not keel.
        telemetry_settings.level = "warn".into();
    }
    let logs = telemetry::init(&telemetry_settings);
    let result = run_command(command, settings).await;
    logs.flush();
    result
}

async fn run_command(command: Command, settings: Settings) -> anyhow::Result<()> {
    match command {
        Command::Serve => {
            for warning in settings.startup_warnings() {
                tracing::warn!("{warning}");
            }
            let database = database::describe_url(&settings.database.url);
            let payments = format!("{:?}", settings.payments.mode).to_lowercase();
            match crate::startup::raise_open_files_limit() {
                Ok(limit) => tracing::info!(limit, "open files"),
                Err(e) => tracing::warn!("cannot raise the open-files limit: {e}"),
            }
            tracing::info!(%database, "connecting to the database and applying migrations");
            let host = settings.listen_addr()?.ip();
            let app = Application::build(settings).await?;
            tracing::info!(
                "keel is serving on http://{host}:{} (database: {database}; payments: {payments})",
                app.port()
            );
            app.run_until_signalled().await
        }
        Command::Migrate { action } => {
            let db = database::connect(&settings.database).await?;
            match action {
                MigrateAction::Up => keel_core::Core::prepare(&settings.database, &db).await?,
                MigrateAction::Down => Migrator::down(&db, Some(1)).await?,
                MigrateAction::Status => {
                    let mut out = std::io::stdout().lock();
                    for migration in Migrator::get_migration_with_status(&db).await? {
                        writeln!(out, "{}\t{}", migration.name(), migration.status())?;
                    }
                }
            }
            Ok(())
        }
        Command::Traces {
            action:
                TracesAction::Export {
                    project,
                    format,
                    limit,
                    all,
                    resume,
                    since,
                    until,
                    model,
                    tag,
                    min_score,
                    out,
                    base_url,
                    api_key,
                },
        } => {
            let export = crate::traces::cli::ExportArgs {
                project,
                format,
                limit,
                all,
                since,
                until,
                model,
                tag,
                min_score,
                base_url,
                api_key,
            };
            crate::traces::cli::export_until_interrupted(&export, out.as_deref(), resume).await
        }
        Command::Datasets {
            action:
                DatasetsAction::Export {
                    dataset,
                    version,
                    format,
                    split,
                    resume,
                    out,
                    base_url,
                    api_key,
                },
        } => {
            let export = crate::datasets::cli::ExportArgs {
                dataset,
                version,
                format,
                split,
                base_url,
                api_key,
            };
            crate::datasets::cli::export_until_interrupted(&export, out.as_deref(), resume).await
        }
        Command::Admin { json, action } => admin(json, action, settings).await,
    }
}

async fn admin(json: bool, action: AdminAction, settings: Settings) -> anyhow::Result<()> {
    use crate::admin::Command as Admin;
    let command = match action {
        AdminAction::Bootstrap {
            org,
            owner,
            email,
            another,
        } => return bootstrap(org, owner, email, another, settings).await,
        AdminAction::Session { user } => Admin::Session { user },
        AdminAction::Orgs { action } => Admin::Orgs(action),
        AdminAction::Keys { action } => Admin::Keys(action),
        AdminAction::Grants { action } => Admin::Grants(action),
        AdminAction::Queue { action } => Admin::Queue(action),
        AdminAction::Jobs { action } => Admin::Jobs(action),
        AdminAction::Webhooks { action } => Admin::Webhooks(action),
    };
    crate::admin::run(command, json, settings).await
}

async fn bootstrap(
    org: String,
    owner: String,
    email: Option<String>,
    another: bool,
    settings: Settings,
) -> anyhow::Result<()> {
    {
        {
            let owner_id =
                keel_core::domain::UserId::parse(&owner).map_err(|e| anyhow::anyhow!("--owner: {e}"))?;
            let db = database::connect(&settings.database).await?;
            keel_core::Core::prepare(&settings.database, &db).await?;
            if !another {
                if let Some(existing) = keel_core::orgs::service::named(&db, &org).await? {
                    anyhow::bail!(
                        "an organization named {org:?} already exists (id {}, slug {}); \
                         pass --another to make a second one",
                        existing.id,
                        existing.slug
                    );
                }
            }
            let created = keel_core::orgs::service::create_org(&db, &org, None, &owner_id, email.as_deref())
                .await
                .map_err(|e| anyhow::anyhow!("bootstrap: {e}"))?;
            let key = keel_core::keys::service::create(
                &db,
                &created.org_id,
                Some("bootstrap"),
                &keel_core::keys::KeySettings::default(),
                chrono::Utc::now(),
            )
            .await
            .map_err(|e| anyhow::anyhow!("bootstrap: {e}"))?;
            let session_token =
                match keel_core::auth::session::SessionKeys::new(&settings.auth.session_secret) {
                    Some(keys) => Some(keys.issue(&owner, settings.auth.session_ttl_secs)?),
                    None => {
                        tracing::warn!("KEEL_SESSION_SECRET is not set: no session token was issued");
                        None
                    }
                };
            let out = Bootstrapped {
                org_id: created.org_id.into(),
                slug: created.slug,
                user_id: owner,
                api_key_id: key.api_key_id.into(),
                api_key: key.secret,
                session_token,
            };
            let mut stdout = std::io::stdout().lock();
            serde_json::to_writer_pretty(&mut stdout, &out)?;
            writeln!(stdout)?;
            Ok(())
        }
    }
}
