//! The route table: every path of the service, with its method and handler, grouped in a
//! `web::scope` per prefix. The OpenAPI document lists exactly these handlers (it is
//! generated from this table), and a test checks that each handler documents the path and
//! method it is mounted at.
//!
//! Order matters for speed only: the router tries the groups in turn, so the routes that
//! machines call thousands of times a second come first (the proxy, then workers and
//! metering). No two groups share a path, so the order changes nothing else.

use actix_web::web;

use crate::http::resource;
use crate::{
    auth, billing, datasets, evals, flash, keys, orgs, projects, proxy, queue, runs, serving, system, traces,
    webhooks,
};

/// `root "" { ... }`: paths mounted as written. `scope "/prefix" { ... }`: paths under it.
/// Each line: `"path" => method handler, method handler;`.
macro_rules! route_table {
    ($(
        $kind:ident $prefix:literal {
            $( $path:literal => $( $method:ident $($handler:ident)::+ ),+ ; )+
        }
    )+) => {
        /// Mounts every route, then the console (`/console`, its own table in `console`) and
        /// the browsable documentation (`/docs`).
        pub fn configure(cfg: &mut web::ServiceConfig) {
            $( route_table!(@group cfg, $kind $prefix { $( $path => $( $method $($handler)::+ ),+ ; )+ }); )+
            // Every other call under /v1, any method, relayed to the provider (after the
            // table, so /v1/chat/completions stays the recording proxy's).
            cfg.service(web::resource("/v1/{tail:.*}").to(crate::proxy::relay::relay));
            crate::console::configure(cfg);
            crate::docs::configure(cfg);
        }

        /// Every (method, path) of the table.
        pub const PATHS: &[(&str, &str)] = &[
            $( $( $( (stringify!($method), concat!($prefix, $path)), )+ )+ )+
        ];

        /// The OpenAPI paths of exactly the handlers of the table.
        #[derive(utoipa::OpenApi)]
        #[openapi(paths( $( $( $( $($handler)::+ ),+ ),+ ),+ ))]
        pub struct Doc;
    };
    (@group $cfg:ident, root $_prefix:literal { $( $path:literal => $( $method:ident $($handler:ident)::+ ),+ ; )+ }) => {
        $( $cfg.service(resource($path, &[$(stringify!($method)),+]) $( .route(web::$method().to($($handler)::+)) )+ ); )+
    };
    (@group $cfg:ident, scope $prefix:literal { $( $path:literal => $( $method:ident $($handler:ident)::+ ),+ ; )+ }) => {
        $cfg.service(web::scope($prefix) $( .service(resource($path, &[$(stringify!($method)),+]) $( .route(web::$method().to($($handler)::+)) )+ ) )+ );
    };
}

route_table! {
    // The proxy: tens of thousands of calls a second.
    root "" {
        "/v1/chat/completions" => post proxy::chat_completions;
        "/healthz" => get system::healthz;
        "/openapi.json" => get system::openapi_json;
        "/metrics" => get system::metrics;
    }
    // Training workers (the internal key).
    scope "/api/training/internal" {
        "/jobs/claim" => post queue::internal::claim_jobs;
        "/jobs/succeeded" => post queue::internal::report_succeeded;
        "/jobs/blocked" => post queue::internal::report_blocked;
        "/jobs/user-stopped" => post queue::internal::report_user_stopped;
        "/jobs/failed" => post queue::internal::report_failed;
        "/jobs/heartbeat" => post queue::internal::heartbeat;
        "/jobs/heartbeats" => post queue::internal::heartbeat_many;
        "/jobs/reports" => post queue::internal::report_many;
        "/jobs/live-status" => post queue::internal::live_status;
        "/jobs/requeue-stale" => post queue::internal::requeue_stale;
        "/jobs/requeue-interrupted" => post queue::internal::requeue_interrupted;
        "/jobs/{job_id}" => get queue::internal::get_job_for_worker;
        "/jobs/{job_id}/dataset" => get datasets::routes::job_dataset;
        "/agent-logs" => get queue::agent::list_agent_logs_internal, post queue::agent::create_agent_log_internal;
        "/agent-usage" => post queue::agent::report_agent_usage;
        "/optimizer-timelines/sync" => post queue::agent::sync_optimizer_timelines;
    }
    scope "/api/billing" {
        "" => get billing::routes::get_billing;
        "/grants" => get billing::routes::list_grants;
        "/statement" => get billing::routes::statement;
        "/ledger.csv" => get billing::routes::ledger_csv;
        "/setup-intent" => post billing::routes::setup_intent;
        "/payment-method" => post billing::routes::save_payment_method, delete billing::routes::delete_payment_method;
        "/customer" => delete billing::routes::delete_customer;
        "/topup" => post billing::routes::topup;
        "/auto-topup" => put billing::routes::put_auto_topup;
        "/starter-credit" => post billing::routes::starter_credit;
        "/promo-code" => post billing::routes::promo_code;
        "/webhook" => post billing::routes::stripe_webhook;
        "/debit" => post billing::routes::debit;
        "/serving-usage" => post billing::routes::serving_usage;
        "/training-usage" => post billing::routes::training_usage;
        "/training-usage/precheck" => post billing::routes::training_precheck;
        "/training-usage/internal" => post billing::routes::training_usage_internal;
        "/training-cost" => post billing::routes::training_cost;
    }
    scope "/api/serving" {
        "/authorize" => post serving::routes::authorize;
        "/teardown" => post serving::routes::teardown;
    }
    // The spec's path for sampling a served adapter: the serving domain's.
    root "" {
        "/api/sample" => post serving::routes::sample;
    }
    scope "/api/webhooks" {
        "/endpoints" => post webhooks::routes::create_endpoint, get webhooks::routes::list_endpoints;
        "/endpoints/{endpoint_id}" => get webhooks::routes::get_endpoint, patch webhooks::routes::update_endpoint, delete webhooks::routes::delete_endpoint;
        "/endpoints/{endpoint_id}/rotate-secret" => post webhooks::routes::rotate_secret;
        "/endpoints/{endpoint_id}/test" => post webhooks::routes::send_test;
        "/endpoints/{endpoint_id}/deliveries" => get webhooks::routes::list_deliveries;
        "/deliveries/{delivery_id}/retry" => post webhooks::routes::retry_delivery;
    }
    scope "/api/training" {
        "/jobs" => post queue::routes::create_job, get queue::routes::list_jobs;
        "/jobs/batch" => post queue::routes::create_batch;
        "/jobs/{job_id}" => get queue::routes::get_job;
        "/jobs/{job_id}/stop" => post queue::routes::stop_job;
        "/jobs/{job_id}/retry" => post queue::routes::retry_job;
        "/secrets" => post queue::routes::set_secrets;
        "/schedules" => post queue::schedules::create_schedule, get queue::schedules::list_schedules;
        "/schedules/{schedule_id}" => get queue::schedules::get_schedule, patch queue::schedules::update_schedule, delete queue::schedules::delete_schedule;
        "/schedules/{schedule_id}/run" => post queue::schedules::run_schedule;
    }
    // The spec's path for a user's agent logs: the queue's agent module.
    root "" {
        "/api/agent-logs" => post queue::agent::create_agent_log;
    }
    scope "/api/auth" {
        "/verify" => get auth::routes::verify;
    }
    // Operators (the internal key): organizations, their keys and adapters.
    scope "/api/internal" {
        "/orgs" => post orgs::routes::create_org;
        "/orgs/{org_id}" => delete orgs::routes::delete_org;
        "/orgs/{org_id}/queue" => get queue::internal::get_org_queue, put queue::internal::put_org_queue;
        "/orgs/{org_id}/members/{user_id}" => put orgs::routes::put_member;
        "/orgs/{org_id}/api-keys" => post orgs::routes::create_api_key;
        "/api-keys/{api_key_id}" => delete orgs::routes::revoke_api_key;
        "/adapters/{adapter_id}*" => put orgs::routes::put_adapter, delete orgs::routes::delete_adapter;
        "/queue" => get queue::internal::queue_state;
        "/queue/{action}/pause" => post queue::internal::pause_action;
        "/queue/{action}/resume" => post queue::internal::resume_action;
        "/billing/grants" => post billing::routes::manual_grant;
    }
    scope "/api/api-keys" {
        "" => get keys::routes::list_keys, post keys::routes::create_key;
        "/{api_key_id}" => patch keys::routes::patch_key, delete keys::routes::revoke_key;
    }
    scope "/api/projects" {
        "" => get projects::routes::list_projects, post projects::routes::create_project;
        "/{project_id}" => get projects::routes::get_project, patch projects::routes::patch_project;
    }
    scope "/api/runs" {
        "" => post runs::routes::create_run;
        "/internal/checkpoints" => post runs::routes::upsert_checkpoints, get runs::routes::list_checkpoints;
        "/{run_id}" => patch runs::routes::update_run;
        "/{run_id}/tracker" => post runs::routes::link_tracker;
    }
    // The spec's path for reading a run's tracker: the runs domain's tracker module.
    root "" {
        "/api/tracker" => get runs::routes::read_tracker;
    }
    scope "/api/flash" {
        "/projects/validate/internal" => post flash::routes::validate_project;
        "/environments/hub/provision/internal" => post flash::routes::provision_hub;
        "/environments/internal" => post flash::routes::publish_environment, delete flash::routes::delete_environment;
        "/environments/validate/internal" => post flash::routes::validate_environment;
        "/environments/use/internal" => post flash::routes::use_environment;
        "/runs/internal" => post flash::routes::upsert_run;
        "/runs/checkpoints/internal" => post flash::routes::upsert_checkpoint;
        "/events/internal" => post flash::routes::record_event;
    }
    scope "/api/traces" {
        "/projects" => get traces::routes::trace_projects;
        "/export" => get traces::routes::export_project, post traces::routes::export_selection;
        "" => get traces::routes::list_traces;
        "/tags" => post traces::routes::tag_traces;
        "/{trace_id}" => get traces::routes::get_trace;
        "/{trace_id}/tags" => post traces::routes::tag_trace;
        "/{trace_id}/scores/{name}" => put traces::routes::put_score, delete traces::routes::delete_score;
    }
    scope "/api/datasets" {
        "" => post datasets::routes::create_dataset, get datasets::routes::list_datasets;
        "/{dataset_id}" => get datasets::routes::get_dataset, patch datasets::routes::patch_dataset, delete datasets::routes::delete_dataset;
        "/{dataset_id}/versions" => post datasets::routes::create_version;
        "/{dataset_id}/versions/{version}/export" => get datasets::routes::export_version;
    }
    scope "/api/evals" {
        "/runs" => post evals::routes::upload_eval_run;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use utoipa::OpenApi;

    use super::*;

    /// Each handler documents exactly the path and method the table mounts it at.
    #[test]
    fn the_openapi_paths_are_the_table() {
        let doc = Doc::openapi();
        let documented: BTreeSet<(String, String)> = doc
            .paths
            .paths
            .iter()
            .flat_map(|(path, item)| {
                let methods = [
                    ("get", item.get.is_some()),
                    ("post", item.post.is_some()),
                    ("put", item.put.is_some()),
                    ("patch", item.patch.is_some()),
                    ("delete", item.delete.is_some()),
                ];
                methods
                    .into_iter()
                    .filter(|(_, present)| *present)
                    .map(|(method, _)| (method.to_owned(), path.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        let table: BTreeSet<(String, String)> = PATHS
            .iter()
            // actix's tail segment `{name}*` is documented as `{name}`.
            .map(|(method, path)| ((*method).to_owned(), path.trim_end_matches('*').to_owned()))
            .collect();
        assert_eq!(documented, table);
        assert_eq!(
            PATHS.len(),
            table.len(),
            "a (method, path) appears twice in the table"
        );
    }
}
