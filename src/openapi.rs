//! The OpenAPI 3.1 document of every route, generated from the route table (`crate::routes`).

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

/// The document: keel's description and security scheme, and the paths of the route table.
pub fn document() -> Document {
    let mut doc = Root::openapi();
    doc.merge(crate::routes::Doc::openapi());
    doc
}
