//! Traces as data (issue 44): the list (previews, search, filters, paging), one trace, tags
//! and scores (filtering the list and the export), and a project's retention.

use std::collections::HashSet;

use chrono::Utc;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::*;
use crate::proxy::{chat, proxy_app, proxy_app_with, raw_traces, sdk_request};

async fn list(app: &TestApp, org: &TestOrg, query: &str) -> Value {
    json_of(
        app.get(&format!("/api/traces?{query}"), &org.api_key).await,
        StatusCode::OK,
    )
    .await
}

fn ids(page: &Value) -> Vec<String> {
    page["traces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["traceId"].as_str().unwrap().to_owned())
        .collect()
}

fn q(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// Three calls through the proxy, recorded: a refund, a password reset, one with a secret.
async fn record_three(app: &TestApp, org: &TestOrg, project: &str) -> [String; 3] {
    let asks = [
        "Where is my refund-8c2b? It was a late delivery.".to_owned(),
        "How do I reset my password?".to_owned(),
        // A secret in a message: redacted before anything is stored, so never searchable.
        format!("my key is {} please keep it", org.api_key),
    ];
    for ask in &asks {
        let call = sdk_request(app, org, Some(project), &chat("gpt-4o-mini", ask))
            .send()
            .await
            .unwrap();
        assert_eq!(call.status(), StatusCode::OK);
    }
    raw_traces(app, org, project, asks.len()).await;
    asks
}

/// The searches of [`recorded_calls_are_listed_with_previews_found_by_their_words_and_read_whole`]'s
/// three calls: a word only in one trace finds it alone; hyphens, operators and stray quotes
/// are words and separators, never errors; a phrase is its words in order; a redacted secret
/// is not searchable.
async fn searches_find_the_refund_alone(app: &TestApp, org: &TestOrg, project: &str, refund_id: &str) {
    for search in [
        "refund",
        "REFUND-8c2b",
        "8c2b refund",
        "\"late delivery\"",
        "refund \"late",
        "refund* OR (x",
    ] {
        let found = list(app, org, &format!("projectId={project}&q={}", q(search))).await;
        let expected: Vec<String> = match search {
            "refund* OR (x" => vec![],
            _ => vec![refund_id.to_owned()],
        };
        assert_eq!(ids(&found), expected, "q={search}");
    }
    assert!(ids(&list(
        app,
        org,
        &format!("projectId={project}&q={}", q("\"delivery late\""))
    )
    .await)
    .is_empty());
    assert_eq!(
        ids(&list(app, org, &format!("projectId={project}&q=paris")).await).len(),
        3
    );
    let secret_tail = &org.api_key[8..];
    let leaked = list(app, org, &format!("projectId={project}&q={}", q(secret_tail))).await;
    assert!(ids(&leaked).is_empty(), "a redacted secret is not searchable");
    assert_eq!(
        ids(&list(app, org, &format!("projectId={project}&q=redacted+keep")).await).len(),
        1
    );
    // Punctuation alone searches nothing: the whole list.
    assert_eq!(
        ids(&list(app, org, &format!("projectId={project}&q={}", q("*** :: \"\""))).await).len(),
        3
    );
}

#[actix_web::test]
async fn recorded_calls_are_listed_with_previews_found_by_their_words_and_read_whole() {
    let (app, _provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "support").await;
    let asks = record_three(&app, &org, &project).await;

    let all = list(&app, &org, &format!("projectId={project}")).await;
    let traces = all["traces"].as_array().unwrap();
    assert_eq!(traces.len(), 3);
    assert_eq!(all["nextCursor"], Value::Null);
    // Newest first, with previews of the last user message and the reply.
    assert_eq!(traces[2]["preview"]["input"], asks[0]);
    assert_eq!(traces[2]["preview"]["output"], "Paris is the capital of France.");
    assert_eq!(traces[2]["status"], "ok");
    assert_eq!(traces[2]["promptTokens"], 24);
    assert_eq!(traces[2]["streamed"], false);
    assert_eq!(traces[2]["tags"], json!([]));
    assert_eq!(traces[2]["scores"], json!({}));
    assert!(
        !all.to_string().contains(&org.api_key),
        "the list shows no secret"
    );
    let refund_id = traces[2]["traceId"].as_str().unwrap().to_owned();

    searches_find_the_refund_alone(&app, &org, &project, &refund_id).await;

    // One trace, whole: request and response as stored (redacted).
    let one = json_of(
        app.get(&format!("/api/traces/{refund_id}"), &org.api_key).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(one["traceId"], refund_id.as_str());
    assert_eq!(one["request"]["messages"][0]["content"], asks[0]);
    assert_eq!(
        one["response"]["choices"][0]["message"]["content"],
        "Paris is the capital of France."
    );
    // Another organization's trace, or a project, is 404.
    let other = app.create_org("Globex").await;
    assert_error(
        app.get(&format!("/api/traces/{refund_id}"), &other.api_key).await,
        StatusCode::NOT_FOUND,
    )
    .await;
    assert_error(
        app.get(&format!("/api/traces?projectId={project}"), &other.api_key)
            .await,
        StatusCode::NOT_FOUND,
    )
    .await;
    assert_error(
        app.get("/api/traces/not-a-trace", &org.api_key).await,
        StatusCode::NOT_FOUND,
    )
    .await;
}

#[actix_web::test]
async fn search_finds_traces_before_the_indexer_reaches_them_and_after() {
    // This instance runs no search indexer: its traces stay unindexed, found by their words
    // alone.
    let (app, _provider) = proxy_app_with(|s| s.traces.search_indexer = false).await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "support").await;
    record_three(&app, &org, &project).await;
    let all = list(&app, &org, &format!("projectId={project}")).await;
    let refund_id = all["traces"][2]["traceId"].as_str().unwrap().to_owned();
    let metrics = app.metrics_text().await;
    assert_eq!(metric(&metrics, "keel_traces_indexed_total"), 0.0);
    assert!(
        metric(&metrics, "keel_traces_index_lag_seconds") > 0.0,
        "{metrics}"
    );
    searches_find_the_refund_alone(&app, &org, &project, &refund_id).await;

    // A second instance runs the indexer: it indexes the three, and the same searches now
    // go through the index (PostgreSQL's GIN, SQLite's FTS5) with the same answers.
    let indexing = spawn_on(TestDb::reuse(&app.db_url), test_settings(&app.db_url)).await;
    let metrics = || async { indexing.metrics_text().await };
    assert!(
        eventually(|| async {
            let metrics = metrics().await;
            metric(&metrics, "keel_traces_indexed_total") == 3.0
                && metric(&metrics, "keel_traces_index_lag_seconds") == 0.0
        })
        .await,
        "the indexer never caught up:\n{}",
        metrics().await
    );
    assert_eq!(
        metric(&app.metrics_text().await, "keel_traces_index_lag_seconds"),
        0.0
    );
    searches_find_the_refund_alone(&app, &org, &project, &refund_id).await;
}

/// A word is found as it is written, accents and all (lowercase), whether the indexer has
/// reached its trace or not, on both databases: `cafe` is not `café`.
#[actix_web::test]
async fn a_word_with_accents_is_found_as_written_before_and_after_indexing() {
    let (app, _provider) = proxy_app_with(|s| s.traces.search_indexer = false).await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "support").await;
    for ask in ["un café noir", "a cafe latte"] {
        let call = sdk_request(&app, &org, Some(&project), &chat("gpt-4o-mini", ask))
            .send()
            .await
            .unwrap();
        assert_eq!(call.status(), StatusCode::OK);
    }
    raw_traces(&app, &org, &project, 2).await;
    let all = list(&app, &org, &format!("projectId={project}")).await;
    let (latte, noir) = (ids(&all)[0].clone(), ids(&all)[1].clone());
    let searches = || async {
        for (search, expected) in [
            ("cafe", vec![latte.clone()]),
            ("café", vec![noir.clone()]),
            ("CAFÉ noir", vec![noir.clone()]),
            ("\"cafe latte\"", vec![latte.clone()]),
        ] {
            let found = list(&app, &org, &format!("projectId={project}&q={}", q(search))).await;
            assert_eq!(ids(&found), expected, "q={search}");
        }
    };
    searches().await;
    let indexing = spawn_on(TestDb::reuse(&app.db_url), test_settings(&app.db_url)).await;
    assert!(
        eventually(|| async {
            let metrics = indexing.metrics_text().await;
            metric(&metrics, "keel_traces_indexed_total") == 2.0
                && metric(&metrics, "keel_traces_index_lag_seconds") == 0.0
        })
        .await
    );
    searches().await;
}

#[actix_web::test]
async fn on_sqlite_a_trace_deleted_before_the_indexer_reached_it_leaves_the_index_whole() {
    use sea_orm::ConnectionTrait;
    if postgres() {
        say_skipped("is SQLite's (its FTS5 index and its mark)");
        return;
    }
    let (app, _provider) = proxy_app_with(|s| s.traces.search_indexer = false).await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "support").await;
    let refund = record_three(&app, &org, &project).await;
    let all = list(&app, &org, &format!("projectId={project}")).await;
    let listed = ids(&all);
    // Two are deleted before any is indexed (as retention would), one after.
    let db = sea_orm::Database::connect(&app.db_url).await.unwrap();
    db.execute_unprepared(&format!(
        "DELETE FROM traces WHERE id IN ('{}', '{}')",
        listed[0], listed[1]
    ))
    .await
    .unwrap();
    let indexing = spawn_on(TestDb::reuse(&app.db_url), test_settings(&app.db_url)).await;
    assert!(
        eventually(|| async {
            metric(&indexing.metrics_text().await, "keel_traces_index_lag_seconds") == 0.0
        })
        .await
    );
    db.execute_unprepared("INSERT INTO traces_fts(traces_fts) VALUES ('integrity-check')")
        .await
        .expect("the FTS5 index is whole");
    let found = list(&app, &org, &format!("projectId={project}&q=refund")).await;
    assert_eq!(ids(&found), vec![listed[2].clone()], "{}", refund[0]);
    db.execute_unprepared(&format!("DELETE FROM traces WHERE id = '{}'", listed[2]))
        .await
        .unwrap();
    db.execute_unprepared("INSERT INTO traces_fts(traces_fts) VALUES ('integrity-check')")
        .await
        .expect("the FTS5 index is whole after deleting an indexed trace");
    assert!(ids(&list(&app, &org, &format!("projectId={project}&q=refund")).await).is_empty());
    db.close().await.ok();
}

#[actix_web::test]
async fn traces_recorded_before_words_were_kept_get_them_and_their_previews() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "support").await;
    // Two traces as an older keel wrote them: no words, no previews.
    let db = sea_orm::Database::connect(app.db_url.as_str()).await.unwrap();
    let mut old = Vec::new();
    for (n, ask) in ["my parcel 77x went missing", "unrelated question"]
        .iter()
        .enumerate()
    {
        let mut trace = crate::export::trace(
            uuid::Uuid::new_v4().to_string(),
            &org,
            &project,
            "m",
            200,
            Utc::now() - chrono::Duration::days(2 - n as i64),
        );
        trace.request = json!({"model": "m", "messages": [
            {"role": "system", "content": "hidden instructions"},
            {"role": "user", "content": ask},
        ]})
        .to_string();
        trace.response = Some(
            json!({"choices": [{"message": {"role": "assistant", "content": format!("About: {ask}")}}]})
                .to_string(),
        );
        (trace.search_text, trace.preview_input, trace.preview_output) = (None, None, None);
        old.push(trace);
    }
    keel_core::fixtures::insert_traces(&db, &old).await.unwrap();
    db.close().await.ok();
    let parcel = old[0].id.to_string();

    // The indexer gives them their words (and on PostgreSQL indexes them): found by a word of
    // the question and a phrase of the reply, never by the system prompt; previews shown.
    let query = format!("projectId={project}&q=parcel");
    let search = || list(&app, &org, &query);
    assert!(
        eventually(|| async {
            let metrics = app.metrics_text().await;
            !ids(&search().await).is_empty() && metric(&metrics, "keel_traces_index_lag_seconds") == 0.0
        })
        .await,
        "the old traces never got their words"
    );
    let found = search().await;
    assert_eq!(ids(&found), std::slice::from_ref(&parcel));
    assert_eq!(
        found["traces"][0]["preview"]["input"],
        "my parcel 77x went missing"
    );
    assert_eq!(
        found["traces"][0]["preview"]["output"],
        "About: my parcel 77x went missing"
    );
    assert_eq!(
        ids(&list(
            &app,
            &org,
            &format!("projectId={project}&q={}", q("\"about my parcel\""))
        )
        .await),
        [parcel]
    );
    assert!(ids(&list(&app, &org, &format!("projectId={project}&q=hidden")).await).is_empty());
    assert_eq!(
        ids(&list(&app, &org, &format!("projectId={project}&q=question")).await).len(),
        1
    );
}

#[actix_web::test]
async fn cursor_paging_over_2500_traces_returns_each_once_and_bad_queries_are_422() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "many").await;
    let db = sea_orm::Database::connect(app.db_url.as_str()).await.unwrap();
    let newest = Utc::now();
    let mut expected = HashSet::new();
    for chunk in 0..5 {
        let rows: Vec<_> = (0..500)
            .map(|i| {
                let id = uuid::Uuid::new_v4().to_string();
                expected.insert(id.clone());
                // Two to a millisecond: ties are broken by id.
                let at = newest - chrono::Duration::milliseconds(((chunk * 500 + i) / 2) as i64);
                crate::export::trace(id, &org, &project, "m-ok", 200, at)
            })
            .collect();
        keel_core::fixtures::insert_traces(&db, &rows).await.unwrap();
    }
    db.close().await.ok();
    let mut seen = HashSet::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut query = format!("projectId={project}&limit=200");
        if let Some(cursor) = &cursor {
            query.push_str(&format!("&cursor={cursor}"));
        }
        let page = list(&app, &org, &query).await;
        for id in ids(&page) {
            assert!(seen.insert(id), "a trace came twice");
        }
        pages += 1;
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen, expected);
    assert_eq!(pages, 13);
    // The same walk with searches every trace matches, one word and two (more matches than
    // the search's probe: the newest-first walk); then the words of one trace's id, which
    // only it holds (the probe's ids).
    for (q, count) in [("question", 2500), ("question answer", 2500)] {
        let mut seen = HashSet::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut query = format!("projectId={project}&limit=200&q={q}");
            if let Some(cursor) = &cursor {
                query.push_str(&format!("&cursor={cursor}"));
            }
            let page = list(&app, &org, &query.replace(' ', "+")).await;
            for id in ids(&page) {
                assert!(seen.insert(id), "a trace came twice");
            }
            match page["nextCursor"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => break,
            }
        }
        assert_eq!(seen.len(), count, "q={q}");
    }
    let one = expected.iter().next().unwrap().replace('-', " ");
    let found = list(&app, &org, &format!("projectId={project}&q={}", q(&one))).await;
    assert_eq!(ids(&found).len(), 1, "the words of one trace's id find it alone");
    assert_eq!(
        ids(&list(&app, &org, &format!("projectId={project}")).await).len(),
        50
    );

    for bad in [
        "limit=0",
        "limit=201",
        "minScore=quality",
        "minScore=quality:high",
        "minScore=Quality:1",
        "tag=Not%20a%20tag",
        "tag=",
        "cursor=nonsense",
        "status=fine",
        "since=yesterday",
    ] {
        let response = app
            .get(&format!("/api/traces?projectId={project}&{bad}"), &org.api_key)
            .await;
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
    }
}

#[actix_web::test]
async fn tags_and_scores_round_trip_filter_the_list_and_the_export_and_are_bounded() {
    let (app, _provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "graded").await;
    for ask in ["one", "two", "three"] {
        sdk_request(&app, &org, Some(&project), &chat("gpt-4o-mini", ask))
            .send()
            .await
            .unwrap();
    }
    raw_traces(&app, &org, &project, 3).await;
    let all = ids(&list(&app, &org, &format!("projectId={project}")).await);
    let (a, b) = (&all[0], &all[1]);

    let tagged = json_of(
        app.post(
            &format!("/api/traces/{a}/tags"),
            &org.api_key,
            &json!({"add": ["good", "refund:v2"]}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(tagged["tags"], json!(["good", "refund:v2"]));
    let tagged = json_of(
        app.post(
            &format!("/api/traces/{a}/tags"),
            &org.api_key,
            &json!({"remove": ["refund:v2"]}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(tagged["tags"], json!(["good"]));
    let bulk = json_of(
        app.post(
            "/api/traces/tags",
            &org.api_key,
            &json!({"traceIds": [a, b, uuid::Uuid::new_v4().to_string()], "add": ["batch-1"]}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(bulk, json!({"updated": 2, "notFound": 1}));
    // Text that is no trace id is the id's own 422, wherever a list of them is sent.
    for (path, body) in [
        (
            "/api/traces/tags",
            json!({"traceIds": [a, "nope"], "add": ["batch-1"]}),
        ),
        ("/api/traces/export", json!({"traceIds": [a, "nope"]})),
    ] {
        let refused = json_of(
            app.post(path, &org.api_key, &body).await,
            StatusCode::UNPROCESSABLE_ENTITY,
        )
        .await;
        let issue = refused["detail"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["loc"] == json!(["body", "traceIds", 1]))
            .unwrap_or_else(|| panic!("{path}: {refused}"))
            .clone();
        assert_eq!(issue["type"], "uuid_parsing", "{path}: {refused}");
    }

    let scored = json_of(
        app.put(
            &format!("/api/traces/{a}/scores/quality"),
            &org.api_key,
            &json!({"value": 0.9, "comment": "<b>crisp</b>"}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        scored["scores"],
        json!({"quality": {"value": 0.9, "comment": "<b>crisp</b>"}})
    );
    app.put(
        &format!("/api/traces/{b}/scores/quality"),
        &org.api_key,
        &json!({"value": 0.2}),
    )
    .await;
    app.put(
        &format!("/api/traces/{b}/scores/tone"),
        &org.api_key,
        &json!({"value": -1}),
    )
    .await;
    let deleted = json_of(
        app.delete(&format!("/api/traces/{b}/scores/tone"), &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        deleted["scores"],
        json!({"quality": {"value": 0.2, "comment": null}})
    );

    // They show in the list and filter it...
    let page = list(&app, &org, &format!("projectId={project}&tag=good")).await;
    assert_eq!(ids(&page), vec![a.clone()]);
    assert_eq!(page["traces"][0]["tags"], json!(["batch-1", "good"]));
    assert_eq!(page["traces"][0]["scores"]["quality"]["value"], 0.9);
    assert_eq!(
        ids(&list(&app, &org, &format!("projectId={project}&tag=batch-1")).await).len(),
        2
    );
    assert_eq!(
        ids(&list(&app, &org, &format!("projectId={project}&minScore=quality:0.5")).await),
        vec![a.clone()]
    );
    assert_eq!(
        ids(&list(&app, &org, &format!("projectId={project}&minScore=quality:0")).await).len(),
        2
    );
    // ...and the export, whose raw rows carry them.
    let export = json_of(
        app.get(
            &format!("/api/traces/export?project_id={project}&format=raw&tag=batch-1&minScore=quality:0.5"),
            &org.api_key,
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(export["count"], 1);
    assert_eq!(export["records"][0]["id"], a.as_str());
    assert_eq!(export["records"][0]["tags"], json!(["batch-1", "good"]));
    assert_eq!(
        export["records"][0]["scores"]["quality"]["comment"],
        "<b>crisp</b>"
    );
    let selection = json_of(
        app.post(
            "/api/traces/export",
            &org.api_key,
            &json!({"traceIds": [a, b], "format": "raw", "tag": "good"}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(selection["count"], 1);

    // Bounds: a bad tag or name, nothing to change, the 21st tag or score: 422; another
    // organization's trace: 404.
    for body in [
        json!({"add": ["Bad Tag"]}),
        json!({}),
        json!({"add": [], "remove": []}),
        json!({"add": ["x".repeat(51)]}),
    ] {
        let response = app
            .post(&format!("/api/traces/{a}/tags"), &org.api_key, &body)
            .await;
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    }
    let twenty: Vec<String> = (0..18).map(|i| format!("t{i}")).collect();
    json_of(
        app.post(
            &format!("/api/traces/{a}/tags"),
            &org.api_key,
            &json!({"add": twenty}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    let over = app
        .post(
            &format!("/api/traces/{a}/tags"),
            &org.api_key,
            &json!({"add": ["one-more"]}),
        )
        .await;
    assert_eq!(over.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let tags = json_of(
        app.get(&format!("/api/traces/{a}"), &org.api_key).await,
        StatusCode::OK,
    )
    .await["tags"]
        .clone();
    assert_eq!(
        tags.as_array().unwrap().len(),
        20,
        "a refused change changes nothing"
    );
    for i in 0..19 {
        app.put(
            &format!("/api/traces/{b}/scores/s{i}"),
            &org.api_key,
            &json!({"value": i}),
        )
        .await;
    }
    let over = app
        .put(
            &format!("/api/traces/{b}/scores/s-extra"),
            &org.api_key,
            &json!({"value": 1}),
        )
        .await;
    assert_eq!(over.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let bad_name = app
        .put(
            &format!("/api/traces/{a}/scores/Bad%20Name"),
            &org.api_key,
            &json!({"value": 1}),
        )
        .await;
    assert_eq!(bad_name.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let not_a_number = app
        .put(
            &format!("/api/traces/{a}/scores/q"),
            &org.api_key,
            &json!({"value": "high"}),
        )
        .await;
    assert_eq!(not_a_number.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let other = app.create_org("Globex").await;
    let foreign = app
        .post(
            &format!("/api/traces/{a}/tags"),
            &other.api_key,
            &json!({"add": ["mine"]}),
        )
        .await;
    assert_eq!(foreign.status(), StatusCode::NOT_FOUND);
    let foreign = app
        .put(
            &format!("/api/traces/{a}/scores/q"),
            &other.api_key,
            &json!({"value": 1}),
        )
        .await;
    assert_eq!(foreign.status(), StatusCode::NOT_FOUND);
}

#[actix_web::test]
async fn retention_deletes_only_traces_older_than_the_projects_days() {
    let app = spawn_app_with(|s| s.traces.retention_sweep_secs = 1).await;
    let org = app.create_org("Acme").await;
    let kept = app.create_project(&org, "kept").await;
    let short = app.create_project(&org, "short").await;
    let db = sea_orm::Database::connect(app.db_url.as_str()).await.unwrap();
    let now = Utc::now();
    let mut rows = Vec::new();
    let mut young = Vec::new();
    for (project, age_days) in [(&kept, 40), (&short, 40), (&short, 31), (&short, 29), (&short, 0)] {
        let id = uuid::Uuid::new_v4().to_string();
        if !(project == &short && age_days > 30) {
            young.push(id.clone());
        }
        rows.push(crate::export::trace(
            id,
            &org,
            project,
            "m",
            200,
            now - chrono::Duration::days(age_days),
        ));
    }
    keel_core::fixtures::insert_traces(&db, &rows).await.unwrap();
    db.close().await.ok();

    let patched = app
        .request(
            Method::PATCH,
            &format!("/api/projects/{short}"),
            Some(&org.member_token),
        )
        .header("X-Org-Id", &org.org_id)
        .json(&json!({"traceRetentionDays": 30}))
        .send()
        .await
        .unwrap();
    let view = json_of(patched, StatusCode::OK).await;
    assert_eq!(view["traceRetentionDays"], 30);
    let project = json_of(
        app.get(&format!("/api/projects/{kept}"), &org.api_key).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(project["traceRetentionDays"], Value::Null);
    assert!(
        eventually(|| async {
            let metrics = app.metrics_text().await;
            metric(&metrics, "keel_traces_expired_total") == 2.0
        })
        .await
    );
    let left: HashSet<String> = ids(&list(&app, &org, &format!("projectId={short}")).await)
        .into_iter()
        .chain(ids(&list(&app, &org, &format!("projectId={kept}")).await))
        .collect();
    assert_eq!(left.len(), 3);
    for id in &young {
        assert!(left.contains(id), "a trace younger than the limit was deleted");
    }
    // Bounds and null.
    for bad in [
        json!({"traceRetentionDays": 0}),
        json!({"traceRetentionDays": 3651}),
        json!({}),
    ] {
        let response = app
            .request(
                Method::PATCH,
                &format!("/api/projects/{short}"),
                Some(&org.api_key),
            )
            .json(&bad)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
    }
    let cleared = app
        .request(
            Method::PATCH,
            &format!("/api/projects/{short}"),
            Some(&org.api_key),
        )
        .json(&json!({"traceRetentionDays": null}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        json_of(cleared, StatusCode::OK).await["traceRetentionDays"],
        Value::Null
    );
}

#[actix_web::test]
async fn the_export_writes_a_page_as_one_otlp_document_a_span_per_trace() {
    let (app, _provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "otlp").await;
    for ask in ["one", "two"] {
        sdk_request(&app, &org, Some(&project), &chat("gpt-4o-mini", ask))
            .send()
            .await
            .unwrap();
    }
    raw_traces(&app, &org, &project, 2).await;
    let export = json_of(
        app.get(
            &format!("/api/traces/export?project_id={project}&format=otlp-json"),
            &org.api_key,
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(export["format"], "otlp-json");
    assert_eq!(export["count"], 2);
    let records = export["records"].as_array().unwrap();
    assert_eq!(records.len(), 1, "one document for the page");
    let spans = records[0]["resourceSpans"][0]["scopeSpans"][0]["spans"]
        .as_array()
        .unwrap();
    assert_eq!(spans.len(), 2);
    for span in spans {
        let hex = span["traceId"].as_str().unwrap();
        assert_eq!(hex.len(), 32);
        assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(span["spanId"].as_str().unwrap().len(), 16);
        assert_eq!(span["kind"], 3);
        let attribute = |key: &str| {
            span["attributes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a["key"] == key)
                .map(|a| a["value"].clone())
                .unwrap_or_else(|| panic!("{key} is missing"))
        };
        assert_eq!(attribute("gen_ai.operation.name"), json!({"stringValue": "chat"}));
        assert_eq!(
            attribute("gen_ai.provider.name"),
            json!({"stringValue": "openai"})
        );
        assert_eq!(
            attribute("gen_ai.request.model"),
            json!({"stringValue": "gpt-4o-mini"})
        );
        assert_eq!(attribute("gen_ai.usage.input_tokens"), json!({"intValue": "24"}));
        assert_eq!(attribute("gen_ai.usage.output_tokens"), json!({"intValue": "8"}));
        let input: Value = serde_json::from_str(
            attribute("gen_ai.input.messages")["stringValue"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(input[0]["role"], "user");
        assert_eq!(span["status"]["code"], 1);
    }
}

#[actix_web::test]
async fn the_console_searches_tags_scores_and_sets_retention() {
    use crate::console::{org_path, traced_app, Console};
    let (app, _provider, org, project, traces) = traced_app().await;
    let console = Console::sign_in(&app, &org.member_token).await;
    let base = org_path(&org, &format!("/projects/{project}/traces"));
    // Previews and a search.
    let list = console.page(&base).await;
    assert!(
        list.contains("Capital of France?") && list.contains("Weather in Paris?"),
        "{list}"
    );
    let found = console.page(&format!("{base}?q=weather")).await;
    assert_eq!(found.matches("name=\"traceIds\"").count(), 1, "{found}");
    assert!(found.contains("Weather in Paris?"));
    let today = Utc::now().format("%Y-%m-%d").to_string();
    let dated = console.page(&format!("{base}?since={today}&until={today}")).await;
    assert_eq!(dated.matches("name=\"traceIds\"").count(), 3);
    let long_ago = console.page(&format!("{base}?until=2020-01-01")).await;
    assert_eq!(long_ago.matches("name=\"traceIds\"").count(), 0);
    // Bulk tag the selected two; the tag filter finds them.
    let (first, second) = (
        traces[0]["id"].as_str().unwrap(),
        traces[1]["id"].as_str().unwrap(),
    );
    let html = console
        .submit(
            &org_path(&org, &format!("/projects/{project}/tag")),
            &[("traceIds", first), ("traceIds", second), ("bulkTag", "golden")],
        )
        .await;
    assert!(html.contains("Tagged 2 traces."), "{html}");
    let tagged = console.page(&format!("{base}?tag=golden")).await;
    assert_eq!(tagged.matches("name=\"traceIds\"").count(), 2);
    let html = console
        .submit(
            &org_path(&org, &format!("/projects/{project}/tag")),
            &[("traceIds", first), ("bulkTag", "Bad Tag")],
        )
        .await;
    assert!(html.contains("flash error"), "{html}");
    // The trace page: add and remove a tag, set and delete a score.
    let page = org_path(&org, &format!("/traces/{first}"));
    let html = console
        .submit(&format!("{page}/tags"), &[("add", "reviewed")])
        .await;
    assert!(
        html.contains("Tags saved.") && html.contains(">reviewed<"),
        "{html}"
    );
    let html = console
        .submit(&format!("{page}/tags"), &[("remove", "golden")])
        .await;
    assert!(!html.contains(">golden<"), "{html}");
    let html = console
        .submit(
            &format!("{page}/scores"),
            &[("name", "quality"), ("value", "0.75"), ("comment", "<b>ok</b>")],
        )
        .await;
    assert!(
        html.contains("Score saved.") && html.contains("0.75") && html.contains("&#60;b&#62;ok"),
        "{html}"
    );
    let api = json_of(
        app.get(&format!("/api/traces/{first}"), &org.api_key).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(api["tags"], json!(["reviewed"]));
    assert_eq!(api["scores"]["quality"]["value"], 0.75);
    let html = console
        .submit(&format!("{page}/scores"), &[("name", "Bad Name"), ("value", "1")])
        .await;
    assert!(html.contains("flash error"), "{html}");
    let html = console
        .submit(&format!("{page}/scores/quality/delete"), &[])
        .await;
    assert!(
        html.contains("Score deleted.") && html.contains("No scores."),
        "{html}"
    );
    // Retention.
    let html = console
        .submit(
            &org_path(&org, &format!("/projects/{project}/retention")),
            &[("retentionDays", "14")],
        )
        .await;
    assert!(html.contains("kept 14 days"), "{html}");
    let view = json_of(
        app.get(&format!("/api/projects/{project}"), &org.api_key).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(view["traceRetentionDays"], 14);
    let html = console
        .submit(
            &org_path(&org, &format!("/projects/{project}/retention")),
            &[("retentionDays", "0")],
        )
        .await;
    assert!(html.contains("flash error"), "{html}");
    let html = console
        .submit(
            &org_path(&org, &format!("/projects/{project}/retention")),
            &[("retentionDays", "")],
        )
        .await;
    assert!(html.contains("kept forever"), "{html}");
}

/// The document's patterns of a tag and of `minScore` (what the API holds input to) are the
/// core's, which the console and the routes check names with.
#[actix_web::test]
async fn the_documents_tag_and_min_score_patterns_are_the_cores() {
    let app = spawn_app().await;
    let doc = app.openapi().await;
    let param = |path: &str, method: &str, name: &str| {
        doc["paths"][path][method]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("{method} {path} {name}"))["schema"]["pattern"]
            .clone()
    };
    use keel_core::traces::marks::{MIN_SCORE_PATTERN, NAME_PATTERN};
    for path in ["/api/traces", "/api/traces/export"] {
        assert_eq!(param(path, "get", "tag"), NAME_PATTERN, "{path}");
        assert_eq!(param(path, "get", "minScore"), MIN_SCORE_PATTERN, "{path}");
    }
    for method in ["put", "delete"] {
        assert_eq!(
            param("/api/traces/{trace_id}/scores/{name}", method, "name"),
            NAME_PATTERN
        );
    }
}

/// The search migrations (tags and scores, the indexer's column, the words' backfill) undo
/// and redo cleanly on a database that has them.
#[actix_web::test]
async fn the_search_migrations_go_down_and_up_again() {
    use migration::{Migrator, MigratorTrait};
    let db_handle = TestDb::new().await;
    let db = sea_orm::Database::connect(&db_handle.url).await.unwrap();
    Migrator::up(&db, None).await.unwrap();
    let names: Vec<String> = Migrator::migrations()
        .iter()
        .map(|m| m.name().to_owned())
        .collect();
    let first = names
        .iter()
        .position(|n| n == "m20261127_000002_trace_search_tags")
        .expect("the search migration");
    let undone = (names.len() - first) as u32;
    Migrator::down(&db, Some(undone)).await.unwrap();
    assert_eq!(
        Migrator::get_pending_migrations(&db).await.unwrap().len(),
        undone as usize
    );
    Migrator::up(&db, None).await.unwrap();
    assert!(Migrator::get_pending_migrations(&db).await.unwrap().is_empty());
    db.close().await.ok();
}

#[actix_web::test]
async fn the_list_and_one_trace_say_whether_tokens_were_estimated_the_status_code_and_the_error() {
    let (app, _provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "figures").await;
    // A JSON answer with usage, a stream without it (estimated), and a provider's 401.
    let plain = sdk_request(&app, &org, Some(&project), &chat("gpt-4o-mini", "hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), StatusCode::OK);
    let mut streamed = chat("stream-tools", "weather?");
    streamed["stream"] = json!(true);
    let stream = sdk_request(&app, &org, Some(&project), &streamed)
        .send()
        .await
        .unwrap();
    stream.text().await.unwrap();
    let refused = sdk_request(&app, &org, Some(&project), &chat("gpt-401", "hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    raw_traces(&app, &org, &project, 3).await;
    let all = list(&app, &org, &format!("projectId={project}")).await;
    let by_model = |model: &str| {
        all["traces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["model"] == model)
            .unwrap()
            .clone()
    };
    let (plain, tools, failed) = (
        by_model("gpt-4o-mini"),
        by_model("stream-tools"),
        by_model("gpt-401"),
    );
    assert_eq!(
        (plain["usageEstimated"].clone(), plain["statusCode"].clone()),
        (json!(false), json!(200))
    );
    assert!(plain["error"].is_null(), "{plain}");
    assert_eq!(tools["usageEstimated"], true, "{tools}");
    assert_eq!(failed["statusCode"], 401);
    assert_eq!(failed["status"], "error");
    assert!(failed["error"].as_str().unwrap().contains("upstream"), "{failed}");
    // One trace carries them too.
    for trace in [&plain, &tools, &failed] {
        let one = json_of(
            app.get(
                &format!("/api/traces/{}", trace["traceId"].as_str().unwrap()),
                &org.api_key,
            )
            .await,
            StatusCode::OK,
        )
        .await;
        for field in ["usageEstimated", "statusCode", "error"] {
            assert_eq!(one[field], trace[field], "{field}");
        }
    }
    // And the document says so.
    let doc = app.openapi().await;
    let properties = &doc["components"]["schemas"]["TraceView"]["properties"];
    for field in ["usageEstimated", "statusCode", "error"] {
        assert!(properties.get(field).is_some(), "{field} in TraceView");
    }
}
