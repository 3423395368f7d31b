//! The console (`/console`): sign-in, the cookie, CSRF, who sees what, and each page and
//! form, through HTTP as a browser sends it (forms, cookies, no redirects followed).

use reqwest::header::{CONTENT_TYPE, COOKIE, LOCATION, SET_COOKIE};
use reqwest::{Response, StatusCode};
use serde_json::{json, Value};

use crate::helpers::*;
use crate::proxy::{chat, proxy_app, raw_traces, sdk_request};
use crate::queue::{claim, tracer};

/// A browser's session with the console: its cookie and the CSRF token of its pages.
pub struct Console {
    base: String,
    client: reqwest::Client,
    cookie: String,
    pub csrf: String,
}

/// The `name=value` of the console cookie a response sets, and the whole header.
fn console_cookie(response: &Response) -> Option<(String, String)> {
    response
        .headers()
        .get_all(SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|v| v.starts_with("keel_console="))
        .map(|header| (header.split(';').next().unwrap().to_owned(), header))
}

fn csrf_of(html: &str) -> String {
    let marker = "name=\"csrf\" value=\"";
    let start = html
        .find(marker)
        .map(|i| i + marker.len())
        .expect("a form with a CSRF token");
    html[start..start + 32].to_owned()
}

impl Console {
    /// Signs in with `credential`; panics unless the console accepts it.
    pub async fn sign_in(app: &TestApp, credential: &str) -> Self {
        let client = no_redirects();
        let response = client
            .post(app.url("/console/login"))
            .form(&[("credential", credential)])
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::SEE_OTHER);
        let (cookie, _) = console_cookie(&response).expect("a console cookie");
        let mut console = Self {
            base: app.address.clone(),
            client,
            cookie,
            csrf: String::new(),
        };
        let home = console.get("/console").await;
        let to = home.headers()[LOCATION].to_str().unwrap().to_owned();
        let page = console.get(&to).await;
        assert_eq!(page.status(), StatusCode::OK, "{to}");
        console.csrf = csrf_of(&page.text().await.unwrap());
        console
    }

    pub async fn get(&self, path: &str) -> Response {
        self.client
            .get(format!("{}{path}", self.base))
            .header(COOKIE, &self.cookie)
            .send()
            .await
            .unwrap()
    }

    pub async fn page(&self, path: &str) -> String {
        let response = self.get(path).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        response.text().await.unwrap()
    }

    /// Posts a form with this session's CSRF token.
    pub async fn post(&self, path: &str, fields: &[(&str, &str)]) -> Response {
        let mut form: Vec<(&str, &str)> = vec![("csrf", &self.csrf)];
        form.extend_from_slice(fields);
        self.post_raw(path, &form).await
    }

    pub async fn post_raw(&self, path: &str, form: &[(&str, &str)]) -> Response {
        self.client
            .post(format!("{}{path}", self.base))
            .header(COOKIE, &self.cookie)
            .form(form)
            .send()
            .await
            .unwrap()
    }

    /// Posts a form, follows its redirect and answers the page with its message.
    pub async fn submit(&self, path: &str, fields: &[(&str, &str)]) -> String {
        let response = self.post(path, fields).await;
        assert_eq!(response.status(), StatusCode::SEE_OTHER, "{path}");
        let to = response.headers()[LOCATION].to_str().unwrap().to_owned();
        let flash = response
            .headers()
            .get_all(SET_COOKIE)
            .iter()
            .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_owned())
            .find(|c| c.starts_with("keel_flash="))
            .unwrap_or_default();
        let page = self
            .client
            .get(format!("{}{to}", self.base))
            .header(COOKIE, format!("{}; {flash}", self.cookie))
            .send()
            .await
            .unwrap();
        assert_eq!(page.status(), StatusCode::OK, "{to}");
        page.text().await.unwrap()
    }

    /// A destructive form: the first post answers a page that asks (and carries the fields
    /// on with `confirmed=yes`); the confirmed post acts. Answers both pages.
    pub async fn confirm(&self, path: &str, fields: &[(&str, &str)]) -> (String, String) {
        let asked = self.post(path, fields).await;
        assert_eq!(
            asked.status(),
            StatusCode::OK,
            "{path}: a confirmation page first"
        );
        let asked = asked.text().await.unwrap();
        assert!(
            asked.contains(&format!("action=\"{path}\""))
                && asked.contains("name=\"confirmed\" value=\"yes\"")
                && asked.contains("id=\"confirm\""),
            "{asked}"
        );
        let mut confirmed = fields.to_vec();
        confirmed.push(("confirmed", "yes"));
        (asked, self.submit(path, &confirmed).await)
    }
}

/// The page's "next page" link, if any.
fn next_link(html: &str) -> Option<String> {
    let end = html.find("\" rel=\"next\"")?;
    let start = html[..end].rfind("href=\"")? + "href=\"".len();
    Some(html[start..end].replace("&#38;", "&").replace("&amp;", "&"))
}

pub fn org_path(org: &TestOrg, rest: &str) -> String {
    format!("/console/o/{}{rest}", org.org_id)
}

const ORG_PAGES: &[&str] = &[
    "",
    "/ledger",
    "/jobs",
    "/traces",
    "/evals",
    "/runs",
    "/keys",
    "/webhooks",
];

#[actix_web::test]
async fn the_sign_in_form_refuses_wrong_credentials_and_every_response_carries_the_security_headers() {
    let app = spawn_app().await;
    let client = no_redirects();
    let form = client.get(app.url("/console/login")).send().await.unwrap();
    assert_eq!(form.status(), StatusCode::OK);
    for (name, value) in [
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "same-origin"),
    ] {
        assert_eq!(form.headers()[name], value);
    }
    let csp = form.headers()["content-security-policy"].to_str().unwrap();
    assert!(
        csp.starts_with("default-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert!(!csp.contains("unsafe-inline"));
    let html = form.text().await.unwrap();
    assert!(html.contains("<label for=\"credential\""));
    assert!(!html.contains("<script>"), "no inline script");

    for wrong in [
        "keel_sk_notakeyatall00000000000000000000000000",
        "nope",
        "",
        "a.b.c",
    ] {
        let response = client
            .post(app.url("/console/login"))
            .form(&[("credential", wrong)])
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{wrong}");
        assert!(console_cookie(&response).is_none());
        assert_eq!(response.headers()["x-content-type-options"], "nosniff");
        let html = response.text().await.unwrap();
        assert!(html.contains("Those credentials were not accepted."));
    }
    // Not signed in: every page sends to the form.
    let page = client
        .get(app.url("/console/operator/queue"))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::SEE_OTHER);
    // ...and back to the page asked for once signed in; no cookie was sent, none is cleared.
    assert_eq!(
        page.headers()[LOCATION],
        "/console/login?next=%2Fconsole%2Foperator%2Fqueue"
    );
    assert!(page.headers().get(SET_COOKIE).is_none());
    // Assets are cached and validated.
    let css = client
        .get(app.url("/console/static/console.css"))
        .send()
        .await
        .unwrap();
    assert_eq!(css.status(), StatusCode::OK);
    assert!(css.headers()["cache-control"]
        .to_str()
        .unwrap()
        .contains("max-age"));
    let etag = css.headers()["etag"].clone();
    let again = client
        .get(app.url("/console/static/console.css"))
        .header("if-none-match", etag)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
}

#[actix_web::test]
async fn a_sign_in_from_another_site_is_refused_and_wrong_credentials_are_throttled() {
    let app = spawn_app().await;
    let attacker = app.create_org("Attacker").await;
    let client = no_redirects();
    let sign_in = |headers: &[(&'static str, String)], credential: &str| {
        let mut request = client
            .post(app.url("/console/login"))
            .form(&[("credential", credential)]);
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        request.send()
    };
    let own_origin = app.url("").trim_end_matches('/').to_owned();
    let other_port = own_origin.replace(&own_origin.rsplit(':').next().unwrap().to_owned(), "1");
    for headers in [
        vec![("origin", "https://evil.example".to_owned())],
        vec![("origin", own_origin.replace("127.0.0.1", "localhost"))],
        vec![("origin", other_port)],
        vec![("origin", "null".to_owned())],
        vec![("sec-fetch-site", "cross-site".to_owned())],
        vec![
            ("sec-fetch-site", "same-site".to_owned()),
            ("origin", own_origin.clone()),
        ],
    ] {
        let response = sign_in(&headers, &attacker.api_key).await.unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{headers:?}");
        assert!(console_cookie(&response).is_none(), "{headers:?}: no session");
        assert!(response.text().await.unwrap().contains("another site"));
    }
    // From the console's own page (a browser says so), or from no browser at all: signed in.
    for headers in [
        vec![
            ("origin", own_origin.clone()),
            ("sec-fetch-site", "same-origin".to_owned()),
        ],
        // Behind a proxy that ends TLS: the browser's origin is https, keel sees http.
        vec![
            ("origin", own_origin.replace("http://", "https://")),
            ("sec-fetch-site", "same-origin".to_owned()),
        ],
        vec![],
    ] {
        let response = sign_in(&headers, &attacker.api_key).await.unwrap();
        assert_eq!(response.status(), StatusCode::SEE_OTHER, "{headers:?}");
        assert!(console_cookie(&response).is_some());
    }

    // Ten wrong credentials from an address are answered; then it waits (429, Retry-After),
    // and even a right one is not looked at meanwhile.
    for n in 1..=10 {
        let response = sign_in(&[], "keel_sk_wrong0000000000000000000000000000000")
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            StatusCode::UNAUTHORIZED,
            "wrong credential {n}"
        );
    }
    let throttled = sign_in(&[], "nope").await.unwrap();
    assert_eq!(throttled.status(), StatusCode::TOO_MANY_REQUESTS);
    let wait: u64 = throttled.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=6).contains(&wait), "{wait}");
    let right = sign_in(&[], &attacker.api_key).await.unwrap();
    assert_eq!(right.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(console_cookie(&right).is_none());
    // Once the wait is over, a right credential signs in.
    actix_web::rt::time::sleep(std::time::Duration::from_secs(wait)).await;
    let right = sign_in(&[], &attacker.api_key).await.unwrap();
    assert_eq!(right.status(), StatusCode::SEE_OTHER);
}

#[actix_web::test]
async fn the_cookie_is_http_only_lax_scoped_signed_and_never_holds_the_credential() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let response = no_redirects()
        .post(app.url("/console/login"))
        .form(&[("credential", org.api_key.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(response.headers()[LOCATION], org_path(&org, "").as_str());
    let (pair, header) = console_cookie(&response).unwrap();
    assert!(header.contains("HttpOnly"));
    assert!(header.contains("SameSite=Lax"));
    assert!(header.contains("Path=/console"));
    assert!(!header.contains("Secure"), "plain http: not Secure under auto");
    let secret_part = org.api_key.trim_start_matches("keel_sk_");
    assert!(!pair.contains(secret_part));
    // The payload names the key by id only.
    let payload = pair.split('.').nth(1).unwrap();
    assert!(!payload.is_empty());

    // A tampered cookie is no session.
    let console = Console::sign_in(&app, &org.api_key).await;
    let forged = Console {
        cookie: format!("{}x", console.cookie),
        base: console.base.clone(),
        client: no_redirects(),
        csrf: console.csrf.clone(),
    };
    assert_eq!(
        forged.get(&org_path(&org, "")).await.status(),
        StatusCode::SEE_OTHER
    );

    // Always-secure cookies when configured.
    let secure_app =
        spawn_app_with(|s| s.console.secure_cookies = keel_core::config::SecureCookies::Always).await;
    let secure_org = secure_app.create_org("Acme").await;
    let response = no_redirects()
        .post(secure_app.url("/console/login"))
        .form(&[("credential", secure_org.api_key.as_str())])
        .send()
        .await
        .unwrap();
    assert!(console_cookie(&response).unwrap().1.contains("Secure"));
}

#[actix_web::test]
async fn each_organization_page_answers_its_members_and_the_operator_and_hides_other_organizations() {
    let app = spawn_app().await;
    let acme = app.create_org("Acme").await;
    let other = app.create_org("Other").await;
    let key = Console::sign_in(&app, &acme.api_key).await;
    let owner = Console::sign_in(&app, &acme.owner_token).await;
    let member = Console::sign_in(&app, &acme.member_token).await;
    let operator = Console::sign_in(&app, INTERNAL_KEY).await;
    for page in ORG_PAGES {
        for (who, console) in [
            ("key", &key),
            ("owner", &owner),
            ("member", &member),
            ("operator", &operator),
        ] {
            let html = console.page(&org_path(&acme, page)).await;
            assert!(html.contains("Acme"), "{who} {page}");
            let forms = html.contains("action=\"/console/o/");
            if page.is_empty() {
                assert_eq!(forms, who != "operator", "{who} sees forms on the overview");
            }
        }
        for console in [&key, &owner, &member] {
            let response = console.get(&org_path(&other, page)).await;
            assert_eq!(response.status(), StatusCode::NOT_FOUND, "{page}");
        }
    }
    // Keys and members: only an owner's session gets the actions.
    let owner_keys = owner.page(&org_path(&acme, "/keys")).await;
    assert!(owner_keys.contains("Create API key") && owner_keys.contains("Revoke"));
    assert!(owner_keys.contains(&acme.member_id) && owner_keys.contains("owner@example.com"));
    for console in [&key, &member, &operator] {
        let html = console.page(&org_path(&acme, "/keys")).await;
        assert!(html.contains("ci") && !html.contains("Create API key") && !html.contains(">Revoke<"));
    }
    // A member (or key) creating a key: 403, nothing created.
    let refused = member.post(&org_path(&acme, "/keys"), &[("name", "x")]).await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    // The operator reads, never acts.
    let refused = operator
        .post(&org_path(&acme, "/promo"), &[("code", "WELCOME10")])
        .await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert_eq!(app.balance_microcents(&acme).await, 0);
    // The operator's own pages are the operator's only.
    for path in ["/console/operator/queue", "/console/operator/writer"] {
        assert_eq!(key.get(path).await.status(), StatusCode::NOT_FOUND);
        assert_eq!(operator.get(path).await.status(), StatusCode::OK);
    }
    let orgs = operator.page("/console/orgs").await;
    assert!(orgs.contains("Acme") && orgs.contains("Other") && orgs.contains(&acme.slug));
}

#[actix_web::test]
async fn a_form_without_the_sessions_csrf_token_is_refused_and_changes_nothing() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let console = Console::sign_in(&app, &org.api_key).await;
    let path = org_path(&org, "/promo");
    for form in [
        vec![("code", "WELCOME10")],
        vec![
            ("csrf", "0123456789abcdef0123456789abcdef"),
            ("code", "WELCOME10"),
        ],
        vec![("csrf", ""), ("code", "WELCOME10")],
    ] {
        let response = console.post_raw(&path, &form).await;
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
    }
    // Another session's token is not this one's.
    let other = Console::sign_in(&app, &org.api_key).await;
    assert_ne!(other.csrf, console.csrf);
    let response = console
        .post_raw(&path, &[("csrf", other.csrf.as_str()), ("code", "WELCOME10")])
        .await;
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let logout = console.post_raw("/console/logout", &[]).await;
    assert_eq!(logout.status(), StatusCode::FORBIDDEN);
    assert_eq!(app.balance_microcents(&org).await, 0);
    assert_eq!(app.assert_ledger_invariant(&org.org_id).await.1, 0);
}

#[actix_web::test]
async fn billing_forms_save_a_card_top_up_once_per_form_redeem_promo_and_starter_credit() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let console = Console::sign_in(&app, &org.api_key).await;
    let overview = org_path(&org, "");
    let html = console
        .submit(&org_path(&org, "/promo"), &[("code", "welcome10")])
        .await;
    assert!(html.contains("Promo code redeemed: $10.00 credited."), "{html}");
    assert!(html.contains("$10.00") && html.contains("title=\"1000000000 microcents\""));
    let html = console
        .submit(&org_path(&org, "/promo"), &[("code", "WELCOME10")])
        .await;
    assert!(html.contains("flash error"));
    let html = console
        .submit(&org_path(&org, "/topup"), &[("amountCents", "2500")])
        .await;
    assert!(html.contains("save a payment method before topping up"), "{html}");
    let html = console
        .submit(&org_path(&org, "/card"), &[("paymentMethodId", "pm_card_visa")])
        .await;
    assert!(html.contains("ending in 4242"));
    let html = console
        .submit(&org_path(&org, "/topup"), &[("amountCents", "5")])
        .await;
    assert!(html.contains("amount cents: use 100 or more"), "{html}");
    // The same form twice (a double click): one charge.
    for _ in 0..2 {
        let html = console
            .submit(
                &org_path(&org, "/topup"),
                &[("amountCents", "2500"), ("idempotencyKey", "form-1")],
            )
            .await;
        assert!(html.contains("Top-up succeeded"), "{html}");
    }
    assert_eq!(app.balance_microcents(&org).await, 3_500_000_000);
    let html = console.submit(&org_path(&org, "/starter-credit"), &[]).await;
    assert!(html.contains("Starter credit granted"));
    let html = console
        .submit(
            &org_path(&org, "/auto-topup"),
            &[
                ("enabled", "true"),
                ("thresholdCents", "500"),
                ("amountCents", "2000"),
            ],
        )
        .await;
    assert!(html.contains("Auto top-up is on."), "{html}");
    let billing = app.billing(&org).await;
    assert_eq!(billing["autoTopup"]["enabled"], true);
    assert_eq!(billing["balanceCents"], 4000);
    // The overview: balance, card, the spend chart with its credit markers, the ledger.
    let html = console.page(&overview).await;
    assert!(html.contains("$40.00"));
    assert!(html.contains("<svg class=\"chart\""));
    assert!(html.contains("credits:"));
    let ledger = console.page(&org_path(&org, "/ledger?kind=topup")).await;
    assert_eq!(ledger.matches("<td>topup</td>").count(), 1);
    assert!(!ledger.contains("<td>promo</td>"));
    let html = console.submit(&org_path(&org, "/card/remove"), &[]).await;
    assert!(html.contains("auto top-up is now off"));
    app.assert_ledger_invariant(&org.org_id).await;
}

#[actix_web::test]
async fn the_ledger_pages_by_fifty_without_gaps_or_repeats() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    for _ in 0..3 {
        app.fund(&org, 100).await;
    }
    // 120 small debits.
    for i in 0..120 {
        let response = app
            .post(
                "/api/billing/debit",
                &org.api_key,
                &json!({"orgId": org.org_id, "runId": format!("run-{i}")}),
            )
            .await;
        assert!(response.status().is_success() || response.status() == StatusCode::PAYMENT_REQUIRED);
    }
    let console = Console::sign_in(&app, &org.api_key).await;
    let (_, entries) = app.assert_ledger_invariant(&org.org_id).await;
    let mut seen = 0;
    let mut path = org_path(&org, "/ledger");
    loop {
        let html = console.page(&path).await;
        let rows = html.matches("<tr><td>").count();
        assert!(rows <= 50);
        seen += rows;
        match next_link(&html) {
            Some(next) => path = next,
            None => break,
        }
    }
    assert_eq!(seen, entries);
}

#[actix_web::test]
async fn a_revoked_key_or_a_removed_membership_signs_out_at_the_next_click() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let console = Console::sign_in(&app, &org.api_key).await;
    let member = Console::sign_in(&app, &org.member_token).await;
    let revoked = app
        .delete(
            &format!("/api/internal/api-keys/{}", org.api_key_id),
            INTERNAL_KEY,
        )
        .await;
    assert_eq!(revoked.status(), StatusCode::OK);
    let response = console.get(&org_path(&org, "")).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        response.headers()[LOCATION],
        format!("/console/login?next=%2Fconsole%2Fo%2F{}", org.org_id).as_str()
    );
    let cleared = response.headers()[SET_COOKIE].to_str().unwrap();
    assert!(
        cleared.starts_with("keel_console=;") && cleared.contains("Max-Age=0"),
        "{cleared}"
    );

    assert_eq!(
        member.get(&org_path(&org, "/jobs")).await.status(),
        StatusCode::OK
    );
    let db = sea_orm::Database::connect(&app.db_url).await.unwrap();
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    entities::membership::Entity::delete_many()
        .filter(entities::membership::Column::UserId.eq(org.member_id.as_str()))
        .exec(&db)
        .await
        .unwrap();
    db.close().await.ok();
    assert_eq!(
        member.get(&org_path(&org, "/jobs")).await.status(),
        StatusCode::SEE_OTHER
    );

    // Sign out ends the session for good.
    let owner = Console::sign_in(&app, &org.owner_token).await;
    let out = owner.post("/console/logout", &[]).await;
    assert_eq!(out.status(), StatusCode::SEE_OTHER);
    assert!(out.headers()[SET_COOKIE].to_str().unwrap().contains("Max-Age=0"));
}

#[actix_web::test]
async fn a_user_with_several_organizations_picks_one() {
    let app = spawn_app().await;
    let acme = app.create_org("Acme").await;
    let other = app.create_org("Other").await;
    let put = app
        .put(
            &format!("/api/internal/orgs/{}/members/{}", other.org_id, acme.owner_id),
            INTERNAL_KEY,
            &json!({"role": "member"}),
        )
        .await;
    assert_eq!(put.status(), StatusCode::OK);
    let client = no_redirects();
    let response = client
        .post(app.url("/console/login"))
        .form(&[("credential", acme.owner_token.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()[LOCATION], "/console/orgs");
    let mut console = Console {
        base: app.address.clone(),
        client,
        cookie: console_cookie(&response).unwrap().0,
        csrf: String::new(),
    };
    let picker = console.page("/console/orgs").await;
    assert!(picker.contains("Acme") && picker.contains("Other"));
    console.csrf = csrf_of(&picker);
    // Not yet in an organization: its pages are not found.
    assert_eq!(
        console.get(&org_path(&other, "")).await.status(),
        StatusCode::NOT_FOUND
    );
    let picked = console
        .post("/console/orgs/pick", &[("org", other.org_id.as_str())])
        .await;
    assert_eq!(picked.status(), StatusCode::SEE_OTHER);
    console.cookie = console_cookie(&picked).unwrap().0;
    let html = console.page(&org_path(&other, "/keys")).await;
    assert!(html.contains("Other") && html.contains("member"));
    assert_eq!(
        console.get(&org_path(&acme, "")).await.status(),
        StatusCode::NOT_FOUND
    );
    // An organization the user is not in cannot be picked.
    let third = app.create_org("Third").await;
    let refused = console
        .post("/console/orgs/pick", &[("org", third.org_id.as_str())])
        .await;
    assert_eq!(refused.status(), StatusCode::NOT_FOUND);
}

#[actix_web::test]
async fn owners_create_a_key_shown_once_and_revoke_it() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let owner = Console::sign_in(&app, &org.owner_token).await;
    let response = owner
        .post(&org_path(&org, "/keys"), &[("name", "<b>deploy</b>")])
        .await;
    // A redirect: reloading what follows repeats a GET, never the creation.
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let shown_at = response.headers()[LOCATION].to_str().unwrap().to_owned();
    assert!(
        shown_at.starts_with(&org_path(&org, "/keys?reveal=")),
        "{shown_at}"
    );
    let html = owner.page(&shown_at).await;
    let marker = "<code id=\"new-key\" class=\"secret\">";
    let start = html.find(marker).unwrap() + marker.len();
    let key = &html[start..start + html[start..].find('<').unwrap()];
    assert!(key.starts_with("keel_sk_"));
    assert!(html.contains("&#60;b&#62;deploy&#60;/b&#62;") && !html.contains("<b>deploy"));
    // The key works, and no page shows it again: not a reload, not the list.
    assert_eq!(app.get("/api/projects", key).await.status(), StatusCode::OK);
    let reloaded = owner.page(&shown_at).await;
    assert!(!reloaded.contains(key) && reloaded.contains("shown once and is not shown again"));
    assert!(!owner.page(&org_path(&org, "/keys")).await.contains(key));
    let keys = json_of(app.get("/api/api-keys", key).await, StatusCode::OK).await;
    assert_eq!(
        keys["keys"].as_array().unwrap().len(),
        2,
        "one key created, not one per view"
    );
    // Nothing of the secret is stored: the key as a hash, its one view sealed and now gone.
    let db = sea_orm::Database::connect(app.db_url.as_str()).await.unwrap();
    use sea_orm::{EntityTrait, PaginatorTrait};
    assert_eq!(
        entities::console_reveal::Entity::find().count(&db).await.unwrap(),
        0
    );
    let keys = json_of(app.get("/api/api-keys", key).await, StatusCode::OK).await;
    let id = keys["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "<b>deploy</b>")
        .unwrap()["apiKeyId"]
        .as_str()
        .unwrap()
        .to_owned();
    // One click asks first, naming the key (escaped); nothing is revoked yet.
    let asked = owner
        .post(&org_path(&org, &format!("/keys/{id}/revoke")), &[])
        .await;
    assert_eq!(asked.status(), StatusCode::OK);
    let asked = asked.text().await.unwrap();
    assert!(
        asked.contains("Revoke the API key?") && asked.contains("&#60;b&#62;deploy&#60;/b&#62;"),
        "{asked}"
    );
    assert!(asked.contains(r#"name="confirmed" value="yes""#));
    assert_eq!(app.get("/api/projects", key).await.status(), StatusCode::OK);
    let html = owner
        .submit(
            &org_path(&org, &format!("/keys/{id}/revoke")),
            &[("confirmed", "yes")],
        )
        .await;
    assert!(html.contains("API key revoked."));
    assert_eq!(
        app.get("/api/projects", key).await.status(),
        StatusCode::UNAUTHORIZED
    );
    let unknown = owner.post(&org_path(&org, "/keys/no-such-key/revoke"), &[]).await;
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
    let unknown = owner
        .post(
            &org_path(&org, &format!("/keys/{}/revoke", uuid::Uuid::new_v4())),
            &[("confirmed", "yes")],
        )
        .await;
    assert_eq!(unknown.status(), StatusCode::SEE_OTHER);
}

#[actix_web::test]
async fn jobs_list_filter_refresh_and_stop_by_the_apis_rules() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    app.fund(&org, 1000).await;
    let project = app.create_project(&org, "Vision").await;
    let first = tracer(&app, &org, &project).await;
    let second = tracer(&app, &org, &project).await;
    let claimed = claim(&app, "worker-7", "tracer", 1).await;
    assert_eq!(claimed.len(), 1);
    let running = claimed[0]["job_id"].as_str().unwrap().to_owned();
    let queued = if running == first { second } else { first };
    let console = Console::sign_in(&app, &org.api_key).await;
    let list = console.page(&org_path(&org, "/jobs")).await;
    assert!(list.contains(&queued) && list.contains(&running));
    assert!(list.contains("data-refresh="));
    let only_running = console.page(&org_path(&org, "/jobs?status=running")).await;
    assert!(only_running.contains(&running) && !only_running.contains(&queued));
    let none = console.page(&org_path(&org, "/jobs?action=draft")).await;
    assert!(none.contains("No jobs match this filter."));
    // The part that refreshes itself.
    let partial = console
        .client
        .get(format!("{}{}", console.base, org_path(&org, "/jobs")))
        .header(COOKIE, &console.cookie)
        .header("x-console-partial", "1")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(partial.contains(&running) && !partial.contains("<html"));

    let page = console.page(&org_path(&org, &format!("/jobs/{running}"))).await;
    assert!(page.contains("claimed by worker-7") && page.contains("Stop job"));
    // Stopping asks first; the question changes nothing.
    let stop = org_path(&org, &format!("/jobs/{running}/stop"));
    let asked = console.post(&stop, &[("reason", "enough")]).await;
    assert_eq!(asked.status(), StatusCode::OK);
    let asked = asked.text().await.unwrap();
    assert!(
        asked.contains("Stop the job?") && asked.contains("name=\"reason\" value=\"enough\""),
        "{asked}"
    );
    let job = json_of(
        app.get(&format!("/api/training/jobs/{running}"), &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(job["status"], "running");
    let (_, html) = console.confirm(&stop, &[("reason", "enough")]).await;
    assert!(html.contains("Stop requested"), "{html}");
    let job = json_of(
        app.get(&format!("/api/training/jobs/{running}"), &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(job["status"], "stopping");
    let (_, html) = console
        .confirm(&org_path(&org, &format!("/jobs/{queued}/stop")), &[])
        .await;
    assert!(html.contains("Job stopped."));
    assert!(!html.contains("Stop job"), "an ended job has no Stop button");
    // As the API: stopping again is harmless.
    let (_, html) = console
        .confirm(&org_path(&org, &format!("/jobs/{queued}/stop")), &[])
        .await;
    assert!(html.contains("Job stopped."), "{html}");
    // Another organization's job is not found.
    let other = app.create_org("Other").await;
    let stranger = Console::sign_in(&app, &other.api_key).await;
    assert_eq!(
        stranger
            .get(&org_path(&other, &format!("/jobs/{running}")))
            .await
            .status(),
        StatusCode::NOT_FOUND
    );
    let refused = stranger
        .post(&org_path(&other, &format!("/jobs/{running}/stop")), &[])
        .await;
    assert_eq!(refused.status(), StatusCode::NOT_FOUND);
}

pub const HOSTILE: &str = "<script>alert(1)</script><img src=x onerror=alert(2)>";

/// A proxied app with an organization, a project and three traces (the last one hostile).
pub async fn traced_app() -> (TestApp, crate::fakes::FakeProvider, TestOrg, String, Vec<Value>) {
    let (app, provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    for (i, content) in ["Capital of France?", "Weather in Paris?", HOSTILE]
        .iter()
        .enumerate()
    {
        let model = if i == 1 { "gpt-tool" } else { "gpt-plain" };
        let response = sdk_request(&app, &org, Some(&project), &chat(model, content))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        raw_traces(&app, &org, &project, i + 1).await;
        actix_web::rt::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let traces = raw_traces(&app, &org, &project, 3).await;
    (app, provider, org, project, traces)
}

#[actix_web::test]
async fn traces_are_listed_shown_escaped_and_the_selected_ones_download_as_the_api_exports_them() {
    let (app, _provider, org, project, traces) = traced_app().await;
    let console = Console::sign_in(&app, &org.api_key).await;
    let projects = console.page(&org_path(&org, "/traces")).await;
    assert!(projects.contains("Support") && projects.contains(">3<"));
    let list = console
        .page(&org_path(&org, &format!("/projects/{project}/traces")))
        .await;
    for t in &traces {
        assert!(list.contains(t["id"].as_str().unwrap()));
    }
    let tool_only = console
        .page(&org_path(
            &org,
            &format!("/projects/{project}/traces?model=gpt-tool"),
        ))
        .await;
    assert_eq!(tool_only.matches("name=\"traceIds\"").count(), 1);
    let errors = console
        .page(&org_path(
            &org,
            &format!("/projects/{project}/traces?status=error"),
        ))
        .await;
    assert!(errors.contains("No traces match this filter."));

    // The hostile trace: text on the page, never markup.
    let hostile = traces
        .iter()
        .find(|t| t["request"].to_string().contains("alert(1)"))
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let html = console.page(&org_path(&org, &format!("/traces/{hostile}"))).await;
    assert!(!html.contains("<script>alert(1)") && !html.contains("<img src=x"));
    assert!(html.contains("&#60;script&#62;alert(1)&#60;/script&#62;&#60;img src=x onerror=alert(2)&#62;"));
    assert!(html.contains("class=\"message role-user\""));

    // Two selected traces, in each format: the API's rows for the same selection.
    let ids: Vec<&str> = traces.iter().take(2).map(|t| t["id"].as_str().unwrap()).collect();
    for format in ["records", "prompts", "raw"] {
        let response = console
            .post(
                &org_path(&org, &format!("/projects/{project}/export")),
                &[("traceIds", ids[0]), ("traceIds", ids[1]), ("format", format)],
            )
            .await;
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.headers()["content-disposition"]
            .to_str()
            .unwrap()
            .contains(".jsonl"));
        let body = response.text().await.unwrap();
        let lines: Vec<Value> = body.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let api = json_of(
            app.post(
                "/api/traces/export",
                &org.api_key,
                &json!({"traceIds": ids, "format": format}),
            )
            .await,
            StatusCode::OK,
        )
        .await;
        assert_eq!(json!(lines), api["records"], "{format}");
    }
    // The newest N: the API's GET export.
    let response = console
        .post(
            &org_path(&org, &format!("/projects/{project}/export")),
            &[("newest", "1"), ("limit", "2"), ("format", "raw")],
        )
        .await;
    let lines: Vec<Value> = response
        .text()
        .await
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let api = json_of(
        app.get(
            &format!("/api/traces/export?project_id={project}&limit=2&format=raw"),
            &org.api_key,
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(json!(lines), api["records"]);
    // Nothing selected: said on the page.
    let html = console
        .submit(
            &org_path(&org, &format!("/projects/{project}/export")),
            &[("format", "raw")],
        )
        .await;
    assert!(
        html.contains("flash error") && html.contains("traceIds"),
        "{html}"
    );
    // Another organization sees none of it.
    let other = app.create_org("Other").await;
    let stranger = Console::sign_in(&app, &other.api_key).await;
    assert_eq!(
        stranger
            .get(&org_path(&other, &format!("/traces/{hostile}")))
            .await
            .status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        stranger
            .get(&org_path(&other, &format!("/projects/{project}/traces")))
            .await
            .status(),
        StatusCode::NOT_FOUND
    );
}

#[actix_web::test]
async fn evals_and_runs_pages_show_what_was_uploaded() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let cases = json!([
        {"case_id": "a", "input": "<i>2+2</i>", "expected": "4", "actual": "4", "score": 1.0, "success": true},
        {"case_id": "b", "input": "3+3", "expected": "6", "actual": "7", "score": 0.0, "success": false},
        {"case_id": "c", "error": "timeout"}
    ]);
    let body = json_of(
        app.post(
            "/api/evals/runs",
            &org.api_key,
            &crate::traces::eval_body(&project, cases),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    let run_id = body["eval_run_id"].as_str().unwrap();
    let console = Console::sign_in(&app, &org.api_key).await;
    let evals = console.page(&org_path(&org, "/evals")).await;
    assert!(evals.contains("smoke") && evals.contains("<svg class=\"chart\""));
    let run = console.page(&org_path(&org, &format!("/evals/{run_id}"))).await;
    assert!(run.contains("&#60;i&#62;2+2") && run.contains("timeout"));
    let failed = console
        .page(&org_path(&org, &format!("/evals/{run_id}?filter=failed")))
        .await;
    assert!(failed.contains("3+3") && !failed.contains("2+2"));
    let errored = console
        .page(&org_path(&org, &format!("/evals/{run_id}?filter=errored")))
        .await;
    assert!(errored.contains("timeout") && !errored.contains("3+3"));

    let created = json_of(
        app.post(
            "/api/runs",
            &org.api_key,
            &json!({"projectId": project, "name": "sft-1", "model": "llama"}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    let run_id = created["runId"].as_str().unwrap();
    let checkpoint = app
        .post(
            "/api/runs/internal/checkpoints",
            INTERNAL_KEY,
            &json!({"orgId": org.org_id, "projectId": project, "runId": run_id, "checkpoints": [{"step": 100, "subfolder": "step-100"}]}),
        )
        .await;
    assert!(
        checkpoint.status().is_success(),
        "{}",
        checkpoint.text().await.unwrap()
    );
    let runs = console.page(&org_path(&org, "/runs")).await;
    assert!(runs.contains("sft-1") && runs.contains(run_id) && runs.contains("step-100"));
}

#[actix_web::test]
async fn operator_pages_show_the_queue_and_the_writer_and_requeue_stale_jobs() {
    let app = spawn_app_with(|s| s.queue.stale_after_secs = 1).await;
    let org = app.create_org("Acme").await;
    app.fund(&org, 1000).await;
    let project = app.create_project(&org, "Vision").await;
    let job = tracer(&app, &org, &project).await;
    tracer(&app, &org, &project).await;
    assert_eq!(claim(&app, "worker-9", "tracer", 1).await.len(), 1);
    let operator = Console::sign_in(&app, INTERNAL_KEY).await;
    let orgs = operator.page("/console/orgs").await;
    assert!(orgs.contains("$10.00") || orgs.contains("Acme"));
    let queue = operator.page("/console/operator/queue").await;
    assert!(queue.contains("worker-9"));
    assert!(queue.contains("<th scope=\"row\">tracer</th>"));
    actix_web::rt::time::sleep(std::time::Duration::from_millis(2100)).await;
    let queue = operator.page("/console/operator/queue").await;
    assert!(queue.contains("(stale)"), "{queue}");
    let (asked, html) = operator.confirm("/console/operator/requeue-stale", &[]).await;
    assert!(
        asked.contains(&job) && asked.contains("1 job(s) are past the threshold"),
        "{asked}"
    );
    assert!(html.contains("Stale sweep: 1 requeued"), "{html}");
    let writer = operator.page("/console/operator/writer").await;
    assert!(writer.contains("Queue depth now") && writer.contains("Dropped"));
    // The operator's job page of an organization: read-only.
    let page = operator.page(&org_path(&org, &format!("/jobs/{job}"))).await;
    assert!(!page.contains("Stop job"));
}

#[actix_web::test]
async fn the_overview_sums_serving_usage_by_model_exactly() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    // Three calls of 1,000,000 tokens in and 500,000 out: 20,000,000 µ¢ each at cost,
    // 24,000,000 charged; and one small call of another base model.
    let llama = "meta-llama/Llama-3.1-8B-Instruct";
    for i in 0..3 {
        let body = json!({"requestId": format!("gen-{i}"), "orgId": org.org_id, "model": llama,
                          "promptTokens": 1_000_000, "completionTokens": 500_000});
        json_of(
            app.post("/api/billing/serving-usage", INTERNAL_KEY, &body).await,
            StatusCode::OK,
        )
        .await;
    }
    let console = Console::sign_in(&app, &org.owner_token).await;
    let html = console.page(&org_path(&org, "")).await;
    let row = format!(
        "<tr><td>{llama}</td><td class=\"num\">3</td><td class=\"num\">3000000</td><td class=\"num\">1500000</td><td class=\"num\">$0.72</td></tr>"
    );
    assert!(
        html.contains(&row),
        "{}",
        &html[html.find("Serving usage by model").unwrap_or(0)..]
    );
    // The chart's period totals agree (72,000,000 µ¢ debited).
    assert!(
        html.contains("Last 30 days: $0.72 debited, $0.00 credited."),
        "{html}"
    );
    // And the operator's list of organizations shows the balance.
    let operator = Console::sign_in(&app, INTERNAL_KEY).await;
    let home = operator.get("/console").await;
    let orgs = operator.page(home.headers()[LOCATION].to_str().unwrap()).await;
    let row = &orgs[orgs
        .find(&format!("/console/o/{}", org.org_id))
        .expect("the organization's row")..];
    assert!(
        row[..row.find("</tr>").unwrap()].contains("<td class=\"num\">-$0.72</td>"),
        "{row}"
    );
}

#[actix_web::test]
async fn bad_addresses_and_tampered_forms_get_console_pages_never_a_500() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let console = Console::sign_in(&app, &org.owner_token).await;
    for (path, says) in [
        (org_path(&org, "/ledger?before=xx"), "cannot read"),
        (
            org_path(&org, "/ledger?kind=bogus"),
            "bogus&#34;, which is not one of: topup",
        ),
        (
            org_path(&org, "/jobs?status=bogus"),
            "bogus&#34;, which is not one of: queued",
        ),
        (
            org_path(&org, "/jobs?action=nope"),
            "nope&#34;, which is not one of: tracer",
        ),
        (org_path(&org, "/jobs?page=not-a-number"), "cannot read"),
        (
            org_path(&org, &format!("/projects/{project}/traces?status=bogus")),
            "which is not one of: ok, error",
        ),
        (
            org_path(&org, &format!("/projects/{project}/traces?before=x_y")),
            "cannot read",
        ),
    ] {
        let response = console.get(&path).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{path}");
        assert!(
            response.headers()[CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with("text/html"),
            "{path}"
        );
        let html = response.text().await.unwrap();
        assert!(
            html.contains(says) && html.contains("console.css"),
            "{path}: {html}"
        );
    }
    // Known values still filter.
    assert_eq!(
        console
            .get(&org_path(&org, "/jobs?status=queued&action=tracer"))
            .await
            .status(),
        StatusCode::OK
    );

    // The top-up form's hidden key, tampered: a message on the page, nothing charged.
    console
        .submit(&org_path(&org, "/card"), &[("paymentMethodId", "pm_card_visa")])
        .await;
    for key in ["k".repeat(300), "bad\0key".to_owned(), "has space".to_owned()] {
        let html = console
            .submit(
                &org_path(&org, "/topup"),
                &[("amountCents", "2500"), ("idempotencyKey", &key)],
            )
            .await;
        assert!(
            html.contains("flash error") && html.contains("idempotencyKey"),
            "{html}"
        );
    }
    assert_eq!(app.balance_microcents(&org).await, 0);

    // Every page names its icon, and the icon is there.
    let html = console.page(&org_path(&org, "")).await;
    assert!(html.contains("<link rel=\"icon\" href=\"/console/static/favicon.svg\""));
    let icon = console.get("/console/static/favicon.svg").await;
    assert_eq!(icon.status(), StatusCode::OK);
    assert_eq!(icon.headers()[CONTENT_TYPE], "image/svg+xml");
}

#[actix_web::test]
async fn signing_out_ends_the_session_on_every_instance() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    // A second instance on the same database.
    let other = spawn_on(TestDb::reuse(&app.db_url), test_settings(&app.db_url)).await;
    let console = Console::sign_in(&app, &org.owner_token).await;
    let elsewhere = Console {
        base: other.address.clone(),
        client: no_redirects(),
        cookie: console.cookie.clone(),
        csrf: console.csrf.clone(),
    };
    assert_eq!(elsewhere.get(&org_path(&org, "")).await.status(), StatusCode::OK);
    let out = console.post("/console/logout", &[]).await;
    assert_eq!(out.status(), StatusCode::SEE_OTHER);
    // The old cookie, replayed on either instance, opens nothing.
    for copy in [&console, &elsewhere] {
        let response = copy.get(&org_path(&org, "/ledger")).await;
        assert_eq!(response.status(), StatusCode::SEE_OTHER, "{}", copy.base);
        assert!(response.headers()[LOCATION]
            .to_str()
            .unwrap()
            .starts_with("/console/login"));
    }
    // Another sign-in of the same user is a session of its own, untouched.
    let again = Console::sign_in(&other, &org.owner_token).await;
    assert_eq!(again.get(&org_path(&org, "")).await.status(), StatusCode::OK);
}

#[actix_web::test]
async fn a_link_from_anywhere_opens_the_page_after_signing_in_and_only_a_console_page() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let client = no_redirects();
    let wanted = org_path(&org, "/ledger?kind=topup");
    // Followed from another site: no cookie came with it, so none is cleared.
    let asked = client
        .get(app.url(&wanted))
        .header("sec-fetch-site", "cross-site")
        .send()
        .await
        .unwrap();
    assert_eq!(asked.status(), StatusCode::SEE_OTHER);
    assert!(asked.headers().get(SET_COOKIE).is_none());
    let login = asked.headers()[LOCATION].to_str().unwrap().to_owned();
    let form = client
        .get(app.url(&login))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(form.contains("name=\"next\""), "{form}");
    let signed_in = client
        .post(app.url("/console/login"))
        .form(&[("credential", org.api_key.as_str()), ("next", wanted.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(signed_in.status(), StatusCode::SEE_OTHER);
    assert_eq!(signed_in.headers()[LOCATION], wanted.as_str());
    // Anything but a console path of this site goes to the session's home.
    for next in [
        "https://evil.example/",
        "//evil.example/console",
        "/consolex",
        "/console/../api/projects",
        "/console\\@evil",
        "javascript:alert(1)",
    ] {
        let signed_in = client
            .post(app.url("/console/login"))
            .form(&[("credential", org.api_key.as_str()), ("next", next)])
            .send()
            .await
            .unwrap();
        assert_eq!(
            signed_in.headers()[LOCATION],
            org_path(&org, "").as_str(),
            "{next}"
        );
    }
}

#[actix_web::test]
async fn a_new_keys_view_waits_ten_minutes_at_most() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let owner = Console::sign_in(&app, &org.owner_token).await;
    let response = owner.post(&org_path(&org, "/keys"), &[("name", "late")]).await;
    let shown_at = response.headers()[LOCATION].to_str().unwrap().to_owned();
    // Eleven minutes pass before the page is opened.
    use sea_orm::{ConnectionTrait, EntityTrait, PaginatorTrait};
    let db = sea_orm::Database::connect(app.db_url.as_str()).await.unwrap();
    let stmt = sea_orm::Statement::from_sql_and_values(
        db.get_database_backend(),
        "UPDATE console_reveals SET created_at = $1",
        [(chrono::Utc::now() - chrono::Duration::minutes(11)).into()],
    );
    db.execute_raw(stmt).await.unwrap();
    let html = owner.page(&shown_at).await;
    assert!(
        !html.contains("keel_sk_") || !html.contains("id=\"new-key\""),
        "{html}"
    );
    assert!(html.contains("shown once and is not shown again"));
    assert_eq!(
        entities::console_reveal::Entity::find().count(&db).await.unwrap(),
        0,
        "the sealed secret is gone"
    );
}

#[actix_web::test]
async fn the_job_page_shows_priority_schedule_and_attempts_and_retries_a_failed_job() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    app.fund(&org, 1000).await;
    let project = app.create_project(&org, "Vision").await;
    let later = (chrono::Utc::now() + chrono::Duration::hours(2)).to_rfc3339();
    let scheduled = json_of(
        app.post(
            "/api/training/jobs",
            &org.api_key,
            &json!({"action": "tracer", "projectId": project, "priority": 1, "runAt": later}),
        )
        .await,
        StatusCode::ACCEPTED,
    )
    .await["jobId"]
        .as_str()
        .unwrap()
        .to_owned();
    let console = Console::sign_in(&app, &org.owner_token).await;
    let page = console.page(&org_path(&org, &format!("/jobs/{scheduled}"))).await;
    assert!(page.contains("id=\"job-priority\">1 "), "{page}");
    assert!(page.contains("id=\"job-scheduled\""));
    assert!(page.contains("Stop job") && !page.contains("Retry job"));
    assert!(page.contains("No attempt has ended yet."));
    let list = console.page(&org_path(&org, "/jobs?status=scheduled")).await;
    assert!(list.contains(&scheduled));

    let job = tracer(&app, &org, &project).await;
    claim(&app, "worker-1", "tracer", 1).await;
    let failed = app
        .post(
            "/api/training/internal/jobs/failed",
            INTERNAL_KEY,
            &json!({"job_id": job, "worker_id": "worker-1", "error": "<script>alert(1)</script>"}),
        )
        .await;
    assert_eq!(failed.status(), StatusCode::OK);
    let path = org_path(&org, &format!("/jobs/{job}"));
    let page = console.page(&path).await;
    assert!(page.contains("Retry job") && !page.contains("Stop job"));
    assert!(page.contains("<td>worker-1</td>") && page.contains("s-failed"));
    assert!(!page.contains("<script>alert(1)") && page.contains("&#60;script&#62;alert(1)"));
    let (_, html) = console.confirm(&format!("{path}/retry"), &[]).await;
    assert!(html.contains("Job queued again."), "{html}");
    assert_eq!(
        json_of(
            app.get(&format!("/api/training/jobs/{job}"), &org.api_key).await,
            StatusCode::OK
        )
        .await["status"],
        "queued"
    );
    // Not retryable now: the flash says why.
    let (_, html) = console.confirm(&format!("{path}/retry"), &[]).await;
    assert!(html.contains("can be retried"), "{html}");
}

#[actix_web::test]
async fn the_operator_pauses_and_resumes_actions_and_sees_each_organizations_share() {
    let app = spawn_app_with(|s| s.queue.max_running_per_org = 1).await;
    let org = app.create_org("Acme").await;
    app.fund(&org, 1000).await;
    let project = app.create_project(&org, "Vision").await;
    tracer(&app, &org, &project).await;
    tracer(&app, &org, &project).await;
    assert_eq!(claim(&app, "worker-1", "tracer", 5).await.len(), 1);
    let operator = Console::sign_in(&app, INTERNAL_KEY).await;
    let queue = operator.page("/console/operator/queue").await;
    let row = format!(
        "<tr id=\"share-{0}\" class=\"stale\"><td><span title=\"{0}\" class=\"org-name\">Acme</span></td><td class=\"num weight\">1</td><td class=\"num\">1</td><td class=\"num\">1</td><td class=\"cap\">1 (default) (at cap)</td>",
        org.org_id
    );
    assert!(queue.contains(&row), "{queue}");
    assert!(queue.contains("id=\"pause-tracer\""));
    let (asked, html) = operator
        .confirm("/console/operator/queue/tracer/pause", &[])
        .await;
    assert!(asked.contains("Pause the queue?"), "{asked}");
    assert!(html.contains("tracer: paused"), "{html}");
    assert!(html.contains("id=\"resume-tracer\""));
    let state = json_of(app.get("/api/internal/queue", INTERNAL_KEY).await, StatusCode::OK).await;
    assert!(state["actions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a["action"] == "tracer" && a["paused"] == true));
    let html = operator
        .submit("/console/operator/queue/tracer/resume", &[])
        .await;
    assert!(html.contains("tracer: resumed"), "{html}");
    // An unknown action, or an organization's member: nothing.
    let member = Console::sign_in(&app, &org.owner_token).await;
    let response = member.post("/console/operator/queue/tracer/pause", &[]).await;
    assert_ne!(response.status(), StatusCode::SEE_OTHER);
    let state = json_of(app.get("/api/internal/queue", INTERNAL_KEY).await, StatusCode::OK).await;
    assert!(state["actions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|a| a["paused"] == false));
}

/// Claims `job` for `worker` (the only queued tracer job) and fails it with `error`.
pub async fn claim_and_fail(app: &TestApp, job: &str, worker: &str, error: &str) {
    let claimed = claim(app, worker, "tracer", 1).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0]["job_id"], job);
    let failed = app
        .post(
            "/api/training/internal/jobs/failed",
            INTERNAL_KEY,
            &json!({"job_id": job, "worker_id": worker, "error": error}),
        )
        .await;
    assert_eq!(failed.status(), StatusCode::OK);
}

async fn status_of(app: &TestApp, org: &TestOrg, job: &str) -> Value {
    json_of(
        app.get(&format!("/api/training/jobs/{job}"), &org.api_key).await,
        StatusCode::OK,
    )
    .await["status"]
        .clone()
}

#[actix_web::test]
async fn operators_filter_failed_jobs_across_organizations_and_retry_them_once_confirmed() {
    let app = spawn_app().await;
    let acme = app.create_org("Acme").await;
    let other = app.create_org("Other").await;
    let mut jobs = Vec::new();
    for (org, error) in [
        (&acme, "CUDA out of memory at step 120"),
        (&acme, "loss is 100% NaN_here"),
        (&other, "cuda OUT of memory"),
    ] {
        app.fund(org, 1000).await;
        let project = app.create_project(org, "Vision").await;
        let job = tracer(&app, org, &project).await;
        claim_and_fail(&app, &job, "worker-1", error).await;
        jobs.push(job);
    }
    let operator = Console::sign_in(&app, INTERNAL_KEY).await;
    let listed = |html: &str| -> Vec<bool> {
        jobs.iter()
            .map(|j| html.contains(&format!("id=\"failed-{j}\"")))
            .collect()
    };
    let all = operator.page("/console/operator/failed").await;
    assert_eq!(listed(&all), [true, true, true]);
    // Error text: case-insensitive; `%` and `_` are characters, not patterns.
    let cuda = operator.page("/console/operator/failed?q=Cuda+out").await;
    assert_eq!(listed(&cuda), [true, false, true]);
    let percent = operator.page("/console/operator/failed?q=100%25+NaN_").await;
    assert_eq!(listed(&percent), [false, true, false]);
    let wildcard = operator.page("/console/operator/failed?q=%25").await;
    assert_eq!(listed(&wildcard), [false, true, false]);
    let by_org = operator
        .page(&format!("/console/operator/failed?org={}&q=cuda", other.org_id))
        .await;
    assert_eq!(listed(&by_org), [false, false, true]);
    let by_action = operator.page("/console/operator/failed?action=training").await;
    assert_eq!(listed(&by_action), [false, false, false]);
    // An unknown action or a malformed organization id: a 400 page that says so.
    for (address, says) in [
        (
            "/console/operator/failed?action=%3Cb%3E",
            "which is not one of: tracer, draft, optimize, training",
        ),
        (
            "/console/operator/failed?org=%00",
            "organization id the page cannot read",
        ),
    ] {
        let bad = operator.get(address).await;
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST, "{address}");
        let bad = bad.text().await.unwrap();
        assert!(bad.contains(says) && !bad.contains("<b>"), "{bad}");
    }
    // An organization id no organization has: none of its jobs.
    let nobody = operator.page("/console/operator/failed?org=nope").await;
    assert_eq!(listed(&nobody), [false, false, false]);

    // Retry selected: the question first, which changes nothing.
    let asked = operator
        .post(
            "/console/operator/failed/retry",
            &[("job", &jobs[0]), ("job", &jobs[1])],
        )
        .await;
    assert_eq!(asked.status(), StatusCode::OK);
    assert!(asked
        .text()
        .await
        .unwrap()
        .contains("2 job(s) go back to the queue"));
    assert_eq!(status_of(&app, &acme, &jobs[0]).await, "failed");
    let (_, html) = operator
        .confirm(
            "/console/operator/failed/retry",
            &[("job", &jobs[0]), ("job", &jobs[1])],
        )
        .await;
    assert!(html.contains("2 job(s) queued again."), "{html}");
    assert_eq!(status_of(&app, &acme, &jobs[0]).await, "queued");
    assert_eq!(status_of(&app, &acme, &jobs[1]).await, "queued");
    assert_eq!(status_of(&app, &other, &jobs[2]).await, "failed");
    // Again: nothing is failed any more, so both are left alone, and said so.
    let (_, html) = operator
        .confirm(
            "/console/operator/failed/retry",
            &[("job", &jobs[0]), ("job", &jobs[1])],
        )
        .await;
    assert!(html.contains("0 job(s) queued again; 2 left alone"), "{html}");
    // All a filter shows: the confirmation lists them by id.
    let (asked, html) = operator
        .confirm(
            "/console/operator/failed/retry",
            &[
                ("scope", "all"),
                ("filter_org", &other.org_id),
                ("filter_q", "memory"),
            ],
        )
        .await;
    assert!(
        asked.contains(&format!("name=\"job\" value=\"{}\"", jobs[2])),
        "{asked}"
    );
    assert!(html.contains("1 job(s) queued again."), "{html}");
    assert_eq!(status_of(&app, &other, &jobs[2]).await, "queued");
    // Nothing selected: a message, nothing done.
    let html = operator
        .submit("/console/operator/failed/retry", &[("confirmed", "yes")])
        .await;
    assert!(html.contains("Select the jobs to retry first."), "{html}");

    // The queue page counts the attempts that ended, by outcome, over 24 hours.
    let queue = operator.page("/console/operator/queue").await;
    assert!(
        queue.contains("Attempts ended in the last 24 hours: 3 failed."),
        "{queue}"
    );
    assert_eq!(queue.matches("<rect class=\"o-failed\"").count(), 1, "{queue}");
    assert!(queue.contains("id=\"latency-tracer\""));

    // Not for an organization's members.
    let member = Console::sign_in(&app, &acme.owner_token).await;
    assert_eq!(
        member.get("/console/operator/failed").await.status(),
        StatusCode::NOT_FOUND
    );
    let refused = member
        .post(
            "/console/operator/failed/retry",
            &[("job", &jobs[0]), ("confirmed", "yes")],
        )
        .await;
    assert_ne!(refused.status(), StatusCode::SEE_OTHER);
}

#[actix_web::test]
async fn the_runs_and_eval_runs_pages_page_past_fifty() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    for n in 0..61 {
        let created = app
            .post(
                "/api/runs",
                &org.api_key,
                &json!({"projectId": project, "name": format!("run-{n:03}"), "model": "llama"}),
            )
            .await;
        assert_eq!(created.status(), StatusCode::OK);
    }
    for _ in 0..53 {
        let cases = json!([{"case_id": "a", "input": "2+2", "expected": "4", "actual": "4", "score": 1.0, "success": true}]);
        let uploaded = app
            .post(
                "/api/evals/runs",
                &org.api_key,
                &crate::traces::eval_body(&project, cases),
            )
            .await;
        assert_eq!(uploaded.status(), StatusCode::OK);
    }
    let console = Console::sign_in(&app, &org.api_key).await;
    let link = regex::Regex::new(r#"href="([^"]+)" rel="next" id="older""#).unwrap();
    let older = |page: &str| -> Option<String> { link.captures(page).map(|c| c[1].replace("&amp;", "&")) };
    // Runs: 50, then the 11 older ones, each once.
    let first = console.page(&org_path(&org, "/runs")).await;
    let shown = |page: &str| {
        (0..61)
            .filter(|n| page.contains(&format!("run-{n:03}")))
            .collect::<Vec<_>>()
    };
    assert_eq!(shown(&first), (11..61).collect::<Vec<_>>());
    assert!(
        first.contains("<p class=\"muted\" id=\"runs-total\">61 run(s).</p>"),
        "{first}"
    );
    let elsewhere = console
        .page(&org_path(
            &org,
            &format!("/runs?project={}", uuid::Uuid::new_v4()),
        ))
        .await;
    assert!(elsewhere.contains("id=\"runs-total\">0 run(s).") && elsewhere.contains("No runs yet."));
    let next = older(&first).expect("a link to older runs");
    let second = console.page(&next).await;
    assert_eq!(shown(&second), (0..11).collect::<Vec<_>>());
    assert!(older(&second).is_none(), "the last page links nowhere");
    // Eval runs: 50, then 3.
    let first = console.page(&org_path(&org, "/evals")).await;
    let rows = |page: &str| page.matches(&format!("/console/o/{}/evals/", org.org_id)).count();
    assert_eq!(rows(&first), 50);
    assert!(first.contains("id=\"eval-runs-total\">53 run(s)."), "{first}");
    let second = console
        .page(&older(&first).expect("a link to older eval runs"))
        .await;
    assert_eq!(rows(&second), 3);
}

#[actix_web::test]
async fn a_refused_key_or_endpoint_form_keeps_what_was_typed_and_says_what_to_fix_in_words() {
    let app = spawn_app_with(|s| s.webhooks.allow_http = true).await;
    let org = app.create_org("Acme").await;
    let owner = Console::sign_in(&app, &org.owner_token).await;
    let refused = owner
        .post(
            &org_path(&org, "/keys"),
            &[
                ("name", "ci <runner>"),
                ("requestsPerMinute", "0"),
                ("tokensPerDay", "5000"),
                ("scopes-shown", "1"),
                ("scope", "inference"),
                ("models", "gpt-4o-mini, gpt-4o"),
            ],
        )
        .await;
    assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let page = refused.text().await.unwrap();
    assert!(page.contains("requests per minute: use 1 or more"), "{page}");
    for kept in [
        r#"value="ci &#60;runner&#62;""#,
        r#"value="0""#,
        r#"value="5000""#,
        r#"value="gpt-4o-mini, gpt-4o""#,
        r#"value="inference" checked"#,
    ] {
        assert!(page.contains(kept), "{kept} kept");
    }
    let form = page.split("id=\"new-key-form\"").nth(1).unwrap();
    assert!(
        !form.contains(r#"value="api" checked"#),
        "an unticked scope stays unticked"
    );
    // The endpoint form likewise (a private destination is refused).
    let refused = owner
        .post(
            &org_path(&org, "/webhooks"),
            &[
                ("url", "http://127.0.0.1:9/hook"),
                ("description", "on-call pager"),
                ("events", "job.failed"),
            ],
        )
        .await;
    assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let page = refused.text().await.unwrap();
    assert!(page.contains(r#"value="http://127.0.0.1:9/hook""#), "{page}");
    assert!(page.contains(r#"value="on-call pager""#));
    assert!(page.contains(r#"value="job.failed" checked"#));
    assert!(page.contains("url:"), "{page}");
    // No message the console shows is a pattern.
    let flash = page
        .split("class=\"flash error\"")
        .nth(1)
        .and_then(|rest| rest.split("</p>").next())
        .unwrap_or_default();
    for technical in ["^", "\\u", "pattern"] {
        assert!(!flash.contains(technical), "{technical}: {flash}");
    }
}

#[actix_web::test]
async fn the_operators_read_only_view_offers_no_form_it_would_refuse_and_messages_read_either_way() {
    let (app, _provider, org, project, traces) = traced_app().await;
    let trace_id = traces[0]["id"].as_str().unwrap().to_owned();
    let member = Console::sign_in(&app, &org.member_token).await;
    let operator = Console::sign_in(&app, INTERNAL_KEY).await;
    let trace_path = org_path(&org, &format!("/traces/{trace_id}"));
    let list_path = org_path(&org, &format!("/projects/{project}/traces"));
    let forms = [
        "id=\"add-tag\"",
        "id=\"set-score\"",
        "id=\"retention\"",
        "id=\"tag-selected\"",
    ];
    let (member_trace, member_list) = (member.page(&trace_path).await, member.page(&list_path).await);
    let (operator_trace, operator_list) = (operator.page(&trace_path).await, operator.page(&list_path).await);
    for form in forms {
        assert!(
            member_trace.contains(form) || member_list.contains(form),
            "a member has {form}"
        );
        assert!(
            !operator_trace.contains(form) && !operator_list.contains(form),
            "the read-only operator has no {form}"
        );
    }
    assert!(operator_list.contains("Traces are kept forever."));
    // A message's text is laid out by its own direction (right-to-left text included).
    assert!(
        member_trace.contains(r#"class="text" dir="auto""#),
        "{member_trace}"
    );
    assert!(member_list.contains(r#"class="preview-input" dir="auto""#));
}

#[actix_web::test]
async fn shortening_a_projects_retention_says_how_many_traces_it_deletes_first() {
    use sea_orm::{ConnectionTrait, Statement};
    let (app, _provider, org, project, traces) = traced_app().await;
    // Two of the three traces are 40 days old.
    let db = sea_orm::Database::connect(&app.db_url).await.unwrap();
    let old = (chrono::Utc::now() - chrono::Duration::days(40)).to_rfc3339();
    for t in &traces[..2] {
        let sql = match db.get_database_backend() {
            sea_orm::DbBackend::Postgres => "UPDATE traces SET created_at = $1::timestamptz WHERE id = $2",
            _ => "UPDATE traces SET created_at = ? WHERE id = ?",
        };
        db.execute_raw(Statement::from_sql_and_values(
            db.get_database_backend(),
            sql,
            [old.clone().into(), t["id"].as_str().unwrap().to_owned().into()],
        ))
        .await
        .unwrap();
    }
    db.close().await.ok();
    let member = Console::sign_in(&app, &org.member_token).await;
    let path = org_path(&org, &format!("/projects/{project}/retention"));
    let (asked, done) = member.confirm(&path, &[("retentionDays", "30")]).await;
    assert!(asked.contains("deletes the 2 traces of Support"), "{asked}");
    assert!(done.contains("kept 30 days"), "{done}");
    // Nothing would go: saved at once.
    let saved = member.submit(&path, &[("retentionDays", "365")]).await;
    assert!(saved.contains("kept 365 days"), "{saved}");
}

#[actix_web::test]
async fn a_grant_is_confirmed_by_the_organizations_name_and_an_unknown_one_is_refused_first() {
    let app = spawn_app().await;
    let org = app.create_org("Acme Robotics").await;
    let operator = Console::sign_in(&app, INTERNAL_KEY).await;
    let fields = [
        ("orgId", org.org_id.as_str()),
        ("amountCents", "500"),
        ("reason", "goodwill"),
        ("key", "k-1"),
    ];
    let asked = operator.post("/console/operator/grants", &fields).await;
    assert_eq!(asked.status(), StatusCode::OK);
    let asked = asked.text().await.unwrap();
    assert!(asked.contains("organization Acme Robotics"), "{asked}");
    let unknown = uuid::Uuid::new_v4().to_string();
    let refused = operator
        .submit(
            "/console/operator/grants",
            &[
                ("orgId", unknown.as_str()),
                ("amountCents", "500"),
                ("reason", "goodwill"),
                ("key", "k-2"),
            ],
        )
        .await;
    assert!(
        refused.contains("flash error") && refused.contains("organization not found"),
        "{refused}"
    );
    assert!(!refused.contains("id=\"confirm\""));
}
