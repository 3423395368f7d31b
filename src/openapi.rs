//! The OpenAPI 3.1 document of every route, assembled from each domain's `Doc`.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::OpenApi as Document;
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(title = "keel", version = "0.1.0", description = "Organization-scoped model-training platform backend."),
    modifiers(&BearerAuth)
)]
struct Root;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut Document) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An operator internal key, a user API key (keel_sk_...) or a session JWT",
                    ))
                    .build(),
            ),
        );
    }
}

pub fn document() -> Document {
    let mut doc = Root::openapi();
    for part in [
        crate::system::Doc::openapi(),
        crate::auth::routes::Doc::openapi(),
        crate::orgs::Doc::openapi(),
        crate::orgs::api_keys::Doc::openapi(),
        crate::projects::Doc::openapi(),
        crate::billing::Doc::openapi(),
        crate::queue::Doc::openapi(),
        crate::runs::Doc::openapi(),
        crate::serving::Doc::openapi(),
        crate::flash::Doc::openapi(),
        crate::traces::Doc::openapi(),
        crate::evals::Doc::openapi(),
        crate::proxy::Doc::openapi(),
    ] {
        doc.merge(part);
    }
    doc
}
