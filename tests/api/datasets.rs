//! Datasets (issue 60): frozen, versioned, split selections of a project's traces, exported
//! byte for byte the same whatever happens to their traces, pinned by the jobs that train on
//! them and read by the worker that holds the job.

use std::collections::HashSet;

use chrono::{Duration as Span, SubsecRound, Utc};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::export::trace;
use crate::helpers::*;
use crate::queue::{claim, enqueue, funded};

/// `n` traces of model `m-ok` (every fourth a 500 of `m-err`), a millisecond apart; their ids.
async fn seed(app: &TestApp, org: &TestOrg, project: &str, n: usize) -> Vec<String> {
    let newest = (Utc::now() - Span::seconds(60)).trunc_subsecs(3);
    let rows: Vec<_> = (0..n)
        .map(|i| {
            let (model, status) = if i % 4 == 0 { ("m-err", 500) } else { ("m-ok", 200) };
            let id = uuid::Uuid::new_v4().to_string();
            trace(
                id,
                org,
                project,
                model,
                status,
                newest - Span::milliseconds(i as i64),
            )
        })
        .collect();
    insert(app, &rows).await;
    rows.iter().map(|t| t.id.to_string()).collect()
}

async fn insert(app: &TestApp, rows: &[entities::trace::Model]) {
    let db = sea_orm::Database::connect(app.db_url.as_str()).await.unwrap();
    keel_core::fixtures::insert_traces(&db, rows).await.unwrap();
    db.close().await.ok();
}

async fn export(app: &TestApp, org: &TestOrg, path: &str) -> (Vec<u8>, String, i64) {
    let response = app.get(path, &org.api_key).await;
    assert_eq!(response.status(), StatusCode::OK, "{path}");
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let sha = response.headers()["x-dataset-sha256"]
        .to_str()
        .unwrap()
        .to_owned();
    let lines: i64 = response.headers()["x-dataset-lines"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let body = response.bytes().await.unwrap().to_vec();
    assert_eq!(
        hex::encode(Sha256::digest(&body)),
        sha,
        "the header's digest is the body's"
    );
    assert_eq!(body.iter().filter(|b| **b == b'\n').count() as i64, lines);
    (body, sha, lines)
}

fn ids_of(body: &[u8]) -> Vec<String> {
    // The openai-chat lines of these traces ask "question <id>".
    String::from_utf8_lossy(body)
        .lines()
        .map(|line| {
            let line: Value = serde_json::from_str(line).unwrap();
            let ask = line["messages"][0]["content"].as_str().unwrap();
            ask.trim_start_matches("question ").to_owned()
        })
        .collect()
}

async fn create(app: &TestApp, org: &TestOrg, body: Value) -> Value {
    json_of(
        app.post("/api/datasets", &org.api_key, &body).await,
        StatusCode::CREATED,
    )
    .await
}

#[actix_web::test]
async fn a_version_is_split_stable_and_byte_identical_after_its_traces_change_or_go() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let ids = seed(&app, &org, &project, 40).await;
    let ok: HashSet<String> = ids
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 4 != 0)
        .map(|(_, id)| id.clone())
        .collect();
    let errored = ids[0].clone();

    let view = create(
        &app,
        &org,
        json!({"projectId": project, "name": "support-v1", "description": "refund answers",
               "filter": {"model": "m-ok"}, "traceIds": [errored],
               "split": {"validation": 0.3, "seed": 7}}),
    )
    .await;
    let dataset = view["datasetId"].as_str().unwrap().to_owned();
    assert_eq!(view["version"], 1);
    assert_eq!(view["name"], "support-v1");
    let v1 = &view["versions"][0];
    assert_eq!(v1["version"], 1);
    assert_eq!(v1["filter"], json!({"model": "m-ok"}));
    let (train, validation) = (
        v1["counts"]["train"].as_i64().unwrap(),
        v1["counts"]["validation"].as_i64().unwrap(),
    );
    assert_eq!(
        train + validation,
        ok.len() as i64,
        "the 500 listed by id is not trainable"
    );
    // The split is by trace id (random here) and seed: a share near 0.3, both sides taken.
    assert!(validation > 0 && train > 0, "{train}/{validation}");
    assert_eq!(v1["skipped"], 1);

    let base = format!("/api/datasets/{dataset}/versions/1/export");
    let (all, _, _) = export(&app, &org, &base).await;
    let (train_body, train_sha, train_lines) = export(&app, &org, &format!("{base}?split=train")).await;
    let (valid_body, valid_sha, _) = export(&app, &org, &format!("{base}?split=validation")).await;
    assert_eq!(
        train_sha, v1["sha256"]["train"],
        "the view's digest is of the openai-chat lines"
    );
    assert_eq!(valid_sha, v1["sha256"]["validation"]);
    assert_eq!(train_lines, train);
    let (train_ids, valid_ids) = (ids_of(&train_body), ids_of(&valid_body));
    let sides: HashSet<&String> = train_ids.iter().collect();
    assert!(
        valid_ids.iter().all(|id| !sides.contains(id)),
        "the split is disjoint"
    );
    let union: HashSet<String> = train_ids.iter().chain(&valid_ids).cloned().collect();
    assert_eq!(union, ok);
    // OpenAI's chat fine-tuning format: the request's messages then the assistant's reply.
    let first: Value = serde_json::from_slice(all.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(first["messages"][1]["role"], "assistant");
    assert!(first["messages"][1]["content"]
        .as_str()
        .unwrap()
        .starts_with("answer "));
    let (records, _, _) = export(&app, &org, &format!("{base}?format=records&split=all")).await;
    let record: Value = serde_json::from_slice(records.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert!(
        record["input"].as_str().unwrap().starts_with("question "),
        "{record}"
    );

    // The same seed splits another dataset of the same traces the same way.
    let twin = create(
        &app,
        &org,
        json!({"projectId": project, "name": "twin", "filter": {"model": "m-ok"}, "split": {"validation": 0.3, "seed": 7}}),
    )
    .await;
    assert_eq!(twin["versions"][0]["sha256"], v1["sha256"]);

    // Retagged, rescored, then deleted (as retention does): version 1 reads the same bytes.
    let some: Vec<&String> = ok.iter().take(5).collect();
    let tagged = app
        .post(
            "/api/traces/tags",
            &org.api_key,
            &json!({"traceIds": some, "add": ["reviewed"]}),
        )
        .await;
    assert_eq!(tagged.status(), StatusCode::OK);
    let scored = app
        .request(
            Method::PUT,
            &format!("/api/traces/{}/scores/quality", some[0]),
            Some(&org.api_key),
        )
        .json(&json!({"value": 0.1}))
        .send()
        .await
        .unwrap();
    assert_eq!(scored.status(), StatusCode::OK);
    let db = sea_orm::Database::connect(app.db_url.as_str()).await.unwrap();
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    entities::trace::Entity::delete_many()
        .filter(entities::trace::Column::ProjectId.eq(project.as_str()))
        .exec(&db)
        .await
        .unwrap();
    db.close().await.ok();
    assert_eq!(
        export(&app, &org, &base).await.0,
        all,
        "byte-identical after its traces went"
    );
    assert_eq!(
        export(&app, &org, &format!("{base}?split=train")).await.0,
        train_body
    );

    // A new version from the previous selection: one removed; a deleted trace can't be added
    // to a dataset that never took it (422), one it took can.
    let removed = train_ids[0].clone();
    let v2 = json_of(
        app.post(
            &format!("/api/datasets/{dataset}/versions"),
            &org.api_key,
            &json!({"traceIds": {"remove": [removed]}}),
        )
        .await,
        StatusCode::CREATED,
    )
    .await;
    assert_eq!(v2["version"], 2);
    assert_eq!(v2["versions"].as_array().unwrap().len(), 2);
    let v2_train = ids_of(
        &export(
            &app,
            &org,
            &format!("/api/datasets/{dataset}/versions/2/export?split=train"),
        )
        .await
        .0,
    );
    assert_eq!(v2_train.len(), train_ids.len() - 1);
    assert!(!v2_train.contains(&removed));
    let unknown = app
        .post(
            &format!("/api/datasets/{dataset}/versions"),
            &org.api_key,
            &json!({"traceIds": {"add": [uuid::Uuid::new_v4()]}}),
        )
        .await;
    let detail = json_of(unknown, StatusCode::UNPROCESSABLE_ENTITY).await;
    assert_eq!(detail["detail"][0]["loc"], json!(["body", "traceIds"]));
    assert_eq!(export(&app, &org, &base).await.0, all, "version 1 never changes");

    // A refresh (empty body) runs the latest filter again: new traces join.
    let fresh = seed(&app, &org, &project, 4).await;
    let v3 = json_of(
        app.post(
            &format!("/api/datasets/{dataset}/versions"),
            &org.api_key,
            &json!({}),
        )
        .await,
        StatusCode::CREATED,
    )
    .await;
    let v3 = &v3["versions"][2];
    let counted = v3["counts"]["train"].as_i64().unwrap() + v3["counts"]["validation"].as_i64().unwrap();
    assert_eq!(counted as usize, ok.len() - 1 + 3, "{v3}: the 3 new m-ok traces");
    let _ = fresh;
}

#[actix_web::test]
async fn dedupe_keeps_the_latest_trace_of_each_prompt_and_bad_bodies_are_4xx() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let at = (Utc::now() - Span::seconds(30)).trunc_subsecs(3);
    let same = |id: String, ms: i64| {
        let mut t = trace(id, &org, &project, "m-ok", 200, at + Span::milliseconds(ms));
        t.request = json!({"model": "m-ok", "messages": [{"role": "user", "content": "the same question"}]})
            .to_string();
        t
    };
    let (older, newer) = (uuid::Uuid::new_v4().to_string(), uuid::Uuid::new_v4().to_string());
    insert(&app, &[same(older.clone(), 0), same(newer.clone(), 5)]).await;
    let other = seed(&app, &org, &project, 2).await;
    let body = |name: &str, dedupe: &str| json!({"projectId": project, "name": name, "filter": {"status": "ok"}, "dedupe": dedupe});
    let none = create(&app, &org, body("all", "none")).await;
    assert_eq!(none["versions"][0]["counts"]["train"], 3);
    let deduped = create(&app, &org, body("deduped", "prompt")).await;
    assert_eq!(deduped["versions"][0]["counts"]["train"], 2);
    assert_eq!(deduped["versions"][0]["skipped"], 1);
    let id = deduped["datasetId"].as_str().unwrap();
    let (records, _, _) = export(
        &app,
        &org,
        &format!("/api/datasets/{id}/versions/1/export?format=records"),
    )
    .await;
    let text = String::from_utf8(records).unwrap();
    assert!(
        text.contains(&format!("answer {newer}")),
        "the latest of the prompt: {text}"
    );
    assert!(!text.contains(&format!("answer {older}")));
    let _ = other;

    // Bad bodies: a taken name is 409, nothing to select 422, a bad split or format 422,
    // another organization's project or dataset 404.
    let taken = app
        .post("/api/datasets", &org.api_key, &body("all", "none"))
        .await;
    assert_eq!(
        json_of(taken, StatusCode::CONFLICT).await["code"],
        "dataset_name_taken"
    );
    for bad in [
        json!({"projectId": project, "name": "x"}),
        json!({"projectId": project, "name": "x", "filter": null}),
        json!({"projectId": project, "name": "x", "filter": null, "traceIds": []}),
        json!({"projectId": project, "name": "x", "filter": {}, "split": {"validation": 0.9}}),
        json!({"projectId": project, "name": "x", "filter": {}, "dedupe": "words"}),
        json!({"projectId": project, "name": "", "filter": {}}),
    ] {
        let refused = app.post("/api/datasets", &org.api_key, &bad).await;
        assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
    }
    let bad_format = app
        .get(
            &format!("/api/datasets/{id}/versions/1/export?format=raw"),
            &org.api_key,
        )
        .await;
    assert_eq!(bad_format.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let stranger = app.create_org("Stranger").await;
    let theirs = app
        .post("/api/datasets", &stranger.api_key, &body("mine", "none"))
        .await;
    assert_eq!(theirs.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        app.get(&format!("/api/datasets/{id}"), &stranger.api_key)
            .await
            .status(),
        StatusCode::NOT_FOUND
    );
    let listed = json_of(
        app.get(&format!("/api/datasets?projectId={project}"), &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(listed["datasets"].as_array().unwrap().len(), 2);
    let renamed = app
        .request(Method::PATCH, &format!("/api/datasets/{id}"), Some(&org.api_key))
        .json(&json!({"name": "deduped-2", "description": null}))
        .send()
        .await
        .unwrap();
    assert_eq!(json_of(renamed, StatusCode::OK).await["name"], "deduped-2");
}

#[actix_web::test]
async fn a_job_pins_its_dataset_and_only_the_worker_holding_it_reads_it() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Trainer").await;
    seed(&app, &org, &project, 12).await;
    let view = create(
        &app,
        &org,
        json!({"projectId": project, "name": "train-set", "filter": {"model": "m-ok"}, "split": {"validation": 0.25}}),
    )
    .await;
    let dataset = view["datasetId"].as_str().unwrap().to_owned();
    let digests = view["versions"][0]["sha256"].clone();
    let job = enqueue(
        &app,
        &org,
        &project,
        json!({"action": "training", "model": "m", "environmentSlug": "acme/agents/env", "dataset": {"datasetId": dataset}}),
    )
    .await;
    let pinned = json!({"datasetId": dataset, "version": 1, "counts": view["versions"][0]["counts"], "sha256": digests});
    assert_eq!(job["dataset"], pinned);
    let job_id = job["jobId"].as_str().unwrap().to_owned();
    // Another organization's dataset, or a version it does not have, is 404.
    let stranger = app.create_org("Stranger").await;
    let elsewhere = app.create_project(&stranger, "P").await;
    let refused = app
        .post(
            "/api/training/jobs",
            &stranger.api_key,
            &json!({"action": "tracer", "projectId": elsewhere, "dataset": {"datasetId": dataset}}),
        )
        .await;
    assert_eq!(
        json_of(refused, StatusCode::NOT_FOUND).await["code"],
        "dataset_not_found"
    );
    let no_version = app
        .post("/api/training/jobs", &org.api_key, &json!({"action": "tracer", "projectId": project, "dataset": {"datasetId": dataset, "version": 9}}))
        .await;
    assert_eq!(no_version.status(), StatusCode::NOT_FOUND);

    // The dataset a job that is not over trains on cannot be deleted.
    let delete = app
        .request(
            Method::DELETE,
            &format!("/api/datasets/{dataset}"),
            Some(&org.api_key),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(
        json_of(delete, StatusCode::CONFLICT).await["code"],
        "dataset_in_use"
    );

    let read = |worker: Option<&str>| {
        let query = worker.map(|w| format!("?worker_id={w}")).unwrap_or_default();
        app.request(
            Method::GET,
            &format!("/api/training/internal/jobs/{job_id}/dataset{query}"),
            Some(INTERNAL_KEY),
        )
        .send()
    };
    assert_eq!(
        read(Some("w1")).await.unwrap().status(),
        StatusCode::CONFLICT,
        "not claimed yet"
    );
    let claimed = claim(&app, "w1", "training", 1).await;
    assert_eq!(claimed[0]["dataset"], pinned, "the claim item carries it");
    assert_eq!(
        json_of(read(Some("w2")).await.unwrap(), StatusCode::CONFLICT).await["code"],
        "job_not_held"
    );
    assert_eq!(read(None).await.unwrap().status(), StatusCode::CONFLICT);
    let held = read(Some("w1")).await.unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    let sha = held.headers()["x-dataset-sha256"].to_str().unwrap().to_owned();
    let body = held.bytes().await.unwrap();
    assert_eq!(hex::encode(Sha256::digest(&body)), sha);
    assert_eq!(
        json!(sha),
        digests["train"],
        "the train split, openai-chat, by default"
    );

    // The dataset lists the job under the version it pinned.
    let view = json_of(
        app.get(&format!("/api/datasets/{dataset}"), &org.api_key).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(view["versions"][0]["jobs"][0]["jobId"], json!(job_id));
    assert_eq!(view["versions"][0]["jobs"][0]["status"], "running");
    let metrics = app.get("/metrics", INTERNAL_KEY).await.text().await.unwrap();
    assert!(
        metrics.contains("keel_dataset_export_lines_total{format=\"openai-chat\"}"),
        "{metrics}"
    );
}

/// A keel in front of keel whose dataset downloads break off after `bytes` bytes of body
/// (the rest of its answers pass through whole).
fn cutting_after(target: String, bytes: usize) -> String {
    use actix_web::{web, HttpRequest, HttpResponse};
    crate::fakes::serve(move |cfg: &mut web::ServiceConfig| {
        let target = target.clone();
        cfg.default_service(web::to(move |req: HttpRequest| {
            let target = target.clone();
            async move {
                let url = format!("{target}{}?{}", req.path(), req.query_string());
                let auth = req
                    .headers()
                    .get("authorization")
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_owned();
                let upstream = reqwest::Client::new()
                    .get(url)
                    .header("authorization", auth)
                    .send()
                    .await
                    .unwrap();
                let mut answer = HttpResponse::build(
                    actix_web::http::StatusCode::from_u16(upstream.status().as_u16()).unwrap(),
                );
                for (name, value) in upstream.headers() {
                    if name.as_str().starts_with("x-dataset") || name == "content-type" {
                        answer.insert_header((name.as_str(), value.to_str().unwrap()));
                    }
                }
                let body = upstream.bytes().await.unwrap();
                if !req.path().ends_with("/export") {
                    return answer.body(body);
                }
                let head = body.slice(..bytes.min(body.len()));
                // The head goes out (and is read) before the connection breaks.
                let cut = futures_util::stream::unfold(Some(head), |head| async move {
                    match head {
                        Some(head) => Some((Ok(head), None)),
                        None => {
                            actix_web::rt::time::sleep(std::time::Duration::from_millis(300)).await;
                            Some((Err(std::io::Error::other("the connection broke")), None))
                        }
                    }
                });
                answer.streaming(cut)
            }
        }));
    })
}

/// `keel datasets export`: to a file through a connection that breaks, then `--resume` to
/// the same bytes as the API's (checked against the digest); to standard output; a resume of
/// another download refused. The API's `offset` leaves out the lines a resume has.
#[actix_web::test]
async fn the_cli_downloads_a_split_resumes_a_broken_download_and_checks_its_digest() {
    use crate::export::{args, keel};
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    seed(&app, &org, &project, 400).await;
    let view = create(
        &app,
        &org,
        json!({"projectId": project, "name": "cli", "filter": {}, "split": {"validation": 0.25, "seed": 3}}),
    )
    .await;
    let id = view["datasetId"].as_str().unwrap().to_owned();
    let base = format!("/api/datasets/{id}/versions/1/export");
    let (train, sha, lines) = export(&app, &org, &format!("{base}?split=train")).await;
    assert!(lines > 150, "{lines}");
    assert_eq!(sha, view["versions"][0]["sha256"]["train"].as_str().unwrap());

    // The API's offset: the lines after the first 100, with the whole split's headers.
    let response = app
        .get(&format!("{base}?split=train&offset=100"), &org.api_key)
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-dataset-sha256"].to_str().unwrap(), sha);
    let tail = response.bytes().await.unwrap();
    let hundredth = train
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .nth(99)
        .unwrap()
        .0;
    assert_eq!(&tail[..], &train[hundredth + 1..]);

    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("train.jsonl");
    let download = |extra: &[&str]| {
        let mut list = args(&["datasets", "export", "--dataset", &id, "--split", "train"]);
        list.extend(args(&["--out", out.to_str().unwrap()]));
        list.extend(args(extra));
        list
    };
    // Broken off in the middle of a line.
    let cut_at = train.len() / 2 + 7;
    let flaky = cutting_after(app.address.clone(), cut_at);
    let failed = keel(
        download(&[]),
        vec![("KEEL_URL", flaky), ("KEEL_API_KEY", org.api_key.clone())],
    )
    .await;
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(!failed.status.success(), "{stderr}");
    assert!(stderr.contains("broke off"), "{stderr}");
    assert!(!out.exists());
    let part = std::fs::read(dir.path().join("train.jsonl.part")).unwrap();
    assert!(
        !part.is_empty() && train.starts_with(&part),
        "the part is a prefix"
    );
    assert!(dir.path().join("train.jsonl.cursor").exists());

    // A resume of another split is refused, and what was kept stays.
    let other = keel(
        args(&[
            "datasets",
            "export",
            "--dataset",
            &id,
            "--split",
            "validation",
            "--out",
            out.to_str().unwrap(),
            "--resume",
        ]),
        vec![
            ("KEEL_URL", app.address.clone()),
            ("KEEL_API_KEY", org.api_key.clone()),
        ],
    )
    .await;
    assert!(!other.status.success());
    assert!(
        String::from_utf8_lossy(&other.stderr).contains("resume it with the same"),
        "{}",
        String::from_utf8_lossy(&other.stderr)
    );

    let resumed = keel(
        download(&["--resume"]),
        vec![
            ("KEEL_URL", app.address.clone()),
            ("KEEL_API_KEY", org.api_key.clone()),
        ],
    )
    .await;
    let stderr = String::from_utf8_lossy(&resumed.stderr);
    assert!(resumed.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("sha256 {sha} verified")), "{stderr}");
    assert_eq!(std::fs::read(&out).unwrap(), train, "the same bytes as the API's");
    assert!(!dir.path().join("train.jsonl.part").exists());
    assert!(!dir.path().join("train.jsonl.cursor").exists());

    // Standard output, the latest version, the validation split.
    let (validation, _, _) = export(&app, &org, &format!("{base}?split=validation")).await;
    let printed = keel(
        args(&["datasets", "export", "--dataset", &id, "--split", "validation"]),
        vec![
            ("KEEL_URL", app.address.clone()),
            ("KEEL_API_KEY", org.api_key.clone()),
        ],
    )
    .await;
    assert!(
        printed.status.success(),
        "{}",
        String::from_utf8_lossy(&printed.stderr)
    );
    assert_eq!(printed.stdout, validation);
}

/// The console: "Save as dataset" from the traces page's filter and from ticked rows, the
/// project's datasets page (versions, counts, digests, the jobs that trained on each,
/// downloads that are the API's bytes, a new version), and a version's traces, paged.
#[actix_web::test]
async fn the_console_saves_a_filter_or_ticked_traces_as_datasets_and_pages_a_version() {
    use crate::console::{org_path, Console};
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Acme").await;
    let ids = seed(&app, &org, &project, 100).await;
    let console = Console::sign_in(&app, &org.api_key).await;
    let traces = console
        .page(&org_path(&org, &format!("/projects/{project}/traces?model=m-ok")))
        .await;
    assert!(traces.contains("id=\"save-dataset-button\"") && traces.contains("id=\"datasets-link\""));

    // The filter itself (75 of the 100 are m-ok), with a validation share.
    let save = org_path(&org, &format!("/projects/{project}/datasets"));
    let saved = console
        .submit(
            &save,
            &[
                ("scope", "matching"),
                ("filter_model", "m-ok"),
                ("datasetName", "from-filter"),
                ("validation", "0.2"),
            ],
        )
        .await;
    assert!(
        saved.contains("Saved dataset from-filter: version 1 has"),
        "{saved}"
    );
    let listed = json_of(
        app.get(&format!("/api/datasets?projectId={project}"), &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await;
    let filtered = &listed["datasets"][0];
    assert_eq!(filtered["versions"][0]["filter"], json!({"model": "m-ok"}));
    let counts = &filtered["versions"][0]["counts"];
    assert_eq!(
        counts["train"].as_i64().unwrap() + counts["validation"].as_i64().unwrap(),
        75
    );
    assert!(counts["validation"].as_i64().unwrap() > 0);
    let id = filtered["datasetId"].as_str().unwrap().to_owned();

    // Ticked rows; a taken name is said on the traces page.
    let ticked: Vec<(&str, &str)> = ids[1..4].iter().map(|t| ("traceIds", t.as_str())).collect();
    let mut fields = ticked.clone();
    fields.extend([("datasetName", "picked"), ("validation", "0")]);
    let picked = console.submit(&save, &fields).await;
    assert!(
        picked.contains("Saved dataset picked: version 1 has 3 training and 0 validation lines."),
        "{picked}"
    );
    let mut again = ticked.clone();
    again.push(("datasetName", "picked"));
    let taken = console.submit(&save, &again).await;
    assert!(
        taken.contains("Traces of Agents") && taken.contains("picked"),
        "{taken}"
    );
    assert!(!taken.contains("Saved dataset"), "{taken}");

    // A job trains on the filtered one; the datasets page shows it beside its version.
    let job = enqueue(
        &app,
        &org,
        &project,
        json!({"action": "training", "model": "m", "environmentSlug": "acme/agents/env", "dataset": {"datasetId": id}}),
    )
    .await["jobId"]
        .as_str()
        .unwrap()
        .to_owned();
    let page = console.page(&save).await;
    assert!(page.contains("from-filter") && page.contains("picked"));
    assert!(page.contains(&format!("/jobs/{job}")), "{page}");
    let sha = filtered["versions"][0]["sha256"]["train"].as_str().unwrap();
    assert!(page.contains(&format!("title=\"{sha}\"")), "{page}");

    // A download is the API's export, byte for byte.
    let version = org_path(&org, &format!("/datasets/{id}/versions/1"));
    for split in ["train", "validation", "all"] {
        let (api, _, _) = export(
            &app,
            &org,
            &format!("/api/datasets/{id}/versions/1/export?split={split}"),
        )
        .await;
        let downloaded = console.get(&format!("{version}/export?split={split}")).await;
        assert_eq!(downloaded.status(), StatusCode::OK);
        assert_eq!(downloaded.bytes().await.unwrap().to_vec(), api, "{split}");
    }
    assert_eq!(
        console
            .get(&format!("{version}/export?split=half"))
            .await
            .status(),
        StatusCode::BAD_REQUEST
    );

    // The version's page: 50 traces, then the other 25, each linking to its trace.
    let first = console.page(&version).await;
    assert_eq!(first.matches("class=\"trace-link\"").count(), 50, "{first}");
    assert!(first.contains("question "), "the line's question is shown");
    let more = first
        .split("href=\"")
        .find_map(|s| s.split('"').next().filter(|l| l.contains("?after=")))
        .unwrap()
        .to_owned();
    let second = console.page(&more).await;
    assert_eq!(second.matches("class=\"trace-link\"").count(), 25, "{second}");
    assert!(!second.contains("id=\"more-items\""));

    // A new version runs the filter again.
    seed(&app, &org, &project, 4).await;
    let refreshed = console
        .submit(&org_path(&org, &format!("/datasets/{id}/versions")), &[])
        .await;
    assert!(refreshed.contains("Made version 2 of from-filter"), "{refreshed}");
    let view = json_of(
        app.get(&format!("/api/datasets/{id}"), &org.api_key).await,
        StatusCode::OK,
    )
    .await;
    let v2 = &view["versions"][1]["counts"];
    assert_eq!(
        v2["train"].as_i64().unwrap() + v2["validation"].as_i64().unwrap(),
        78
    );

    // Another organization's dataset is not found.
    let stranger = app.create_org("Stranger").await;
    let theirs = Console::sign_in(&app, &stranger.api_key).await;
    assert_eq!(
        theirs
            .get(&format!(
                "/console/o/{}/datasets/{id}/versions/1",
                stranger.org_id
            ))
            .await
            .status(),
        StatusCode::NOT_FOUND
    );
}

/// A dataset's `openai-chat` lines pass the trace export's checks (OpenAI's fine-tuning
/// format, the conversation whole, tools kept) and are the trace export's lines.
#[actix_web::test]
async fn a_datasets_openai_chat_lines_are_the_trace_exports_and_pass_its_checks() {
    let (app, _provider) = crate::proxy::proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    crate::traces::record_five(&app, &org, &project).await;
    let view = create(
        &app,
        &org,
        json!({"projectId": project, "name": "five", "filter": {}}),
    )
    .await;
    assert_eq!(view["versions"][0]["skipped"], 1, "the 401 cannot train");
    let id = view["datasetId"].as_str().unwrap();
    let (body, _, _) = export(&app, &org, &format!("/api/datasets/{id}/versions/1/export")).await;
    let text = String::from_utf8(body).unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    crate::export::check_openai_chat_lines(&lines);
    let exported = json_of(
        app.get(
            &format!("/api/traces/export?project_id={project}&format=openai-chat&limit=10"),
            &org.api_key,
        )
        .await,
        StatusCode::OK,
    )
    .await;
    let mut theirs: Vec<String> = exported["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.to_string())
        .collect();
    // Byte for byte: the lines as the dataset serves them.
    let mut ours: Vec<String> = text.lines().map(str::to_owned).collect();
    theirs.sort();
    ours.sort();
    assert_eq!(ours, theirs);
}
