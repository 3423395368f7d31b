//! The payment processor: Stripe's REST API, or an offline simulation for local use.

use std::time::Duration;

use serde_json::Value;

use crate::config::{PaymentSettings, PaymentsMode};
use crate::domain::{Cents, OrgId, PaymentState};

/// A saved card, as shown to users.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Card {
    pub brand: String,
    pub last4: String,
    pub exp_month: i32,
    pub exp_year: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentIntent {
    pub id: String,
    pub status: PaymentState,
    pub client_secret: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum PaymentError {
    #[error("the card was declined: {message}")]
    Declined {
        message: String,
        payment_intent_id: Option<String>,
    },
    #[error("no such payment method or customer")]
    NotFound,
    #[error("payment processor error: {0}")]
    Processor(String),
}

/// The id a declined charge is recorded under: the processor's, else one of keel's own.
pub fn declined_intent_id(processor_id: Option<String>) -> String {
    processor_id.unwrap_or_else(|| format!("declined_{}", uuid::Uuid::new_v4().simple()))
}

pub enum Payments {
    Simulated(Simulated),
    Stripe(StripeClient),
}

/// The offline processor. Like Stripe, it remembers its charges by idempotency key: the
/// same key answers the first charge's result, whatever is asked the second time. (Its
/// answers also follow from the key and the card alone, so a restarted process gives the
/// same answer for the same key and card.)
#[derive(Default)]
pub struct Simulated {
    charges: std::sync::Mutex<std::collections::HashMap<String, Result<PaymentIntent, String>>>,
}

/// What a charge is for; names the payment in the processor and keys its idempotency.
pub struct ChargeRequest<'a> {
    pub org_id: &'a str,
    pub customer_id: &'a str,
    pub payment_method_id: &'a str,
    pub amount: Cents,
    /// `topup` or `auto_topup`.
    pub kind: &'a str,
    pub idempotency_key: &'a str,
}

impl Payments {
    /// `tls`: keel's one TLS configuration (`AppState`).
    pub fn from_settings(settings: &PaymentSettings, tls: &native_tls::TlsConnector) -> anyhow::Result<Self> {
        Ok(match settings.mode {
            PaymentsMode::Simulated => Self::Simulated(Simulated::default()),
            PaymentsMode::Stripe => Self::Stripe(StripeClient::new(
                &settings.stripe_api_url,
                &settings.stripe_secret_key,
                tls,
            )?),
        })
    }

    pub async fn create_customer(&self, org_id: &OrgId) -> Result<String, PaymentError> {
        match self {
            Self::Simulated(_) => Ok(format!("cus_sim_{}", org_id.as_str().replace('-', ""))),
            Self::Stripe(stripe) => {
                let customer = stripe
                    .post(
                        "/v1/customers",
                        &[("metadata[orgId]", org_id.to_string())],
                        &format!("keel-customer-{org_id}"),
                    )
                    .await?;
                string_field(&customer, "id")
            }
        }
    }

    pub async fn create_setup_intent(&self, customer_id: &str) -> Result<String, PaymentError> {
        match self {
            Self::Simulated(_) => {
                let id = uuid::Uuid::new_v4().simple().to_string();
                Ok(format!("seti_sim_{id}_secret_{}", &id[..12]))
            }
            Self::Stripe(stripe) => {
                let intent = stripe
                    .post(
                        "/v1/setup_intents",
                        &[
                            ("customer", customer_id.to_owned()),
                            ("usage", "off_session".into()),
                            ("payment_method_types[]", "card".into()),
                        ],
                        &fresh_key("setup-intent"),
                    )
                    .await?;
                string_field(&intent, "client_secret")
            }
        }
    }

    /// Attaches a payment method to the customer and makes it the default.
    pub async fn attach_payment_method(
        &self,
        customer_id: &str,
        payment_method_id: &str,
    ) -> Result<Card, PaymentError> {
        match self {
            Self::Simulated(_) => match payment_method_id {
                "pm_card_visa" => Ok(simulated_card("4242")),
                "pm_card_chargeDeclined" => Ok(simulated_card("0002")),
                _ => Err(PaymentError::NotFound),
            },
            Self::Stripe(stripe) => {
                let pm = stripe
                    .post(
                        &format!("/v1/payment_methods/{payment_method_id}/attach"),
                        &[("customer", customer_id.to_owned())],
                        &format!("keel-attach-{customer_id}-{payment_method_id}"),
                    )
                    .await?;
                stripe
                    .post(
                        &format!("/v1/customers/{customer_id}"),
                        &[(
                            "invoice_settings[default_payment_method]",
                            payment_method_id.to_owned(),
                        )],
                        &fresh_key("default-pm"),
                    )
                    .await?;
                let card = pm.get("card").cloned().unwrap_or(Value::Null);
                Ok(Card {
                    brand: card["brand"].as_str().unwrap_or("unknown").to_owned(),
                    last4: card["last4"].as_str().unwrap_or("").to_owned(),
                    exp_month: card["exp_month"].as_i64().unwrap_or(0) as i32,
                    exp_year: card["exp_year"].as_i64().unwrap_or(0) as i32,
                })
            }
        }
    }

    pub async fn detach_payment_method(&self, payment_method_id: &str) -> Result<(), PaymentError> {
        match self {
            Self::Simulated(_) => Ok(()),
            Self::Stripe(stripe) => {
                match stripe
                    .post(
                        &format!("/v1/payment_methods/{payment_method_id}/detach"),
                        &[],
                        &fresh_key("detach"),
                    )
                    .await
                {
                    // Already gone is what we wanted.
                    Ok(_) | Err(PaymentError::NotFound) => Ok(()),
                    Err(err) => Err(err),
                }
            }
        }
    }

    /// Deletes the customer; the processor removes its saved payment methods with it.
    pub async fn delete_customer(&self, customer_id: &str) -> Result<(), PaymentError> {
        match self {
            Self::Simulated(_) => Ok(()),
            Self::Stripe(stripe) => match stripe.delete(&format!("/v1/customers/{customer_id}")).await {
                Ok(_) | Err(PaymentError::NotFound) => Ok(()),
                Err(err) => Err(err),
            },
        }
    }

    /// Charges a saved card off-session.
    pub async fn charge(&self, request: ChargeRequest<'_>) -> Result<PaymentIntent, PaymentError> {
        match self {
            Self::Simulated(simulated) => {
                let mut charges = simulated
                    .charges
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                // As Stripe does for a repeated idempotency key: the first charge's answer.
                let id = simulated_intent_id(request.idempotency_key);
                let answer = charges
                    .entry(request.idempotency_key.to_owned())
                    .or_insert_with(|| match request.payment_method_id {
                        "pm_card_chargeDeclined" => Err("Your card was declined.".into()),
                        _ => Ok(PaymentIntent {
                            id: id.clone(),
                            status: PaymentState::Succeeded,
                            client_secret: None,
                        }),
                    })
                    .clone();
                answer.map_err(|message| PaymentError::Declined {
                    message,
                    payment_intent_id: Some(id),
                })
            }
            Self::Stripe(stripe) => {
                let intent = stripe
                    .post(
                        "/v1/payment_intents",
                        &[
                            ("amount", request.amount.get().to_string()),
                            ("currency", "usd".into()),
                            ("customer", request.customer_id.to_owned()),
                            ("payment_method", request.payment_method_id.to_owned()),
                            ("off_session", "true".into()),
                            ("confirm", "true".into()),
                            ("metadata[orgId]", request.org_id.to_owned()),
                            ("metadata[kind]", request.kind.to_owned()),
                        ],
                        request.idempotency_key,
                    )
                    .await?;
                Ok(PaymentIntent {
                    id: string_field(&intent, "id")?,
                    status: PaymentState::parse(intent["status"].as_str().unwrap_or("processing")),
                    client_secret: intent["client_secret"].as_str().map(str::to_owned),
                })
            }
        }
    }
}

/// The simulated processor's payment intent for an idempotency key (one per key).
fn simulated_intent_id(idempotency_key: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(idempotency_key.as_bytes());
    format!("pi_sim_{}", &hex::encode(digest)[..24])
}

fn simulated_card(last4: &str) -> Card {
    Card {
        brand: "visa".into(),
        last4: last4.into(),
        exp_month: 12,
        exp_year: 2034,
    }
}

fn fresh_key(purpose: &str) -> String {
    format!("keel-{purpose}-{}", uuid::Uuid::new_v4())
}

fn string_field(value: &Value, field: &str) -> Result<String, PaymentError> {
    value[field]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| PaymentError::Processor(format!("response without {field}")))
}

/// Stripe's REST API: form-encoded requests, an `Idempotency-Key` on every POST.
pub struct StripeClient {
    http: reqwest::Client,
    base: String,
    secret_key: String,
}

impl StripeClient {
    pub fn new(base: &str, secret_key: &str, tls: &native_tls::TlsConnector) -> anyhow::Result<Self> {
        Ok(Self {
            http: reqwest::Client::builder()
                .use_preconfigured_tls(tls.clone())
                .timeout(Duration::from_secs(30))
                .connect_timeout(Duration::from_secs(5))
                .build()?,
            base: base.trim_end_matches('/').to_owned(),
            secret_key: secret_key.to_owned(),
        })
    }

    async fn post(
        &self,
        path: &str,
        form: &[(&str, String)],
        idempotency_key: &str,
    ) -> Result<Value, PaymentError> {
        let request = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.secret_key)
            .header("Idempotency-Key", idempotency_key)
            .form(form);
        Self::read(request.send().await).await
    }

    async fn delete(&self, path: &str) -> Result<Value, PaymentError> {
        let request = self
            .http
            .delete(format!("{}{path}", self.base))
            .bearer_auth(&self.secret_key);
        Self::read(request.send().await).await
    }

    async fn read(response: Result<reqwest::Response, reqwest::Error>) -> Result<Value, PaymentError> {
        let response = response.map_err(|e| PaymentError::Processor(e.without_url().to_string()))?;
        let status = response.status();
        let body: Value = response
            .json()
            .await
            .map_err(|e| PaymentError::Processor(format!("unreadable response: {}", e.without_url())))?;
        if status.is_success() {
            return Ok(body);
        }
        let error = &body["error"];
        let message = error["message"].as_str().unwrap_or("request failed").to_owned();
        if error["type"] == "card_error" || status.as_u16() == 402 {
            return Err(PaymentError::Declined {
                message,
                payment_intent_id: error["payment_intent"]["id"].as_str().map(str::to_owned),
            });
        }
        if error["code"] == "resource_missing" || status.as_u16() == 404 {
            return Err(PaymentError::NotFound);
        }
        Err(PaymentError::Processor(format!("{status}: {message}")))
    }
}
