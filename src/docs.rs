//! `/docs`: the OpenAPI document in Swagger UI, served from the Swagger UI release vendored
//! into the binary at build time (nothing is fetched from the internet, at build or run time).

use std::sync::{Arc, LazyLock};

use actix_web::http::header;
use actix_web::middleware::DefaultHeaders;
use actix_web::{web, HttpResponse};
use utoipa_swagger_ui::Config;

use crate::error::{Code, ErrorBody};

/// Swagger UI sets styles inline and draws icons from `data:` URLs; scripts and everything
/// else come from keel itself.
pub const CSP: &str = "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; \
                       frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// Swagger UI's settings: keel's own document, no call to the public validator.
static CONFIG: LazyLock<Arc<Config<'static>>> = LazyLock::new(|| {
    Arc::new(
        Config::from("/openapi.json")
            .validator_url("none")
            .try_it_out_enabled(true)
            .persist_authorization(false)
            .display_operation_id(false),
    )
});

/// Mounts `/docs` (a redirect to `/docs/`) and the files of Swagger UI under it.
pub fn configure(cfg: &mut web::ServiceConfig) {
    let headers = DefaultHeaders::new()
        .add((header::CONTENT_SECURITY_POLICY, CSP))
        .add((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .add((header::REFERRER_POLICY, "same-origin"));
    cfg.route("/docs", web::get().to(to_index)).service(
        web::scope("/docs")
            .wrap(headers)
            .route("/{file:.*}", web::get().to(file)),
    );
}

async fn to_index() -> HttpResponse {
    HttpResponse::PermanentRedirect()
        .insert_header((header::LOCATION, "/docs/"))
        .finish()
}

async fn file(path: web::Path<String>) -> HttpResponse {
    let not_found = || HttpResponse::NotFound().json(ErrorBody::new(Code::NotFound, "Not Found"));
    match utoipa_swagger_ui::serve(&path, CONFIG.clone()) {
        Ok(Some(file)) => {
            // The page and its settings may change with a new keel; the bundle is large.
            let cache = if file.content_type.starts_with("text/html") || path.ends_with("initializer.js") {
                "no-cache"
            } else {
                "public, max-age=86400"
            };
            HttpResponse::Ok()
                .content_type(file.content_type)
                .insert_header((header::CACHE_CONTROL, cache))
                .body(file.bytes.into_owned())
        }
        Ok(None) => not_found(),
        Err(err) => {
            tracing::error!(error = %err, file = %path, "swagger ui file");
            not_found()
        }
    }
}
