//! The console for daily work beyond the jobs list (issue 59): grants grouped on the
//! overview with every grant a click away, money written as money, keys' use today against
//! their limits and copy buttons for what is shown once, webhook endpoints edited on their
//! page, a delivery's page, and every project on the Traces page.

use reqwest::StatusCode;
use serde_json::json;

use crate::console::{org_path, Console};
use crate::helpers::*;

#[actix_web::test]
async fn the_overview_groups_grants_by_kind_and_expiry_and_links_every_grant() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    for _ in 0..12 {
        app.fund(&org, 500).await;
    }
    app.post(
        "/api/billing/promo-code",
        &org.api_key,
        &json!({"orgId": org.org_id, "code": "WELCOME10"}),
    )
    .await;
    let grants = json_of(
        app.get(&format!("/api/billing/grants?orgId={}", org.org_id), &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await["grants"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(grants, 13);
    let console = Console::sign_in(&app, &org.api_key).await;
    let overview = console.page(&org_path(&org, "")).await;
    // Twelve top-ups, one line with their sum; the promo on its own.
    assert!(
        overview.contains("$60.00</span> top-up (12 grants) never expires"),
        "{overview}"
    );
    let lines = regex::Regex::new(r#"<ul id="credits" class="credits">(.*?)</ul>"#)
        .unwrap()
        .captures(&overview)
        .unwrap()[1]
        .matches("<li>")
        .count();
    assert_eq!(lines, 2, "{overview}");
    assert!(overview.contains("All 13 active grant(s)"));
    // Every grant on the credits page, as the API lists them.
    let page = console.page(&org_path(&org, "/credits")).await;
    assert_eq!(page.matches(r#"<tr class="grant">"#).count(), grants);
    assert!(page.contains("13 grant(s)") && page.contains("$5.00"));
    let active = console.page(&org_path(&org, "/credits?state=active")).await;
    assert_eq!(active.matches(r#"<tr class="grant">"#).count(), 13);
    let ended = console.page(&org_path(&org, "/credits?state=ended")).await;
    assert!(ended.contains("No grants in this state."));
    // The ledger says how many entries it holds, of a kind or of every kind.
    let ledger = console.page(&org_path(&org, "/ledger?kind=topup")).await;
    assert!(
        ledger.contains(r#"id="ledger-total">12 entries of kind topup."#),
        "{ledger}"
    );
    let promo = console.page(&org_path(&org, "/ledger?kind=promo")).await;
    assert!(
        promo.contains(r#"id="ledger-total">1 entry of kind promo."#),
        "{promo}"
    );
    let bad = console.get(&org_path(&org, "/credits?state=bogus")).await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    assert!(bad
        .text()
        .await
        .unwrap()
        .contains("which is not one of: active, ended"));
    // Another organization's credits are not this member's.
    let other = app.create_org("Other").await;
    let theirs = console.get(&org_path(&other, "/credits")).await;
    assert!(theirs.status().is_client_error());
}

#[actix_web::test]
async fn a_keys_open_streams_show_against_its_limit() {
    use sea_orm::{ActiveModelTrait, Set};
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let (key_id, _) = crate::keys::key_with(
        &app,
        &org,
        json!({"name": "streamer", "limits": {"concurrentStreams": 3}}),
    )
    .await;
    let console = Console::sign_in(&app, &org.owner_token).await;
    let page = console.page(&org_path(&org, "/keys")).await;
    assert!(
        page.contains(r#"id="keys-total">"#),
        "the keys page says how many"
    );
    assert!(
        page.contains(r#"<td class="streams">0 open of 3 at once</td>"#),
        "{page}"
    );
    // Two streams open on two instances (as the limiter counts them), one on a third
    // instance that stopped counting a while ago.
    let db = sea_orm::Database::connect(&app.db_url).await.unwrap();
    let now = chrono::Utc::now();
    for (instance, active, seen) in [
        ("a", 1, now),
        ("b", 1, now),
        ("gone", 4, now - chrono::Duration::minutes(5)),
    ] {
        entities::api_key_stream::ActiveModel {
            key_id: Set(keel_core::domain::ApiKeyId::parse(&key_id).unwrap()),
            instance: Set(instance.into()),
            active: Set(active),
            seen_at: Set(seen),
        }
        .insert(&db)
        .await
        .unwrap();
    }
    let page = console.page(&org_path(&org, "/keys")).await;
    assert!(
        page.contains(r#"<td class="streams">2 open of 3 at once</td>"#),
        "{page}"
    );
    // The copy button for the key shown once is there (the script shows it).
    let created = console
        .submit(&org_path(&org, "/keys"), &[("name", "another")])
        .await;
    assert!(created.contains(r#"data-copy="new-key""#), "{created}");
}

#[actix_web::test]
async fn an_endpoint_is_edited_on_its_page_by_the_apis_rules_and_its_deliveries_filtered() {
    let app = crate::webhooks::local_app().await;
    let org = app.create_org("Acme").await;
    let (_receiver, url) = crate::fakes::FakeJson::start(|_| crate::fakes::Reply::Json(200, json!({})));
    let created = crate::webhooks::create(
        &app,
        &org,
        json!({"url": format!("{url}/hooks"), "events": ["job.failed"], "description": "ops"}),
    )
    .await;
    let id = created["endpointId"].as_str().unwrap().to_owned();
    let console = Console::sign_in(&app, &org.member_token).await;
    let path = org_path(&org, &format!("/webhooks/{id}"));
    let page = console.page(&path).await;
    assert!(page.contains(r#"id="endpoint-form""#) && page.contains(r#"name="url" type="url""#));
    assert!(
        page.contains(r#"value="job.failed" id="edit-event-job.failed" checked"#),
        "{page}"
    );
    // Saved from the form: what the API then reads.
    let saved = console
        .submit(
            &format!("{path}/edit"),
            &[
                ("url", &format!("{url}/v2")),
                ("events", "job.failed"),
                ("events", "webhook.test"),
                ("description", ""),
                ("enabled", "no"),
            ],
        )
        .await;
    assert!(saved.contains("Endpoint saved."), "{saved}");
    let read = json_of(
        app.get(&format!("/api/webhooks/endpoints/{id}"), &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(read["url"], format!("{url}/v2"));
    assert_eq!(read["events"], json!(["job.failed", "webhook.test"]));
    assert_eq!(read["description"], serde_json::Value::Null);
    assert_eq!(read["enabled"], false);
    // Refused as the API refuses it: said on the page, nothing changed.
    for (fields, says) in [
        (vec![("url", "ftp://nope"), ("events", "job.failed")], "url"),
        (
            vec![("url", "http://127.0.0.1:9/x"), ("events", "no.such")],
            "events",
        ),
        (vec![("url", "http://127.0.0.1:9/x")], "events"),
    ] {
        let refused = console.submit(&format!("{path}/edit"), &fields).await;
        assert!(
            refused.contains("flash error") && refused.contains(says),
            "{refused}"
        );
    }
    let unchanged = json_of(
        app.get(&format!("/api/webhooks/endpoints/{id}"), &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(unchanged["url"], format!("{url}/v2"));
    // Filters: by status and by event type; unknown values are a 400 page.
    let none = console.page(&format!("{path}?status=failed")).await;
    assert!(none.contains("No deliveries match this filter."));
    assert!(
        none.contains(r#"id="deliveries-total">0 deliveries match the filter."#),
        "{none}"
    );
    let listed = console.page(&org_path(&org, "/webhooks")).await;
    assert!(
        listed.contains(r#"id="endpoints-total">1 endpoint(s)."#),
        "{listed}"
    );
    let bad = console.get(&format!("{path}?status=bogus")).await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    let bad = console.get(&format!("{path}?event=no.such")).await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    // Another organization's endpoint cannot be edited.
    let other = app.create_org("Other").await;
    let theirs = Console::sign_in(&app, &other.member_token).await;
    let refused = theirs
        .post(
            &format!("{path}/edit"),
            &[("url", "http://127.0.0.1:9/x"), ("events", "*")],
        )
        .await;
    assert!(refused.status().is_client_error() || refused.status() == StatusCode::SEE_OTHER);
    let still = json_of(
        app.get(&format!("/api/webhooks/endpoints/{id}"), &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(still["url"], format!("{url}/v2"));
}

/// A trace as the API reads it (its tags and scores included).
async fn trace_of(app: &TestApp, org: &TestOrg, id: &str) -> serde_json::Value {
    json_of(
        app.get(&format!("/api/traces/{id}"), &org.api_key).await,
        StatusCode::OK,
    )
    .await
}

#[actix_web::test]
async fn traces_show_scores_filter_by_them_act_on_every_match_and_page_within_the_filter() {
    let (app, _provider, org, project, traces) = crate::console::traced_app().await;
    let ids: Vec<String> = traces
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect();
    let plain: Vec<String> = traces
        .iter()
        .filter(|t| t["model"] == "gpt-plain")
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(plain.len(), 2);
    for (id, value) in [(&ids[0], 0.9), (&ids[1], 0.2)] {
        app.put(
            &format!("/api/traces/{id}/scores/quality"),
            &org.api_key,
            &json!({"value": value}),
        )
        .await;
    }
    let empty = app.create_project(&org, "Brand new").await;
    let console = Console::sign_in(&app, &org.member_token).await;
    let list = org_path(&org, &format!("/projects/{project}/traces"));

    // Every project listed, one without traces too (its page sets its retention).
    let projects = console.page(&org_path(&org, "/traces")).await;
    assert!(
        projects.contains("Brand new") && projects.contains("no traces yet"),
        "{projects}"
    );
    let empty_page = console
        .page(&org_path(&org, &format!("/projects/{empty}/traces")))
        .await;
    assert!(empty_page.contains(r#"id="retention""#) && empty_page.contains("No traces recorded yet."));

    // Scores as a column; minScore filters; the total says how many match.
    let page = console.page(&list).await;
    assert!(page.contains("<strong>3</strong> trace(s) match."), "{page}");
    assert!(page.contains(r#"<code class="score">quality 0.9</code>"#));
    let good = console.page(&format!("{list}?minScore=quality:0.5")).await;
    assert_eq!(good.matches(r#"name="traceIds""#).count(), 1);
    assert!(good.contains(&ids[0]) && good.contains("<strong>1</strong> trace(s) match."));
    let bad = console.get(&format!("{list}?minScore=quality")).await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);

    // Tag every trace the filter keeps (model gpt-plain), none ticked: exactly those.
    let tagged = console
        .submit(
            &org_path(&org, &format!("/projects/{project}/tag")),
            &[
                ("scope", "matching"),
                ("filter_model", "gpt-plain"),
                ("bulkTag", "plain"),
            ],
        )
        .await;
    assert!(tagged.contains("Tagged 2 traces."), "{tagged}");
    for id in &ids {
        let tags = trace_of(&app, &org, id).await["tags"].clone();
        assert_eq!(tags == json!(["plain"]), plain.contains(id), "{id}: {tags}");
    }
    // Score every match of a filter; then one ticked.
    let scored = console
        .submit(
            &org_path(&org, &format!("/projects/{project}/score")),
            &[
                ("scope", "matching"),
                ("filter_tag", "plain"),
                ("scoreName", "reviewed"),
                ("scoreValue", "1"),
            ],
        )
        .await;
    assert!(scored.contains("Scored 2 traces"), "{scored}");
    for id in &plain {
        assert_eq!(trace_of(&app, &org, id).await["scores"]["reviewed"]["value"], 1.0);
    }
    let refused = console
        .submit(
            &org_path(&org, &format!("/projects/{project}/score")),
            &[
                ("traceIds", &ids[0]),
                ("scoreName", "reviewed"),
                ("scoreValue", "lots"),
            ],
        )
        .await;
    assert!(refused.contains("flash error"), "{refused}");
    // Export every match: the API's export of the same traces.
    let exported = console
        .post(
            &org_path(&org, &format!("/projects/{project}/export")),
            &[
                ("scope", "matching"),
                ("filter_tag", "plain"),
                ("format", "records"),
            ],
        )
        .await;
    assert_eq!(exported.status(), StatusCode::OK);
    let lines = exported
        .text()
        .await
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .count();
    assert_eq!(lines, 2);

    // A trace's previous and next stay within the filter it was opened from.
    let newest_plain = &plain[0];
    let oldest_plain = &plain[1];
    let opened = console
        .page(&org_path(
            &org,
            &format!("/traces/{newest_plain}?model=gpt-plain"),
        ))
        .await;
    assert!(
        opened.contains(&format!(
            "/traces/{oldest_plain}?model=gpt-plain\" rel=\"next\" id=\"older-trace\""
        )),
        "{opened}"
    );
    assert!(!opened.contains("id=\"newer-trace\""));
    assert!(opened.contains(&format!(
        "/projects/{project}/traces?model=gpt-plain\" id=\"back-to-list\""
    )));
    let unfiltered = console
        .page(&org_path(&org, &format!("/traces/{}", ids[1])))
        .await;
    assert!(unfiltered.contains("id=\"newer-trace\"") && unfiltered.contains("id=\"older-trace\""));
}

#[actix_web::test]
async fn the_operator_sets_a_share_in_place_reads_names_and_honest_percentiles_and_an_hourly_chart() {
    let app = spawn_app().await;
    let org = app.create_org("Acme Robotics").await;
    app.fund(&org, 1000).await;
    let project = app.create_project(&org, "Vision").await;
    for _ in 0..3 {
        crate::queue::tracer(&app, &org, &project).await;
    }
    crate::queue::claim(&app, "worker-1", "tracer", 1).await;
    let operator = Console::sign_in(&app, INTERNAL_KEY).await;
    let page = operator.page("/console/operator/queue").await;
    assert!(
        page.contains(&format!(
            r#"<span title="{}" class="org-name">Acme Robotics</span>"#,
            org.org_id
        )),
        "{page}"
    );
    assert!(page.contains(&format!(r#"<span title="{}">Acme Robotics</span>"#, org.org_id)));
    // A wait percentile is the range of the bucket that holds it, never a bare bound.
    let row = regex::Regex::new(r#"(?s)<tr id="latency-tracer">(.*?)</tr>"#)
        .unwrap()
        .captures(&page)
        .unwrap()[1]
        .to_owned();
    assert!(row.contains("under ") || row.contains('–'), "{row}");
    assert!(page.contains("Job attempts ended per hour"));

    // Saved after a confirmation, with the API's bounds; the API then reads it.
    let share = format!("/console/operator/orgs/{}/queue", org.org_id);
    let (asked, done) = operator
        .confirm(&share, &[("weight", "3"), ("maxRunning", "2")])
        .await;
    assert!(
        asked.contains("Acme Robotics: weight 3 and a cap of 2 running jobs."),
        "{asked}"
    );
    assert!(
        done.contains("Acme Robotics: weight 3, a cap of 2 running jobs."),
        "{done}"
    );
    let read = json_of(
        app.get(&format!("/api/internal/orgs/{}/queue", org.org_id), INTERNAL_KEY)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        (read["weight"].as_i64(), read["maxRunning"].as_i64()),
        (Some(3), Some(2))
    );
    for fields in [
        [("weight", "0"), ("maxRunning", "2")],
        [("weight", "3"), ("maxRunning", "-1")],
        [("weight", "x"), ("maxRunning", "")],
    ] {
        let refused = operator.submit(&share, &fields).await;
        assert!(refused.contains("flash error"), "{fields:?}: {refused}");
    }
    let unchanged = json_of(
        app.get(&format!("/api/internal/orgs/{}/queue", org.org_id), INTERNAL_KEY)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(unchanged["weight"], 3);
    // Empty cap: back to the default.
    let (_, done) = operator.confirm(&share, &[("weight", "1")]).await;
    assert!(done.contains("the default cap"), "{done}");
    // A member cannot.
    let member = Console::sign_in(&app, &org.member_token).await;
    let refused = member
        .post(&share, &[("weight", "100"), ("confirmed", "yes")])
        .await;
    assert!(refused.status().is_client_error(), "{}", refused.status());
}

#[actix_web::test]
async fn the_operator_pages_failed_jobs_filters_them_by_organization_retries_every_match_and_searches_organizations(
) {
    let app = spawn_app().await;
    let acme = app.create_org("Acme Robotics").await;
    let other = app.create_org("Other Labs").await;
    for org in [&acme, &other] {
        app.fund(org, 10_000).await;
    }
    let acme_project = app.create_project(&acme, "Vision").await;
    let other_project = app.create_project(&other, "Speech").await;
    for _ in 0..53 {
        crate::queue::tracer(&app, &acme, &acme_project).await;
    }
    crate::queue::tracer(&app, &other, &other_project).await;
    let claimed = crate::queue::claim(&app, "worker-1", "tracer", 100).await;
    assert_eq!(claimed.len(), 54);
    for job in &claimed {
        let failed = app
            .post(
                "/api/training/internal/jobs/failed",
                INTERNAL_KEY,
                &json!({"job_id": job["job_id"], "worker_id": "worker-1", "error": "out of memory"}),
            )
            .await;
        assert!(failed.status().is_success());
    }
    let operator = Console::sign_in(&app, INTERNAL_KEY).await;
    let first = operator.page("/console/operator/failed").await;
    assert!(
        first.contains("54 failed job(s)") && first.contains("page 1 of 2"),
        "{first}"
    );
    assert_eq!(first.matches(r#"<tr id="failed-"#).count(), 50);
    assert!(first.contains(r#"class="org-name">Acme Robotics</span>"#));
    let next = regex::Regex::new(r#"href="([^"]+)" rel="next" id="next""#)
        .unwrap()
        .captures(&first)
        .unwrap()[1]
        .replace("&amp;", "&");
    let second = operator.page(&next).await;
    assert_eq!(second.matches(r#"<tr id="failed-"#).count(), 4);
    // By organization (chosen by name): only its jobs, and the total says so.
    assert!(
        first.contains(&format!(
            r#"<option value="{0}" title="{0}" >Other Labs</option>"#,
            other.org_id
        )),
        "{first}"
    );
    let theirs = operator
        .page(&format!("/console/operator/failed?org={}", other.org_id))
        .await;
    assert!(theirs.contains("1 failed job(s)"), "{theirs}");
    // Retry every match of the filter (more than a page), once confirmed.
    let (asked, done) = operator
        .confirm(
            "/console/operator/failed/retry",
            &[("scope", "all"), ("filter_org", acme.org_id.as_str())],
        )
        .await;
    assert!(asked.contains("53 job(s) go back to the queue"), "{asked}");
    assert!(done.contains("53 job(s) queued again."), "{done}");
    let left = operator.page("/console/operator/failed").await;
    assert!(left.contains("1 failed job(s)"), "{left}");
    assert!(operator.get("/console/operator/failed?page=0").await.status() == StatusCode::BAD_REQUEST);

    // The organizations list searches by name, slug or id.
    let found = operator.page("/console/orgs?q=robot").await;
    assert!(
        found.contains("Acme Robotics") && !found.contains("Other Labs"),
        "{found}"
    );
    assert!(found.contains("1 organization(s) match."));
    let by_id = operator.page(&format!("/console/orgs?q={}", other.org_id)).await;
    assert!(by_id.contains("Other Labs") && !by_id.contains("Acme Robotics"));
    let none = operator.page("/console/orgs?q=zzz").await;
    assert!(none.contains("No organization matches."));
}
