//! The console's stylesheet and script, compiled into the binary and served with a
//! validator, so a browser keeps them and asks again only with `If-None-Match`.

use std::sync::LazyLock;

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use sha2::{Digest, Sha256};

use super::ConsoleError;

struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const ASSETS: &[Asset] = &[
    Asset {
        name: "console.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../../assets/console/console.css"),
    },
    Asset {
        name: "favicon.svg",
        content_type: "image/svg+xml",
        body: include_bytes!("../../assets/console/favicon.svg"),
    },
    Asset {
        name: "console.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../../assets/console/console.js"),
    },
];

static ETAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|a| format!("\"{}\"", hex::encode(&Sha256::digest(a.body)[..8])))
        .collect()
});

pub async fn serve(req: HttpRequest, name: web::Path<String>) -> Result<HttpResponse, ConsoleError> {
    let index = ASSETS
        .iter()
        .position(|a| a.name == name.as_str())
        .ok_or(ConsoleError::NotFound)?;
    let (asset, etag) = (&ASSETS[index], &ETAGS[index]);
    let cached = req
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let mut response = match cached {
        true => HttpResponse::NotModified(),
        false => HttpResponse::Ok(),
    };
    response
        .insert_header((header::CACHE_CONTROL, "public, max-age=3600, must-revalidate"))
        .insert_header((header::ETAG, etag.as_str()));
    Ok(match cached {
        true => response.finish(),
        false => response
            .insert_header((header::CONTENT_TYPE, asset.content_type))
            .body(asset.body),
    })
}
