//! Every machine code an error keel produces carries, with its status: the one table. The
//! OpenAPI document's `ErrorCode` schema is this enum, and the README lists it (a test checks
//! both). A provider's error that the proxy relays keeps its own body and codes.

use actix_web::http::StatusCode;

/// Declares [`Code`] from `Variant = ("code", status, "what it means")` lines.
macro_rules! error_codes {
    ($( $variant:ident = ($name:literal, $status:literal, $meaning:literal) ),+ $(,)?) => {
        /// A stable machine code: what went wrong, whatever the words of `detail`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, utoipa::ToSchema)]
        #[schema(as = ErrorCode)]
        #[serde(rename_all = "snake_case")]
        pub enum Code {
            $( #[doc = $meaning] $variant ),+
        }

        impl Code {
            /// Every code, in the table's order.
            pub const ALL: &'static [Code] = &[$(Code::$variant),+];

            pub const fn as_str(self) -> &'static str {
                match self { $(Code::$variant => $name),+ }
            }

            /// The status an answer with this code has.
            pub fn status(self) -> StatusCode {
                let status = match self { $(Code::$variant => $status),+ };
                StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
            }

            /// What the code means, in a line (the README's table).
            pub const fn meaning(self) -> &'static str {
                match self { $(Code::$variant => $meaning),+ }
            }
        }
    };
}

error_codes! {
    ValidationFailed = ("validation_failed", 422, "A value is missing, of the wrong type or out of its bounds; `detail` lists each (FastAPI's shape)."),
    BadRequest = ("bad_request", 400, "The request cannot be read (its body, a form, a header)."),
    MissingHeader = ("missing_header", 400, "A header the route needs is absent (the proxy's X-Service-Provider, X-Service-Provider-Key, X-Service-Project-Id)."),
    InvalidHeader = ("invalid_header", 400, "A header's value is not one the route takes (an unknown provider, a key that is not a header value)."),
    InvalidSignature = ("invalid_signature", 400, "A processor webhook's signature is missing, malformed, stale or wrong."),
    InvalidEvent = ("invalid_event", 400, "A processor webhook's event is not one keel can read."),
    Unauthenticated = ("unauthenticated", 401, "No valid credential: the bearer token is missing, unknown, revoked or expired."),
    InvalidApiKey = ("invalid_api_key", 401, "The API key presented (to the proxy, the relay or serving authorize) is not a valid keel key."),
    InsufficientBalance = ("insufficient_balance", 402, "The organization's balance cannot pay for this."),
    CardDeclined = ("card_declined", 402, "The processor declined the card (now, or on the first attempt with this Idempotency-Key)."),
    CannotCoverEstimate = ("cannot_cover_estimate", 402, "Neither the balance nor a card with auto top-up can cover the training estimate."),
    Forbidden = ("forbidden", 403, "The credential may not do this."),
    InternalKeyRequired = ("internal_key_required", 403, "The route takes the operator's internal key."),
    OwnerRequired = ("owner_required", 403, "The route takes an owner of the organization."),
    NotAMember = ("not_a_member", 403, "The caller is not a member of the organization named."),
    OtherOrganization = ("other_organization", 403, "An API key named an organization other than its own."),
    ScopeNotAllowed = ("scope_not_allowed", 403, "The API key's scopes do not cover this route (`inference`: the proxy, the relay, serving authorize; `api`: everything else)."),
    ModelNotAllowed = ("model_not_allowed", 403, "The API key's `models` list does not hold the model the call names (or the call names none keel can read)."),
    AdapterNotOwned = ("adapter_not_owned", 403, "The API key's organization does not own the adapter."),
    NotFound = ("not_found", 404, "No such route or resource (or another organization's)."),
    OrganizationNotFound = ("organization_not_found", 404, "No such organization."),
    ProjectNotFound = ("project_not_found", 404, "No such project in the caller's organizations (or not active, for the control plane)."),
    JobNotFound = ("job_not_found", 404, "No such job in the caller's organizations."),
    TraceNotFound = ("trace_not_found", 404, "No such trace in the caller's organizations."),
    RunNotFound = ("run_not_found", 404, "No such run in the caller's organizations."),
    AdapterNotFound = ("adapter_not_found", 404, "No such adapter, and no priced base model of that name."),
    ApiKeyNotFound = ("api_key_not_found", 404, "No such API key in the organization."),
    PaymentMethodNotFound = ("payment_method_not_found", 404, "No saved card, or the processor does not know the payment method."),
    PromoCodeNotFound = ("promo_code_not_found", 404, "No such promo code."),
    ModelNotPriced = ("model_not_priced", 404, "The model has no price in the configuration."),
    EnvironmentNotFound = ("environment_not_found", 404, "No such environment in the project."),
    DatasetNotFound = ("dataset_not_found", 404, "No such dataset (or version of it) in the caller's organizations."),
    ScheduleNotFound = ("schedule_not_found", 404, "No such schedule in the caller's organizations."),
    DependencyNotFound = ("dependency_not_found", 404, "A job named in `dependsOn` is not one of the organization's (the message names it, and the batch item)."),
    MethodNotAllowed = ("method_not_allowed", 405, "The path does not take this method (`Allow` lists those it does)."),
    RequestTimeout = ("request_timeout", 408, "The request's body did not arrive within `server.body_timeout_secs`."),
    Conflict = ("conflict", 409, "The request conflicts with the resource's state."),
    SlugTaken = ("slug_taken", 409, "The slug is taken (or no free one was found)."),
    IdempotencyKeyReused = ("idempotency_key_reused", 409, "The Idempotency-Key was used for another request (another amount)."),
    AlreadyApplied = ("already_applied", 409, "This change was applied before (a starter credit, a promo code, a ledger key)."),
    PaymentMethodRequired = ("payment_method_required", 409, "Save a card first (top-up, auto top-up)."),
    AdapterOrganizationMismatch = ("adapter_organization_mismatch", 409, "The orgId given is not the adapter's owner."),
    JobEnded = ("job_ended", 409, "The job already ended."),
    JobNotHeld = ("job_not_held", 409, "The worker does not hold the job (it was requeued or reclaimed)."),
    JobNotRetryable = ("job_not_retryable", 409, "Only a failed, blocked or user-stopped job can be retried (a cancelled one runs again when the dependency that cancelled it is retried; one whose uniqueKey another open job holds, once that job is done)."),
    DatasetNameTaken = ("dataset_name_taken", 409, "The project has a dataset of this name."),
    DatasetInUse = ("dataset_in_use", 409, "A job that is not over trains on the dataset."),
    ScheduleLimitReached = ("schedule_limit_reached", 409, "The organization has 100 schedules, as many as it may have."),
    EndpointLimitReached = ("endpoint_limit_reached", 409, "The organization has as many webhook endpoints as `webhooks.max_endpoints_per_org` (20) allows."),
    DeliveryInFlight = ("delivery_in_flight", 409, "The webhook delivery is being sent right now; retry it once its attempt is recorded."),
    MirrorConflict = ("mirror_conflict", 409, "A mirrored record belongs to another organization or project, or changed meanwhile; retry."),
    PayloadTooLarge = ("payload_too_large", 413, "The body is larger than the route takes."),
    UriTooLong = ("uri_too_long", 414, "The request's path and query are longer than keel reads (16 KiB)."),
    RateLimitExceeded = ("rate_limit_exceeded", 429, "The API key is over one of its limits (requestsPerMinute, tokensPerDay, concurrentStreams), or a route's own rate is passed (a webhook endpoint's test deliveries: 10 a minute); `Retry-After` says when to try again."),
    InternalError = ("internal_error", 500, "Something unexpected failed; the log has the cause."),
    ServingNotConfigured = ("serving_not_configured", 500, "Sampling: no serving layer is configured (`POST /api/sample`'s `error`)."),
    ServingUnreachable = ("serving_unreachable", 500, "Sampling: the serving layer could not be reached."),
    ServingTimeout = ("serving_timeout", 500, "Sampling: the serving layer did not answer in time."),
    ServingError = ("serving_error", 500, "Sampling: the serving layer answered an error status."),
    ServingBadResponse = ("serving_bad_response", 500, "Sampling: the serving layer's answer could not be read."),
    UpstreamUnreachable = ("upstream_unreachable", 502, "The proxy could not reach the provider, or the call broke."),
    PaymentProcessorUnavailable = ("payment_processor_unavailable", 502, "The payment processor did not answer clearly; the charge is settled later."),
    StreamInterrupted = ("stream_interrupted", 502, "A streamed answer failed in its middle (sent as the stream's last event, the status already 200)."),
    Unavailable = ("unavailable", 503, "keel cannot serve this right now (the database, the queue, shutting down); retry."),
    BalanceLocked = ("balance_locked", 503, "Another session holds the organization's balance; retry with the same Idempotency-Key."),
    LedgerUnavailable = ("ledger_unavailable", 503, "The ledger cannot write right now; retry with the same Idempotency-Key."),
    SecretsNotConfigured = ("secrets_not_configured", 503, "Storing secrets needs secrets.encryption_key or KEEL_SESSION_SECRET."),
    ServingLayerNotConfigured = ("serving_layer_not_configured", 503, "An organization's live adapters need a serving layer to undeploy them (KEEL_SERVING_URL)."),
    UpstreamTimeout = ("upstream_timeout", 504, "The provider did not answer in time."),
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::Code;

    #[test]
    fn every_code_is_snake_case_unique_and_serializes_as_its_name() {
        let mut seen = std::collections::BTreeSet::new();
        for code in Code::ALL {
            let name = code.as_str();
            assert!(seen.insert(name), "{name} twice");
            assert!(name.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{name}");
            assert_eq!(serde_json::to_value(code).ok(), Some(serde_json::json!(name)));
            assert!(
                code.status().is_client_error() || code.status().is_server_error(),
                "{name}"
            );
        }
    }
}
