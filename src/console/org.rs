//! An organization's money and people: overview (balance, card, top-ups, spend), ledger,
//! API keys and members.

use actix_web::{web, HttpRequest, HttpResponse};
use chrono::Utc;
use entities::ledger_entry;
use serde::Deserialize;

use super::chart::{self, Series};
use super::pages::{
    CreditRow, CreditsPage, GrantRow, KeyDraft, KeyRow, KeysPage, Layout, LedgerPage, LedgerRow, MemberRow,
    OverviewPage, UsageRow,
};
use super::session::{OrgView, Viewer};
use super::{after_form, confirm_page, format, page, redirect, Confirm, ConsoleError, Flash, FormFields};
use crate::billing::dto::{AutoTopupBody, PaymentMethodBody, PromoCodeBody, TopupBody};
use crate::error::ApiError;
use keel_core::billing::ledger::EntryKind;
use keel_core::billing::service;
use keel_core::domain::{Microcents, OrgId, PaymentState};

/// Days the spend chart and the usage table cover.
const PERIOD_DAYS: i64 = 30;
/// Ledger entries per page.
const LEDGER_PAGE: u64 = 50;

/// The frame of an organization's page, with the organization's name.
pub(super) async fn org_layout(
    viewer: &Viewer,
    org: &OrgView,
    title: &str,
    active: &'static str,
    req: &HttpRequest,
) -> Result<Layout, ConsoleError> {
    let name = match keel_core::orgs::service::org(&viewer.state.db, &org.org_id).await {
        Ok(found) => found.name,
        Err(keel_core::orgs::OrgError::OrgNotFound) => String::new(),
        Err(err) => return Err(err.into()),
    };
    Ok(Layout::new(title, viewer, active, Flash::read(req)).with_org(org, name))
}

fn ledger_row(e: &ledger_entry::Model) -> LedgerRow {
    LedgerRow {
        at: format::time(e.created_at),
        kind: e.kind.to_string(),
        amount: format::dollars(e.amount_microcents),
        amount_exact: format::exact(e.amount_microcents),
        credit: e.amount_microcents > Microcents::ZERO,
        balance_after: format::dollars(e.balance_after_microcents),
        reason: e.reason.clone(),
        key: e.idempotency_key.clone().unwrap_or_default(),
    }
}

/// A grant's kind as the overview names it.
fn credit_kind(kind: keel_core::domain::GrantKind) -> &'static str {
    use keel_core::domain::GrantKind as K;
    match kind {
        K::Starter => "starter credit",
        K::Promo => "promotional credit",
        K::Topup => "top-up",
        K::AutoTopup => "auto top-up",
        K::Manual => "credit granted by keel",
        K::Refund => "refund",
        K::Migrated => "balance before credit grants",
    }
}

/// When a grant expires, as the overview says it.
fn expiry_of(at: Option<chrono::DateTime<chrono::Utc>>, now: chrono::DateTime<chrono::Utc>) -> String {
    match at {
        Some(at) if at > now => format!("expires in {} ({})", format::age(at - now), format::time(at)),
        Some(at) => format!("expired {} (being swept)", format::time(at)),
        None => "never expires".to_owned(),
    }
}

/// Credit groups the overview shows at most (the credits page lists every grant).
const CREDIT_GROUPS: usize = 6;

/// The active grants grouped by kind and day of expiry, in draw order (a group where its
/// first grant is drawn): one line for twelve top-ups that never expire, not twelve.
fn credit_groups(
    grants: &[entities::credit_grant::Model],
    now: chrono::DateTime<chrono::Utc>,
) -> Vec<CreditRow> {
    let mut groups: Vec<(
        keel_core::domain::GrantKind,
        Option<chrono::NaiveDate>,
        Vec<&entities::credit_grant::Model>,
    )> = Vec::new();
    for grant in grants {
        let day = grant.expires_at.map(|at| at.date_naive());
        match groups
            .iter_mut()
            .find(|(kind, d, _)| *kind == grant.kind && *d == day)
        {
            Some((_, _, members)) => members.push(grant),
            None => groups.push((grant.kind, day, vec![grant])),
        }
    }
    groups
        .into_iter()
        .take(CREDIT_GROUPS)
        .map(|(kind, _, members)| {
            let left = Microcents(members.iter().map(|g| g.remaining_microcents.0).sum());
            let soonest = members.iter().filter_map(|g| g.expires_at).min();
            CreditRow {
                left: format::dollars(left),
                left_exact: format::exact(left),
                kind: match members.len() {
                    1 => credit_kind(kind).to_owned(),
                    n => format!("{} ({n} grants)", credit_kind(kind)),
                },
                expires: expiry_of(soonest, now),
            }
        })
        .collect()
}

#[derive(Deserialize, Default)]
pub struct CreditsQuery {
    /// `active` (something left), `ended` (spent or expired); none: every grant.
    state: Option<String>,
}

/// Every credit grant of the organization: the active ones in draw order, then the ended.
pub async fn credits(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<String>,
    query: web::Query<CreditsQuery>,
) -> Result<HttpResponse, ConsoleError> {
    let org = viewer.org(&path).await?;
    let state = match query.state.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
        None => None,
        Some(s @ ("active" | "ended")) => Some(s.to_owned()),
        Some(other) => {
            return Err(super::unknown_choice(
                "state",
                other,
                ["active", "ended"].into_iter(),
            ))
        }
    };
    let now = chrono::Utc::now();
    let grants = service::grants(&viewer.state.billing, &org.org_id).await?;
    let rows: Vec<GrantRow> = grants
        .iter()
        .map(|g| {
            let active = g.remaining_microcents.0 > 0
                && g.expired_at.is_none()
                && g.expires_at.is_none_or(|at| at > now);
            GrantRow {
                created: format::time(g.created_at),
                kind: credit_kind(g.kind).to_owned(),
                granted: format::dollars(g.original_microcents),
                left: format::dollars(g.remaining_microcents),
                left_exact: format::exact(g.remaining_microcents),
                state: match (active, g.expired_at) {
                    (true, _) => "active",
                    (false, Some(_)) => "expired",
                    (false, None) if g.remaining_microcents.0 <= 0 => "spent",
                    (false, None) => "expired",
                },
                expires: expiry_of(g.expires_at, now),
                reason: g.reason.clone(),
            }
        })
        .filter(|row| match state.as_deref() {
            Some("active") => row.state == "active",
            Some(_) => row.state != "active",
            None => true,
        })
        .collect();
    let l = org_layout(&viewer, &org, "Credits", "overview", &req).await?;
    Ok(page(
        &req,
        &CreditsPage {
            l,
            total: format::count(rows.len() as i64),
            state: state.unwrap_or_default(),
            rows,
        },
    ))
}

pub async fn overview(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<String>,
) -> Result<HttpResponse, ConsoleError> {
    let org = viewer.org(&path).await?;
    let l = org_layout(&viewer, &org, "Overview", "overview", &req).await?;
    let state = &viewer.state;
    let service::Overview {
        account,
        recent,
        grants,
        auto_topup_charged,
    } = service::overview(&state.billing, &org.org_id).await?;
    let now = chrono::Utc::now();
    let grant_count = grants.len();
    let credits = credit_groups(&grants, now);
    let spent = service::spending(&state.billing, &org.org_id, PERIOD_DAYS).await?;
    let series = [
        Series {
            name: "serving usage",
            class: "s-serving",
            values: spent.serving,
        },
        Series {
            name: "training",
            class: "s-training",
            values: spent.training,
        },
        Series {
            name: "run fees",
            class: "s-fees",
            values: spent.fees,
        },
    ];
    // Every seventh day and the last are labelled under the axis (as MM-DD).
    let axis: Vec<String> = spent
        .days
        .iter()
        .enumerate()
        .map(|(d, day)| match d % 7 == 0 || d + 1 == spent.days.len() {
            true => day.get(5..).unwrap_or(day).to_owned(),
            false => String::new(),
        })
        .collect();
    let chart = chart::stacked_bars(
        "Debits per day, stacked by kind; credits marked",
        &spent.days,
        &axis,
        &series,
        &spent.credits,
        |v| format::dollars(Microcents(v)),
    );
    let usage = spent
        .usage
        .into_iter()
        .map(|u| UsageRow {
            model: u.model,
            requests: u.requests,
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            charged: format::dollars(u.charged),
        })
        .collect();
    let balance = account.balance_microcents;
    let card = match (&account.payment_method_id, &account.pm_brand, &account.pm_last4) {
        (Some(_), Some(brand), Some(last4)) => Some(format!(
            "{brand} ending in {last4}, expires {:02}/{}",
            account.pm_exp_month.unwrap_or(0),
            account.pm_exp_year.unwrap_or(0)
        )),
        _ => None,
    };
    let simulated = state.settings.payments.mode == keel_core::config::PaymentsMode::Simulated;
    Ok(page(
        &req,
        &OverviewPage {
            l,
            balance: format::dollars(balance),
            balance_exact: format::exact(balance),
            card,
            auto_enabled: account.auto_topup_enabled,
            auto_paused: account.auto_topup_declines >= keel_core::billing::ledger::MAX_AUTO_TOPUP_DECLINES,
            auto_threshold: account
                .auto_topup_threshold_cents
                .map(|c| c.to_string())
                .unwrap_or_default(),
            auto_amount: account
                .auto_topup_amount_cents
                .map(|c| c.to_string())
                .unwrap_or_default(),
            auto_limit: account
                .auto_topup_monthly_limit_cents
                .map(|c| c.to_string())
                .unwrap_or_default(),
            auto_limit_money: account
                .auto_topup_monthly_limit_cents
                .map(|c| format::cents(c.get()))
                .unwrap_or_default(),
            auto_charged: format::cents(auto_topup_charged.get()),
            credits,
            grant_count,
            starter_granted: account.starter_credit_granted,
            starter_amount: format::cents(state.settings.billing.starter_credit_cents.get()),
            chart_summary: format!(
                "Last {PERIOD_DAYS} days: {} debited, {} credited.",
                format::dollars(Microcents(spent.debited)),
                format::dollars(Microcents(spent.credited))
            ),
            chart,
            usage,
            recent: recent.iter().map(ledger_row).collect(),
            topup_key: uuid::Uuid::new_v4().to_string(),
            test_cards: match simulated {
                true => vec![
                    ("pm_card_visa", "Visa 4242 (succeeds)"),
                    ("pm_card_chargeDeclined", "Visa 0002 (declined at charge)"),
                ],
                false => Vec::new(),
            },
        },
    ))
}

fn back_to_overview(org: &OrgView) -> String {
    format!("/console/o/{}", org.org_id)
}

pub async fn save_card(
    viewer: Viewer,
    path: web::Path<String>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let form = FormFields::parse(&body);
    let org = viewer.act_in(&path, &form.csrf, false).await?;
    let outcome = async {
        let body: PaymentMethodBody = form.body(&org.org_id)?;
        Ok::<_, ApiError>(
            service::save_payment_method(&viewer.state.billing, &org.org_id, &body.payment_method_id).await?,
        )
    }
    .await;
    after_form(&back_to_overview(&org), outcome, |card| {
        format!("Card saved: {} ending in {}.", card.brand, card.last4)
    })
}

pub async fn remove_card(
    viewer: Viewer,
    path: web::Path<String>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let form = FormFields::parse(&body);
    let org = viewer.act_in(&path, &form.csrf, false).await?;
    let outcome = service::delete_payment_method(&viewer.state.billing, &org.org_id).await;
    after_form(&back_to_overview(&org), outcome, |auto_off| match auto_off {
        true => "Card removed; auto top-up is now off.".into(),
        false => "Card removed.".into(),
    })
}

pub async fn auto_topup(
    viewer: Viewer,
    path: web::Path<String>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let form = FormFields::parse(&body);
    let org = viewer.act_in(&path, &form.csrf, false).await?;
    let outcome = async {
        let body: AutoTopupBody = form.body(&org.org_id)?;
        service::set_auto_topup(&viewer.state.billing, &org.org_id, body.settings()).await?;
        Ok::<_, ApiError>(body.enabled)
    }
    .await;
    after_form(&back_to_overview(&org), outcome, |enabled| match enabled {
        true => "Auto top-up is on.".into(),
        false => "Auto top-up is off.".into(),
    })
}

pub async fn topup(
    viewer: Viewer,
    path: web::Path<String>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let form = FormFields::parse(&body);
    let org = viewer.act_in(&path, &form.csrf, false).await?;
    // The form's own key: submitting it twice charges once.
    let key = form.get("idempotencyKey").map(str::to_owned);
    let fields = FormFields {
        csrf: String::new(),
        fields: form
            .fields
            .iter()
            .filter(|(n, _)| n != "idempotencyKey")
            .cloned()
            .collect(),
    };
    let outcome = async {
        // A hidden field, but what arrives is the client's: checked as the header is.
        let key = key
            .map(|k| {
                crate::http::extract::IdempotencyKeyHeader::check(
                    k.as_bytes(),
                    vec![serde_json::json!("form"), serde_json::json!("idempotencyKey")],
                )
            })
            .transpose()?;
        let body: TopupBody = fields.body(&org.org_id)?;
        Ok::<_, ApiError>(
            service::topup(
                &viewer.state.billing,
                &org.org_id,
                body.amount_cents,
                key.as_deref(),
            )
            .await?,
        )
    }
    .await;
    after_form(&back_to_overview(&org), outcome, |topup| match &topup.status {
        PaymentState::Succeeded => format!(
            "Top-up succeeded; the balance is {}.",
            format::dollars(topup.balance)
        ),
        other => format!("Top-up {other}; it is credited once the payment settles."),
    })
}

pub async fn promo(
    viewer: Viewer,
    path: web::Path<String>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let form = FormFields::parse(&body);
    let org = viewer.act_in(&path, &form.csrf, false).await?;
    let outcome = async {
        let body: PromoCodeBody = form.body(&org.org_id)?;
        Ok::<_, ApiError>(service::redeem_promo(&viewer.state.billing, &org.org_id, &body.code).await?)
    }
    .await;
    after_form(&back_to_overview(&org), outcome, |promo| {
        format!(
            "Promo code redeemed: {} credited.",
            format::cents(promo.credited.get())
        )
    })
}

pub async fn starter_credit(
    viewer: Viewer,
    path: web::Path<String>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let form = FormFields::parse(&body);
    let org = viewer.act_in(&path, &form.csrf, false).await?;
    let outcome = service::grant_starter_credit(&viewer.state.billing, &org.org_id).await;
    after_form(&back_to_overview(&org), outcome, |(credited, _)| {
        format!(
            "Starter credit granted: {} credited.",
            format::cents(credited.get())
        )
    })
}

#[derive(Deserialize)]
pub struct LedgerQuery {
    kind: Option<String>,
    before: Option<i64>,
    /// The statement's month, `YYYY-MM` (default: this one).
    month: Option<String>,
}

pub async fn ledger(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<String>,
    query: web::Query<LedgerQuery>,
) -> Result<HttpResponse, ConsoleError> {
    let org = viewer.org(&path).await?;
    let l = org_layout(&viewer, &org, "Ledger", "ledger", &req).await?;
    let kind = match query.kind.as_deref().filter(|k| !k.is_empty()) {
        None => None,
        Some(k) => Some(
            EntryKind::ALL
                .iter()
                .find(|e| e.as_str() == k)
                .map(|e| e.as_str())
                .ok_or_else(|| super::unknown_choice("kind", k, EntryKind::ALL.iter().map(|e| e.as_str())))?,
        ),
    };
    let month = match query.month.as_deref().filter(|m| !m.is_empty()) {
        None => chrono::Utc::now().format("%Y-%m").to_string(),
        Some(m) if keel_core::billing::statement::month_bounds(m).is_some() => m.to_owned(),
        Some(_) => return Err(super::unreadable("month")),
    };
    let statement =
        keel_core::billing::statement::statement(&viewer.state.billing, &org.org_id, &month).await?;
    let total = service::ledger_count(&viewer.state.billing, &org.org_id, kind).await?;
    let mut entries = service::ledger_page(
        &viewer.state.billing,
        &org.org_id,
        kind,
        query.before,
        LEDGER_PAGE + 1,
    )
    .await?;
    let next = (entries.len() as u64 > LEDGER_PAGE).then(|| {
        entries.truncate(LEDGER_PAGE as usize);
        let last = entries.last().map_or(0, |e| e.id);
        let mut link = form_urlencoded::Serializer::new(String::new());
        if let Some(kind) = kind {
            link.append_pair("kind", kind);
        }
        link.append_pair("before", &last.to_string());
        format!("/console/o/{}/ledger?{}", org.org_id, link.finish())
    });
    Ok(page(
        &req,
        &LedgerPage {
            l,
            kinds: EntryKind::ALL.iter().map(|k| k.as_str()).collect(),
            kind: kind.unwrap_or_default().to_owned(),
            entries: entries.iter().map(ledger_row).collect(),
            total: format::count(i64::try_from(total).unwrap_or(i64::MAX)),
            next,
            statement: statement_rows(&statement),
            month,
        },
    ))
}

/// A statement as the ledger page lists it: (what, amount, exact amount).
fn statement_rows(s: &keel_core::billing::statement::Statement) -> Vec<(String, String, String)> {
    let money = |v: i64| (format::dollars(Microcents(v)), format::exact(Microcents(v)));
    let mut rows = Vec::new();
    let mut push = |what: String, v: i64| {
        let (shown, exact) = money(v);
        rows.push((what, shown, exact));
    };
    push("Opening balance".into(), s.opening);
    for (kind, v) in &s.credits {
        push(format!("Credits: {kind}"), *v);
    }
    for (kind, v) in &s.debits {
        push(format!("Debits: {kind}"), -*v);
    }
    push("Expired credit".into(), -s.expired);
    push("Closing balance".into(), s.closing);
    rows
}

#[derive(Deserialize)]
pub struct CsvQuery {
    from: Option<String>,
    to: Option<String>,
}

/// The ledger as CSV (what `GET /api/billing/ledger.csv` streams), for the page's download.
pub async fn ledger_csv(
    viewer: Viewer,
    path: web::Path<String>,
    query: web::Query<CsvQuery>,
) -> Result<HttpResponse, ConsoleError> {
    let org = viewer.org(&path).await?;
    let bound = |value: &Option<String>, name: &str| match value.as_deref().filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => crate::billing::dto::instant(v)
            .map(Some)
            .ok_or_else(|| super::unreadable(name)),
    };
    let (from, to) = (bound(&query.from, "from")?, bound(&query.to, "to")?);
    Ok(crate::billing::export::ledger_csv(
        &viewer.state.billing,
        org.org_id,
        from,
        to,
    ))
}

#[derive(Deserialize)]
pub struct KeysQuery {
    /// The one-time view of a key just created (`console_reveals`).
    reveal: Option<String>,
}

pub async fn keys(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<String>,
    query: web::Query<KeysQuery>,
) -> Result<HttpResponse, ConsoleError> {
    let org = viewer.org(&path).await?;
    let new_key = match query.reveal.as_deref().filter(|r| !r.is_empty()) {
        None => None,
        // Shown once: a reload (or anyone else) finds it gone.
        Some(reveal) => Some(take_one_view(&viewer, &org.org_id, reveal).await?),
    };
    keys_page(&req, &viewer, &org, new_key).await
}

/// What the keys page shows of a key just created.
pub enum Reveal {
    /// Its secret, this once.
    Key(String),
    /// Already shown, expired, or another session's.
    Gone,
}

impl Reveal {
    /// What a page shows of an asked-for view: the secret (this once), and whether it is
    /// gone.
    pub fn shown(reveal: Option<Self>) -> (Option<String>, bool) {
        match reveal {
            Some(Self::Key(secret)) => (Some(secret), false),
            Some(Self::Gone) => (None, true),
            None => (None, false),
        }
    }
}

async fn keys_page(
    req: &HttpRequest,
    viewer: &Viewer,
    org: &OrgView,
    new_key: Option<Reveal>,
) -> Result<HttpResponse, ConsoleError> {
    keys_page_with(req, viewer, org, new_key, None).await
}

/// The keys page; with `refused`, the new-key form refused (422): its message shown and
/// what was typed kept in the form.
async fn keys_page_with(
    req: &HttpRequest,
    viewer: &Viewer,
    org: &OrgView,
    new_key: Option<Reveal>,
    refused: Option<(String, KeyDraft)>,
) -> Result<HttpResponse, ConsoleError> {
    let mut l = org_layout(viewer, org, "API keys and members", "keys", req).await?;
    let status = match &refused {
        Some((message, _)) => {
            l.flash = Some(Flash {
                ok: false,
                message: message.clone(),
            });
            actix_web::http::StatusCode::UNPROCESSABLE_ENTITY
        }
        None => actix_web::http::StatusCode::OK,
    };
    let draft = refused.map(|(_, draft)| draft).unwrap_or_default();
    let now = Utc::now();
    let keys = keel_core::keys::service::list(&viewer.state.db, &org.org_id, now)
        .await?
        .into_iter()
        .map(|k| key_row(k, now))
        .collect();
    let members = keel_core::orgs::service::members(&viewer.state.db, &org.org_id)
        .await?
        .into_iter()
        .map(|(m, email)| MemberRow {
            user_id: m.user_id.into(),
            email: email.unwrap_or_default(),
            role: m.role,
            since: format::time(m.created_at),
        })
        .collect();
    let (new_key, key_gone) = Reveal::shown(new_key);
    let keys_page = KeysPage {
        l,
        keys,
        members,
        key_gone,
        new_key,
        is_owner: org.is_owner(),
        draft,
    };
    Ok(match status {
        actix_web::http::StatusCode::OK => page(req, &keys_page),
        refused => super::html(refused, &keys_page),
    })
}

/// The new-key form's fields as they were typed.
fn key_draft(form: &FormFields) -> KeyDraft {
    let text = |name: &str| form.get(name).unwrap_or_default().chars().take(2000).collect();
    let scopes = form.all("scope");
    KeyDraft {
        name: text("name"),
        rpm: text("requestsPerMinute"),
        tokens_per_day: text("tokensPerDay"),
        streams: text("concurrentStreams"),
        inference: scopes.contains(&"inference"),
        api: scopes.contains(&"api"),
        models: text("models"),
        expires_on: text("expiresOn"),
    }
}

/// A key as the keys page shows it: settings, and today's use against each limit.
fn key_row(k: keel_core::keys::service::KeyUse, now: chrono::DateTime<Utc>) -> KeyRow {
    let keel_core::keys::service::KeyUse {
        key,
        settings,
        requests_today,
        tokens_today,
        streams_open,
    } = k;
    let limits = settings.limits;
    let text = |n: Option<u64>| n.map(|n| n.to_string()).unwrap_or_default();
    KeyRow {
        id: key.id.into(),
        name: key.name.unwrap_or_default(),
        prefix: key.prefix,
        created: format::time(key.created_at),
        revoked: key.revoked_at.map(format::time),
        scopes: settings.scopes.names().join(", "),
        inference: settings.scopes.inference,
        api: settings.scopes.api,
        models: settings.models.as_ref().map(|m| m.join(", ")).unwrap_or_default(),
        rpm: text(limits.requests_per_minute.map(u64::from)),
        tokens_per_day: text(limits.tokens_per_day),
        streams: text(limits.concurrent_streams.map(u64::from)),
        requests_today: format::count(requests_today),
        requests_limit: limits
            .requests_per_minute
            .map(|n| format!("at most {} a minute", format::count(i64::from(n))))
            .unwrap_or_default(),
        tokens_today: format::count(tokens_today),
        tokens_limit: limits
            .tokens_per_day
            .map(|n| format!("of {}", format::count(i64::try_from(n).unwrap_or(i64::MAX))))
            .unwrap_or_default(),
        streams_limit: limits
            .concurrent_streams
            .map(|n| format!("{streams_open} open of {n} at once"))
            .unwrap_or_default(),
        expires: format::opt_time(settings.expires_at),
        expires_input: settings
            .expires_at
            .map(|at| at.format("%Y-%m-%dT%H:%M").to_string())
            .unwrap_or_default(),
        expired: settings.expired(now),
        last_used: format::opt_time(key.last_used_at),
    }
}

/// The keys page's form as the API's body: each limit a number (empty: none), the scopes'
/// boxes, models comma-separated (empty: any), the expiry a UTC `datetime-local` (empty:
/// never). `clearing` sends `null` for what is empty (an edit), else leaves it out (a new key).
fn key_settings_json(form: &FormFields, clearing: bool) -> serde_json::Value {
    use serde_json::{json, Map, Value};
    let absent = || if clearing { Some(Value::Null) } else { None };
    // Not a number: passed on as text, for the body's own 422.
    let number = |name: &str| form.number(name).or_else(absent);
    let mut limits = Map::new();
    for (field, api) in [
        ("requestsPerMinute", "requestsPerMinute"),
        ("tokensPerDay", "tokensPerDay"),
        ("concurrentStreams", "concurrentStreams"),
    ] {
        if let Some(value) = number(field) {
            limits.insert(api.into(), value);
        }
    }
    let mut body = Map::new();
    if let Some(name) = form.get("name").map(Value::from).or_else(absent) {
        body.insert("name".into(), name);
    }
    if !limits.is_empty() {
        body.insert("limits".into(), Value::Object(limits));
    }
    // The boxes, when the form has them (`scopes-shown`): none ticked is an empty list (422).
    if form.get("scopes-shown").is_some() {
        body.insert("scopes".into(), json!(form.all("scope")));
    } else if clearing {
        body.insert("scopes".into(), Value::Null);
    }
    let models: Vec<&str> = form
        .get("models")
        .unwrap_or_default()
        .split([',', '\n'])
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .collect();
    if !models.is_empty() {
        body.insert("models".into(), json!(models));
    } else if clearing {
        body.insert("models".into(), Value::Null);
    }
    match form.get("expiresOn") {
        // `datetime-local` has no zone: the page says it is UTC.
        Some(at) => {
            let at = match at.len() {
                16 => format!("{at}:00Z"),
                _ => format!("{at}Z"),
            };
            body.insert("expiresAt".into(), Value::from(at));
        }
        None if clearing => {
            body.insert("expiresAt".into(), Value::Null);
        }
        None => {}
    }
    Value::Object(body)
}

/// Creates a key (owners only) and shows it this once, on the page that answers the form.
pub async fn create_key(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<String>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let form = FormFields::parse(&body);
    let org = viewer.act_in(&path, &form.csrf, true).await?;
    let json = key_settings_json(&form, false).to_string();
    let body = crate::http::extract::parse_checked_body::<crate::keys::dto::CreateKeyBody>(json.as_bytes());
    // Refused: the page again, the form holding what was typed.
    let refused = |err: ApiError| async {
        match actix_web::ResponseError::status_code(&err).is_client_error() {
            true => {
                keys_page_with(
                    &req,
                    &viewer,
                    &org,
                    None,
                    Some((super::describe(&err), key_draft(&form))),
                )
                .await
            }
            false => Err(err.into()),
        }
    };
    let body = match body {
        Ok(body) => body,
        Err(err) => return refused(err).await,
    };
    // Answered with a redirect (a reload repeats the GET, never the creation); the secret
    // waits, sealed, for that page's one view.
    let reveal = match create_key_shown_once(&viewer, &org.org_id, &body).await {
        Ok(reveal) => reveal,
        Err(err) => return refused(err).await,
    };
    Ok(redirect(&format!("/console/o/{}/keys?reveal={reveal}", org.org_id)).finish())
}

/// Changes a key's settings (owners only): the edit form's empty fields clear theirs.
pub async fn edit_key(
    viewer: Viewer,
    path: web::Path<KeyPath>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let form = FormFields::parse(&body);
    let org = viewer.act_in(&path.org, &form.csrf, true).await?;
    let json = key_settings_json(&form, true).to_string();
    let outcome = async {
        let body =
            crate::http::extract::parse_checked_body::<crate::keys::dto::PatchKeyBody>(json.as_bytes())?;
        let key_id =
            keel_core::domain::ApiKeyId::parse(&path.key).map_err(|_| keel_core::keys::KeyError::NotFound)?;
        keel_core::keys::service::update(
            &viewer.state.db,
            &viewer.state.cluster,
            &org.org_id,
            &key_id,
            &body.change(),
            Utc::now(),
        )
        .await?;
        Ok::<_, ApiError>(())
    }
    .await;
    after_form(&format!("/console/o/{}/keys", org.org_id), outcome, |()| {
        "API key changed.".into()
    })
}

/// Creates an API key and its one-time view (`console_reveals`), in one transaction: a key
/// whose secret could not be kept for its view is not created. Answers the view's id.
async fn create_key_shown_once(
    viewer: &Viewer,
    org_id: &OrgId,
    body: &crate::keys::dto::CreateKeyBody,
) -> Result<String, ApiError> {
    use sea_orm::TransactionTrait;
    let txn = viewer.state.db.begin().await?;
    let created =
        keel_core::keys::service::create_in(&txn, org_id, body.name.as_deref(), &body.settings(), Utc::now())
            .await?;
    let reveal = keep_for_one_view(viewer, &txn, org_id, &created.secret).await?;
    txn.commit().await?;
    Ok(reveal)
}

/// Keeps a secret, sealed, for one view by this session (`console_reveals`, within `db`'s
/// transaction when it is one); answers the view's id, for the page's `?reveal=`.
pub(super) async fn keep_for_one_view(
    viewer: &Viewer,
    db: &impl sea_orm::ConnectionTrait,
    org_id: &OrgId,
    secret: &str,
) -> Result<String, ApiError> {
    let mut id = [0u8; 16];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut id);
    let reveal = hex::encode(id);
    let sealed = viewer
        .state
        .console_box
        .seal(org_id, &format!("console-reveal/{reveal}"), secret)
        .map_err(ApiError::Unexpected)?;
    keel_core::console::service::keep_reveal(
        db,
        entities::console_reveal::Model {
            id: reveal.clone(),
            session_id: viewer.sid.clone(),
            org_id: org_id.clone(),
            sealed,
            created_at: Utc::now(),
        },
    )
    .await?;
    Ok(reveal)
}

/// The secret kept for this session's one view `reveal`: `Reveal::Gone` once shown.
pub(super) async fn take_one_view(
    viewer: &Viewer,
    org_id: &OrgId,
    reveal: &str,
) -> Result<Reveal, ConsoleError> {
    let sealed =
        keel_core::console::service::take_reveal(&viewer.state.db, reveal, &viewer.sid, org_id).await?;
    Ok(match sealed {
        Some(sealed) => Reveal::Key(
            viewer
                .state
                .console_box
                .open(org_id, &format!("console-reveal/{reveal}"), &sealed)
                .map_err(ApiError::Unexpected)?,
        ),
        None => Reveal::Gone,
    })
}

#[derive(Deserialize)]
pub struct KeyPath {
    org: String,
    key: String,
}

/// Revokes one of the organization's keys, once its owner confirms (nothing that uses it
/// works afterwards).
pub async fn revoke_key(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<KeyPath>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let form = FormFields::parse(&body);
    let org = viewer.act_in(&path.org, &form.csrf, true).await?;
    let key_id = keel_core::domain::ApiKeyId::parse(&path.key).map_err(|_| ConsoleError::NotFound)?;
    if !form.confirmed() {
        let key = keel_core::keys::service::key(&viewer.state.db, &org.org_id, &key_id)
            .await
            .map_err(|_| ConsoleError::NotFound)?;
        let back = format!("/console/o/{}/keys", org.org_id);
        let title = "Revoke the API key?";
        return Ok(confirm_page(
            org_layout(&viewer, &org, title, "keys", &req).await?,
            Confirm {
                title,
                question: "Every call made with it is refused from now on (the proxy, the API, the console); this cannot be undone.".into(),
                details: vec![format!(
                    "{} ({})",
                    key.name.as_deref().unwrap_or("unnamed key"),
                    key.id
                )],
                action: format!("{back}/{}/revoke", key.id),
                button: "Revoke key",
                back,
            },
            form.carried(),
        ));
    }
    let outcome =
        keel_core::keys::service::revoke(&viewer.state.db, &viewer.state.cluster, &org.org_id, &key_id).await;
    after_form(&format!("/console/o/{}/keys", org.org_id), outcome, |()| {
        "API key revoked.".into()
    })
}
