//! Body, query and path extractors that answer FastAPI-shaped 422s and a JSON 413.

use actix_web::dev::Payload;
use actix_web::web::{Bytes, BytesMut};
use actix_web::{FromRequest, HttpMessage, HttpRequest};
use futures_util::future::LocalBoxFuture;
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use super::validate::{Checks, Validate};
use crate::error::{ApiError, ApiResult, Code, ValidationIssue};
use crate::state::AppState;
use keel_core::domain::{IdError, OrgId};

const FALLBACK_BODY_LIMIT: usize = 16 * 1024 * 1024;

/// The organization of the API key a request's credential was resolved to (set by the
/// authentication middleware, `auth::authenticate`).
#[derive(Debug, Clone)]
pub struct ApiKeyOrg(pub OrgId);

/// CONTRACT §2: an organization supplied anywhere (query, header, body) that is not the
/// API key's own is 403, whether or not the route reads it. Text as sent: empty or
/// whitespace alone names none; text that is no organization id (NUL) is not the key's.
pub fn check_supplied_orgs<S: AsRef<str>>(
    supplied: impl IntoIterator<Item = S>,
    key_org: &OrgId,
) -> ApiResult<()> {
    let foreign = |raw: &str| match OrgId::parse(raw) {
        Ok(org) => org != *key_org,
        Err(IdError::Empty | IdError::Blank) => false,
        Err(_) => true,
    };
    if supplied.into_iter().any(|raw| foreign(raw.as_ref())) {
        return Err(ApiError::Coded(
            Code::OtherOrganization,
            "the API key belongs to another organization".into(),
        ));
    }
    Ok(())
}

/// A JSON body, deserialized and bounds-checked. An empty body is read as `{}` when
/// every field of `T` is optional, else it is a 422 `missing` at `["body"]`.
pub struct ValidJson<T>(pub T);

impl<T: DeserializeOwned + Validate + utoipa::ToSchema + 'static> FromRequest for ValidJson<T> {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let limit = body_limit(req);
        let declared = declared_length(req);
        let key_org = req.extensions().get::<ApiKeyOrg>().map(|k| k.0.clone());
        let mut payload = payload.take();
        let req = req.clone();
        Box::pin(async move {
            let bytes = read_body(&mut payload, declared, limit).await?;
            let logged = crate::telemetry::writes_request_line(&req);
            if key_org.is_some() || logged {
                // One pass over the body's top level for both.
                let ids = top_level_ids(&bytes);
                if let Some(key_org) = key_org {
                    // Before the body's own checks: a foreign organization is 403 even where
                    // the body has no such field.
                    check_supplied_orgs(&ids.orgs, &key_org)?;
                }
                crate::telemetry::note_worker_and_job(&req, ids.worker_id.as_deref(), ids.job_id.as_deref());
            }
            parse_checked_body(&bytes).map(Self)
        })
    }
}

/// A JSON body deserialized (serde's failures as 422s), bounds-checked, and refused where a
/// string its schema describes holds a character no database stores.
pub fn parse_checked_body<T: DeserializeOwned + Validate + utoipa::ToSchema>(
    bytes: &[u8],
) -> Result<T, ApiError> {
    let value: T = match parse_json_body(bytes) {
        Ok(value) => value,
        // serde stops at the first field it cannot read (an id its type refuses, say): the
        // schema's issues of the other fields are answered beside it, as FastAPI lists all.
        // Where serde lost the field's place (inside a tagged union it names only the body),
        // the schema's issues, which have it, are the answer.
        Err(ApiError::Validation(mut issues)) => {
            if let Ok(json) = serde_json::from_slice::<Value>(bytes) {
                let bounds = super::schemas::bound_issues("body", &T::name(), &json);
                if !bounds.is_empty() && issues.iter().all(|issue| issue.loc == [json!("body")]) {
                    issues.clear();
                }
                for issue in bounds {
                    if !issues.iter().any(|known| known.loc == issue.loc) {
                        issues.push(issue);
                    }
                }
            }
            return Err(ApiError::Validation(issues));
        }
        Err(other) => return Err(other),
    };
    check_parsed(value, bytes)
}

/// A body already deserialized (from `bytes`), held to its own rules and its schema's bounds.
pub fn check_parsed<T: Validate + utoipa::ToSchema>(value: T, bytes: &[u8]) -> Result<T, ApiError> {
    let mut checks = Checks::new("body");
    value.validate(&mut checks);
    let mut issues = checks.into_issues();
    // The schema's bounds, for the fields the body's own rules did not already refuse.
    if let Ok(json) = serde_json::from_slice::<Value>(bytes) {
        for issue in super::schemas::bound_issues("body", &T::name(), &json) {
            if !issues.iter().any(|known| known.loc == issue.loc) {
                issues.push(issue);
            }
        }
    }
    if issues.is_empty() {
        Ok(value)
    } else {
        Err(ApiError::Validation(issues))
    }
}

/// The 422 issue of text at `loc` that is not the id it should be, as FastAPI words it.
pub fn id_issue(loc: Vec<Value>, err: IdError) -> ValidationIssue {
    match err {
        IdError::NotAUuid => ValidationIssue::new(loc, "uuid_parsing", "Input should be a valid UUID"),
        IdError::Blank => ValidationIssue::new(
            loc,
            "string_pattern_mismatch",
            "String should have a character that is not whitespace",
        ),
        IdError::Nul => nul_issue(loc),
        IdError::Empty => {
            ValidationIssue::new(loc, "string_too_short", "String should have at least 1 character")
                .with_ctx(json!({"min_length": 1}))
        }
    }
}

/// The 422 issue of a string holding NUL at `loc`.
pub fn nul_issue(loc: Vec<Value>) -> ValidationIssue {
    ValidationIssue::new(
        loc,
        "string_pattern_mismatch",
        "String should not contain the NUL character (\\u0000)",
    )
}

/// What a JSON object body says at its top level about whose it is, read in one pass: every
/// string `orgId`/`org_id` (repeats included: the API key's check), and the first string
/// `worker_id`/`workerId` and `job_id`/`jobId` (the request's log line). Nothing for a body
/// that is not a JSON object.
#[derive(Debug, Default)]
pub struct TopLevelIds {
    pub orgs: Vec<String>,
    pub worker_id: Option<String>,
    pub job_id: Option<String>,
}

pub fn top_level_ids(bytes: &[u8]) -> TopLevelIds {
    struct Ids;
    impl<'de> serde::de::Visitor<'de> for Ids {
        type Value = TopLevelIds;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object")
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<TopLevelIds, A::Error> {
            let mut ids = TopLevelIds::default();
            while let Some(name) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                let (list, slot) = match name.as_ref() {
                    "orgId" | "org_id" => (true, None),
                    "worker_id" | "workerId" if ids.worker_id.is_none() => (false, Some(&mut ids.worker_id)),
                    "job_id" | "jobId" if ids.job_id.is_none() => (false, Some(&mut ids.job_id)),
                    _ => {
                        map.next_value::<serde::de::IgnoredAny>()?;
                        continue;
                    }
                };
                if let Value::String(value) = map.next_value::<Value>()? {
                    match slot {
                        Some(slot) => *slot = Some(value),
                        None if list => ids.orgs.push(value),
                        None => {}
                    }
                }
            }
            Ok(ids)
        }
    }
    serde::Deserializer::deserialize_map(&mut serde_json::Deserializer::from_slice(bytes), Ids)
        .unwrap_or_default()
}

/// The optional `Idempotency-Key` header: 1 to 200 visible ASCII characters, else a 422
/// naming the header (never silently replaced by a key of keel's own).
pub struct IdempotencyKeyHeader(pub Option<String>);

impl IdempotencyKeyHeader {
    pub const MAX_LEN: usize = 200;

    /// A client's idempotency key (the header's, or the console form's): 1 to
    /// [`Self::MAX_LEN`] visible ASCII characters; else a 422 at `loc`.
    pub fn check(bytes: &[u8], loc: Vec<Value>) -> Result<String, ApiError> {
        if bytes.is_empty() {
            Err(ApiError::Validation(vec![ValidationIssue::new(
                loc,
                "string_too_short",
                "String should have at least 1 character",
            )
            .with_ctx(json!({"min_length": 1}))]))
        } else if bytes.len() > Self::MAX_LEN {
            Err(ApiError::Validation(vec![ValidationIssue::new(
                loc,
                "string_too_long",
                format!("String should have at most {} characters", Self::MAX_LEN),
            )
            .with_ctx(json!({"max_length": Self::MAX_LEN}))]))
        } else if !bytes.iter().all(u8::is_ascii_graphic) {
            Err(ApiError::validation(
                loc,
                "string_pattern_mismatch",
                "String should be visible ASCII characters without spaces",
            ))
        } else {
            Ok(String::from_utf8_lossy(bytes).into_owned())
        }
    }
}

impl FromRequest for IdempotencyKeyHeader {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let Some(value) = req.headers().get("idempotency-key") else {
            return std::future::ready(Ok(Self(None)));
        };
        let loc = vec![json!("header"), json!("Idempotency-Key")];
        let parsed = Self::check(value.as_bytes(), loc).map(|key| Self(Some(key)));
        std::future::ready(parsed)
    }
}

/// The raw body, size-limited (for signatures and pass-through).
pub struct RawBody(pub Bytes);

impl FromRequest for RawBody {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let body = DeferredBody {
            payload: payload.take(),
            declared: declared_length(req),
            limit: body_limit(req),
        };
        Box::pin(async move { Ok(Self(body.read().await?)) })
    }
}

/// The body, not yet read: a handler that checks a credential of its own (the proxy, the
/// relay, the payment webhook's signature) reads it only after that check, so a caller
/// without one never makes keel wait for, or buffer, its body.
pub struct DeferredBody {
    payload: Payload,
    declared: Option<usize>,
    limit: usize,
}

impl FromRequest for DeferredBody {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        std::future::ready(Ok(Self {
            payload: payload.take(),
            declared: declared_length(req),
            limit: body_limit(req),
        }))
    }
}

impl DeferredBody {
    /// Reads the whole body (413 past `server.max_body_bytes`).
    pub async fn read(mut self) -> Result<Bytes, ApiError> {
        read_body(&mut self.payload, self.declared, self.limit).await
    }
}

/// Query parameters, deserialized and bounds-checked.
pub struct ValidQuery<T>(pub T);

impl<T: DeserializeOwned + Validate + 'static> FromRequest for ValidQuery<T> {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        // The bounds the document gives the operation's parameters, for the parameters the
        // query's own rules (or serde, stopping at the first it cannot read) did not already
        // refuse.
        let with_bounds = |mut issues: Vec<ValidationIssue>| {
            let pairs: Vec<(String, String)> = form_urlencoded::parse(req.query_string().as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect();
            let pattern = req.match_pattern().unwrap_or_default();
            for issue in super::schemas::query_issues(req.method().as_str(), &pattern, &pairs) {
                if !issues.iter().any(|known| known.loc == issue.loc) {
                    issues.push(issue);
                }
            }
            issues
        };
        let parsed = match parse_query_issues(req.query_string()) {
            Ok((value, issues)) => {
                let issues = with_bounds(issues);
                if issues.is_empty() {
                    Ok(Self(value))
                } else {
                    Err(ApiError::Validation(issues))
                }
            }
            Err(ApiError::Validation(issues)) => Err(ApiError::Validation(with_bounds(issues))),
            Err(other) => Err(other),
        };
        std::future::ready(parsed)
    }
}

/// A query deserialized and held to its own rules (a query the document does not describe:
/// the console's pages).
pub fn parse_query<T: DeserializeOwned + Validate>(query: &str) -> Result<T, ApiError> {
    let (value, issues) = parse_query_issues(query)?;
    if issues.is_empty() {
        Ok(value)
    } else {
        Err(ApiError::Validation(issues))
    }
}

/// A query deserialized (serde's failures as 422s) with the issues its own rules find.
fn parse_query_issues<T: DeserializeOwned + Validate>(
    query: &str,
) -> Result<(T, Vec<ValidationIssue>), ApiError> {
    let nul: Vec<ValidationIssue> = form_urlencoded::parse(query.as_bytes())
        .filter(|(key, value)| key.contains('\0') || value.contains('\0'))
        .map(|(key, _)| nul_issue(vec![json!("query"), json!(key)]))
        .collect();
    if !nul.is_empty() {
        return Err(ApiError::Validation(nul));
    }
    let de = serde_html_form::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
    let value: T = serde_path_to_error::deserialize(de).map_err(|err| {
        let path = path_segments(err.path());
        let message = err.inner().to_string();
        ApiError::Validation(vec![issue_from_serde_message("query", path, &message)])
    })?;
    let mut checks = Checks::new("query");
    value.validate(&mut checks);
    Ok((value, checks.into_issues()))
}

/// A path parameter that must be a UUID; answers its canonical lowercase form.
pub fn path_uuid(name: &str, raw: &str) -> Result<String, ApiError> {
    uuid::Uuid::parse_str(raw)
        .map(|u| u.hyphenated().to_string())
        .map_err(|_| {
            ApiError::validation(
                vec![json!("path"), json!(name)],
                "uuid_parsing",
                "Input should be a valid UUID",
            )
        })
}

/// A path parameter that must be an organization id (a UUID).
pub fn path_org(name: &str, raw: &str) -> Result<OrgId, ApiError> {
    path_uuid(name, raw)?;
    path_id(name, raw, OrgId::parse)
}

/// A path parameter read by an id's own `parse`; its refusal is the 422 at the parameter.
pub fn path_id<T>(
    name: &str,
    raw: &str,
    parse: impl FnOnce(&str) -> Result<T, IdError>,
) -> Result<T, ApiError> {
    parse(raw).map_err(|err| ApiError::Validation(vec![id_issue(vec![json!("path"), json!(name)], err)]))
}

/// A path parameter with a length bound.
pub fn path_str(name: &str, raw: &str, min: usize, max: usize) -> Result<String, ApiError> {
    let mut checks = Checks::new("path");
    checks.str_len(name, raw, min, max);
    let mut issues = checks.into_issues();
    if raw.contains('\0') {
        issues.push(nul_issue(vec![json!("path"), json!(name)]));
    }
    if issues.is_empty() {
        Ok(raw.to_owned())
    } else {
        Err(ApiError::Validation(issues))
    }
}

fn body_limit(req: &HttpRequest) -> usize {
    req.app_data::<actix_web::web::Data<AppState>>()
        .map(|state| state.settings.server.max_body_bytes)
        .unwrap_or(FALLBACK_BODY_LIMIT)
}

fn declared_length(req: &HttpRequest) -> Option<usize> {
    req.headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// Reads the whole body, refusing (413) anything over `limit` before buffering it.
pub async fn read_body(
    payload: &mut Payload,
    declared: Option<usize>,
    limit: usize,
) -> Result<Bytes, ApiError> {
    let too_large = || ApiError::PayloadTooLarge(format!("request body is larger than {limit} bytes"));
    if declared.is_some_and(|len| len > limit) {
        return Err(too_large());
    }
    let mut body = BytesMut::with_capacity(declared.unwrap_or(0).min(limit));
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| ApiError::BadRequest(format!("could not read request body: {e}")))?;
        if body.len() + chunk.len() > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// Deserializes a JSON body, mapping serde's failures to FastAPI-style issues.
pub fn parse_json_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // No body, or a JSON `null` (a client's "no body"), is the empty object.
    if bytes.iter().all(u8::is_ascii_whitespace) || bytes.trim_ascii() == b"null" {
        return serde_json::from_str::<T>("{}")
            .map_err(|_| ApiError::validation(vec![json!("body")], "missing", "Field required"));
    }
    // Every body is a JSON object; serde would otherwise read a struct from an array.
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|b| matches!(b, b'[' | b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n'))
        && serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok()
    {
        return Err(ApiError::validation(
            vec![json!("body")],
            "model_attributes_type",
            "Input should be a valid dictionary or object to extract fields from",
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = match serde_path_to_error::deserialize(&mut de) {
        Ok(value) => value,
        Err(err) => {
            let inner = err.inner();
            if matches!(
                inner.classify(),
                serde_json::error::Category::Syntax | serde_json::error::Category::Eof
            ) {
                return Err(json_invalid(bytes, inner));
            }
            if inner.to_string().starts_with("invalid type: floating point") {
                return parse_with_integral_floats(bytes);
            }
            let path = path_segments(err.path());
            return Err(ApiError::Validation(vec![issue_from_serde_message(
                "body",
                path,
                &inner.to_string(),
            )]));
        }
    };
    // Trailing garbage after the JSON value is a decode error too.
    de.end().map_err(|err| json_invalid(bytes, &err))?;
    Ok(value)
}

/// As JSON Schema (and FastAPI) count them, `2.0` is an integer: where a field wants an
/// integer and got a number with no fraction, that number is read as the integer. Only such
/// fields change; free-form JSON keeps its numbers as sent.
fn parse_with_integral_floats<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut value: Value = serde_json::from_slice(bytes).map_err(|err| json_invalid(bytes, &err))?;
    loop {
        let err = match serde_path_to_error::deserialize::<_, T>(&value) {
            Ok(parsed) => return Ok(parsed),
            Err(err) => err,
        };
        let message = err.inner().to_string();
        let path = path_segments(err.path());
        let fixed = message.starts_with("invalid type: floating point")
            && slot(&mut value, &path).is_some_and(|number| {
                match number.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15) {
                    Some(f) => {
                        *number = json!(f as i64);
                        true
                    }
                    None => false,
                }
            });
        if !fixed {
            return Err(ApiError::Validation(vec![issue_from_serde_message(
                "body", path, &message,
            )]));
        }
    }
}

/// The value at `path` (object keys and list indexes), if it is a number.
fn slot<'a>(value: &'a mut Value, path: &[Value]) -> Option<&'a mut Value> {
    let mut current = value;
    for segment in path {
        current = match (current, segment) {
            (Value::Object(map), Value::String(key)) => map.get_mut(key)?,
            (Value::Array(items), Value::Number(index)) => {
                items.get_mut(usize::try_from(index.as_u64()?).ok()?)?
            }
            _ => return None,
        };
    }
    current.is_f64().then_some(current)
}

fn json_invalid(bytes: &[u8], err: &serde_json::Error) -> ApiError {
    let offset = byte_offset(bytes, err.line(), err.column());
    ApiError::Validation(vec![ValidationIssue::new(
        vec![json!("body"), json!(offset)],
        "json_invalid",
        "JSON decode error",
    )
    .with_ctx(json!({ "error": strip_position(&err.to_string()) }))])
}

fn byte_offset(bytes: &[u8], line: usize, column: usize) -> usize {
    let mut current_line = 1;
    for (i, b) in bytes.iter().enumerate() {
        if current_line == line {
            return (i + column).saturating_sub(1).min(bytes.len());
        }
        if *b == b'\n' {
            current_line += 1;
        }
    }
    bytes.len()
}

fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(idx) => message[..idx].to_owned(),
        None => message.to_owned(),
    }
}

fn path_segments(path: &serde_path_to_error::Path) -> Vec<Value> {
    use serde_path_to_error::Segment;
    path.iter()
        .filter_map(|segment| match segment {
            Segment::Seq { index } => Some(json!(index)),
            Segment::Map { key } => Some(json!(key)),
            Segment::Enum { variant } => Some(json!(variant)),
            Segment::Unknown => None,
        })
        .collect()
}

/// Text between the first pair of backticks: serde names fields and variants that way.
fn backticked(message: &str) -> Option<&str> {
    let start = message.find('`')? + 1;
    let end = message[start..].find('`')? + start;
    Some(&message[start..end])
}

/// Turns one of serde's messages into a FastAPI-shaped issue at `root + path`.
fn issue_from_serde_message(root: &str, path: Vec<Value>, message: &str) -> ValidationIssue {
    let message = strip_position(message);
    let mut loc = vec![json!(root)];
    loc.extend(path);
    let push_field = |loc: &mut Vec<Value>, field: &str| {
        if loc.last() != Some(&json!(field)) {
            loc.push(json!(field));
        }
    };
    // A typed id refused by its own parse (the same words as the schema's issue).
    if let Some(err) = [IdError::NotAUuid, IdError::Blank, IdError::Nul, IdError::Empty]
        .into_iter()
        .find(|err| message == err.to_string())
    {
        return id_issue(loc, err);
    }
    if message.starts_with("missing field") {
        if let Some(field) = backticked(&message) {
            push_field(&mut loc, field);
        }
        return ValidationIssue::new(loc, "missing", "Field required");
    }
    if message.starts_with("unknown field") {
        if let Some(field) = backticked(&message) {
            push_field(&mut loc, field);
        }
        return ValidationIssue::new(loc, "extra_forbidden", "Extra inputs are not permitted");
    }
    if message.starts_with("unknown variant") {
        let expected = message.split("expected ").nth(1).unwrap_or("").to_owned();
        return ValidationIssue::new(loc, "literal_error", format!("Input should be {expected}"))
            .with_ctx(json!({ "expected": expected }));
    }
    if message.starts_with("duplicate field") {
        return ValidationIssue::new(loc, "value_error", message);
    }
    let expected = message.rsplit("expected ").next().unwrap_or("");
    let (kind, msg) = if message.starts_with("invalid type") || message.starts_with("invalid value") {
        expected_kind(expected)
    } else if message.contains("invalid digit") || message.contains("cannot parse integer") {
        (
            "int_parsing",
            "Input should be a valid integer, unable to parse string as an integer",
        )
    } else if message.contains("invalid float") {
        (
            "float_parsing",
            "Input should be a valid number, unable to parse string as a number",
        )
    } else if message.contains("provided string was not `true` or `false`") {
        (
            "bool_parsing",
            "Input should be a valid boolean, unable to interpret input",
        )
    } else {
        ("value_error", "")
    };
    let msg = if msg.is_empty() {
        message.clone()
    } else {
        msg.to_owned()
    };
    ValidationIssue::new(loc, kind, msg)
}

fn expected_kind(expected: &str) -> (&'static str, &'static str) {
    let expected = expected.trim();
    if expected.contains("string") || expected == "a character" {
        ("string_type", "Input should be a valid string")
    } else if [
        "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "usize", "isize",
    ]
    .contains(&expected)
        || expected.contains("integer")
    {
        ("int_type", "Input should be a valid integer")
    } else if expected == "f64" || expected == "f32" || expected.contains("number") {
        ("float_type", "Input should be a valid number")
    } else if expected.contains("boolean") {
        ("bool_type", "Input should be a valid boolean")
    } else if expected.contains("sequence") {
        ("list_type", "Input should be a valid list")
    } else if expected == "a map" {
        ("dict_type", "Input should be a valid dictionary")
    } else if expected.contains("map") || expected.contains("struct") || expected.contains("object") {
        (
            "model_type",
            "Input should be a valid dictionary or object to extract fields from",
        )
    } else {
        ("value_error", "Input is not valid")
    }
}

/// For `#[serde(default, deserialize_with = "present")]` on an `Option<Option<T>>` field:
/// absent is `None`, `null` is `Some(None)`, a value is `Some(Some(v))`, so a partial update
/// can tell "leave it" from "clear it".
pub fn present<'de, D, T>(de: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    <Option<T> as serde::Deserialize>::deserialize(de).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        name: String,
        limit: Option<i64>,
        items: Option<Vec<Item>>,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Item {
        step: i64,
    }

    fn issues(raw: &str) -> Vec<ValidationIssue> {
        match parse_json_body::<Body>(raw.as_bytes()) {
            Err(ApiError::Validation(issues)) => issues,
            other => panic!("expected a validation error, got {other:?}"),
        }
    }

    #[test]
    fn missing_field_points_at_the_field() {
        let issue = &issues("{}")[0];
        assert_eq!(issue.kind, "missing");
        assert_eq!(issue.loc, vec![json!("body"), json!("name")]);
    }

    #[test]
    fn unknown_field_is_extra_forbidden() {
        let issue = &issues(r#"{"name":"a","bogus":1}"#)[0];
        assert_eq!(issue.kind, "extra_forbidden");
        assert_eq!(issue.loc, vec![json!("body"), json!("bogus")]);
    }

    #[test]
    fn wrong_types_name_the_expected_type() {
        assert_eq!(issues(r#"{"name":5}"#)[0].kind, "string_type");
        let issue = &issues(r#"{"name":"a","limit":"x"}"#)[0];
        assert_eq!(issue.kind, "int_type");
        assert_eq!(issue.loc, vec![json!("body"), json!("limit")]);
        let nested = &issues(r#"{"name":"a","items":[{"step":1},{"step":"no"}]}"#)[0];
        assert_eq!(
            nested.loc,
            vec![json!("body"), json!("items"), json!(1), json!("step")]
        );
    }

    #[test]
    fn malformed_json_is_json_invalid() {
        let issue = &issues(r#"{"name": "#)[0];
        assert_eq!(issue.kind, "json_invalid");
        assert_eq!(issue.loc[0], json!("body"));
        assert_eq!(issues(r#"{"name":"a"} trailing"#)[0].kind, "json_invalid");
    }

    #[test]
    fn empty_body_is_missing_unless_everything_is_optional() {
        let issue = &issues("")[0];
        assert_eq!(issue.kind, "missing");
        assert_eq!(issue.loc, vec![json!("body")]);
        #[derive(Deserialize)]
        struct AllOptional {
            #[allow(dead_code)]
            name: Option<String>,
        }
        assert!(parse_json_body::<AllOptional>(b"").is_ok());
    }
}
