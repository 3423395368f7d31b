//! The console: server-rendered pages under `/console` for organizations and operators.
//! Handlers read through the same services and repos as the JSON API and decide access with
//! the same caller and membership checks; templates are compiled in and autoescape.

mod assets;
mod chart;
mod datasets;
mod error;
mod format;
mod forms;
mod hooks;
mod jobs;
mod operator;
mod org;
mod pages;
mod respond;
mod schedules;
pub mod session;
mod signin;
mod trace_filter;
mod words;
mod work;

use actix_web::http::header;
use actix_web::middleware::DefaultHeaders;
use actix_web::{web, HttpResponse};

// What every page's handler shares, each in the file below the pages it serves (the route
// table here is the only file that names the pages).
pub use error::ConsoleError;
pub(crate) use error::{describe, unknown_choice, unreadable};
pub use forms::{Flash, FormFields};
pub use respond::Confirm;
pub(crate) use respond::{after_form, confirm_page, html, page, redirect, wants_partial};

/// The console's content security policy: nothing inline, nothing from elsewhere, no framing.
pub const CSP: &str = "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// Mounts the console. Every path of it is listed here.
pub fn configure(cfg: &mut web::ServiceConfig) {
    let headers = DefaultHeaders::new()
        .add((header::CONTENT_SECURITY_POLICY, CSP))
        .add((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .add((header::REFERRER_POLICY, "same-origin"))
        .add((header::X_FRAME_OPTIONS, "DENY"))
        .add((header::CACHE_CONTROL, "no-store"));
    cfg.service(
        web::scope("/console")
            .wrap(headers)
            // A query the page cannot read is a console page saying so, not actix's text.
            .app_data(web::QueryConfig::default().error_handler(|err, _| {
                let name = match &err {
                    actix_web::error::QueryPayloadError::Deserialize(e) => e
                        .to_string()
                        .split('`')
                        .nth(1)
                        .map_or_else(|| "value".to_owned(), |f| format!("\"{f}\"")),
                    _ => "value".to_owned(),
                };
                unreadable(&name).into()
            }))
            .route("", web::get().to(signin::home))
            .route("/", web::get().to(signin::home))
            .route("/login", web::get().to(signin::login_form))
            .route("/login", web::post().to(signin::login))
            .route("/logout", web::post().to(signin::logout))
            .route("/orgs", web::get().to(signin::organizations))
            .route("/orgs/pick", web::post().to(signin::pick_org))
            .route("/static/{name}", web::get().to(assets::serve))
            .route("/o/{org}", web::get().to(org::overview))
            .route("/o/{org}/card", web::post().to(org::save_card))
            .route("/o/{org}/card/remove", web::post().to(org::remove_card))
            .route("/o/{org}/auto-topup", web::post().to(org::auto_topup))
            .route("/o/{org}/topup", web::post().to(org::topup))
            .route("/o/{org}/promo", web::post().to(org::promo))
            .route("/o/{org}/starter-credit", web::post().to(org::starter_credit))
            .route("/o/{org}/credits", web::get().to(org::credits))
            .route("/o/{org}/ledger", web::get().to(org::ledger))
            .route("/o/{org}/ledger.csv", web::get().to(org::ledger_csv))
            .route("/o/{org}/keys", web::get().to(org::keys))
            .route("/o/{org}/keys", web::post().to(org::create_key))
            .route("/o/{org}/keys/{key}/revoke", web::post().to(org::revoke_key))
            .route("/o/{org}/keys/{key}/edit", web::post().to(org::edit_key))
            .route("/o/{org}/jobs", web::get().to(jobs::jobs))
            .route("/o/{org}/jobs/bulk", web::post().to(jobs::bulk))
            .route("/o/{org}/jobs/{job}", web::get().to(jobs::job))
            .route("/o/{org}/jobs/{job}/stop", web::post().to(jobs::stop_job))
            .route("/o/{org}/jobs/{job}/retry", web::post().to(jobs::retry_job))
            .route("/o/{org}/schedules", web::get().to(schedules::list))
            .route(
                "/o/{org}/schedules/{schedule}/enabled",
                web::post().to(schedules::set_enabled),
            )
            .route(
                "/o/{org}/schedules/{schedule}/run",
                web::post().to(schedules::run_now),
            )
            .route("/o/{org}/traces", web::get().to(work::trace_projects))
            .route("/o/{org}/projects/{project}/traces", web::get().to(work::traces))
            .route("/o/{org}/projects/{project}/export", web::post().to(work::export))
            .route("/o/{org}/traces/{trace}", web::get().to(work::trace))
            .route("/o/{org}/traces/{trace}/tags", web::post().to(work::trace_tags))
            .route("/o/{org}/traces/{trace}/scores", web::post().to(work::set_score))
            .route(
                "/o/{org}/traces/{trace}/scores/{name}/delete",
                web::post().to(work::delete_score),
            )
            .route(
                "/o/{org}/projects/{project}/tag",
                web::post().to(work::tag_traces),
            )
            .route(
                "/o/{org}/projects/{project}/score",
                web::post().to(work::score_traces),
            )
            .route(
                "/o/{org}/projects/{project}/retention",
                web::post().to(work::set_retention),
            )
            .route(
                "/o/{org}/projects/{project}/datasets",
                web::get().to(datasets::list),
            )
            .route(
                "/o/{org}/projects/{project}/datasets",
                web::post().to(datasets::save),
            )
            .route(
                "/o/{org}/datasets/{dataset}/versions",
                web::post().to(datasets::refresh),
            )
            .route(
                "/o/{org}/datasets/{dataset}/versions/{version}",
                web::get().to(datasets::version),
            )
            .route(
                "/o/{org}/datasets/{dataset}/versions/{version}/export",
                web::get().to(datasets::download),
            )
            .route("/o/{org}/evals", web::get().to(work::evals))
            .route("/o/{org}/evals/{run}", web::get().to(work::eval_run))
            .route("/o/{org}/runs", web::get().to(work::runs))
            .route("/o/{org}/webhooks", web::get().to(hooks::webhooks))
            .route("/o/{org}/webhooks", web::post().to(hooks::create))
            .route(
                "/o/{org}/webhooks/deliveries/{delivery}/retry",
                web::post().to(hooks::retry),
            )
            .route(
                "/o/{org}/webhooks/deliveries/{delivery}",
                web::get().to(hooks::delivery),
            )
            .route("/o/{org}/webhooks/{endpoint}", web::get().to(hooks::log))
            .route("/o/{org}/webhooks/{endpoint}/edit", web::post().to(hooks::edit))
            .route(
                "/o/{org}/webhooks/{endpoint}/enabled",
                web::post().to(hooks::set_enabled),
            )
            .route(
                "/o/{org}/webhooks/{endpoint}/test",
                web::post().to(hooks::send_test),
            )
            .route(
                "/o/{org}/webhooks/{endpoint}/rotate",
                web::post().to(hooks::rotate),
            )
            .route(
                "/o/{org}/webhooks/{endpoint}/delete",
                web::post().to(hooks::delete),
            )
            .route("/operator/queue", web::get().to(operator::queue))
            .route("/operator/requeue-stale", web::post().to(operator::requeue_stale))
            .route("/operator/queue/{action}/pause", web::post().to(operator::pause))
            .route(
                "/operator/queue/{action}/resume",
                web::post().to(operator::resume),
            )
            .route("/operator/orgs/{org}/queue", web::post().to(operator::set_share))
            .route("/operator/failed", web::get().to(operator::failed))
            .route("/operator/failed/retry", web::post().to(operator::retry_failed))
            .route("/operator/writer", web::get().to(operator::writer))
            .route("/operator/webhooks", web::get().to(hooks::failing))
            .route("/operator/grants", web::get().to(operator::grants))
            .route("/operator/grants", web::post().to(operator::grant))
            .default_service(web::to(not_found)),
    );
}

async fn not_found() -> Result<HttpResponse, ConsoleError> {
    Err(ConsoleError::NotFound)
}
