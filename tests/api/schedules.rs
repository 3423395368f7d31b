//! Cron schedules (issue 61): the routes and their checks, a job once per tick within 2 s,
//! both catch-up modes across a restart, `enabled: false`, run now, and exactly one job per
//! tick through kill -9 (one instance on SQLite, two racing on PostgreSQL).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Timelike, Utc};
use reqwest::StatusCode;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use serde_json::{json, Value};

use crate::chaos::Instance;
use crate::helpers::*;

const SCHEDULES: &str = "/api/training/schedules";

/// The error's `code`, its status asserted.
async fn code_of(response: reqwest::Response, expected: StatusCode) -> String {
    json_of(response, expected).await["code"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn tracer_job(project: &str) -> Value {
    json!({"action": "tracer", "projectId": project, "input": {"nightly": true}, "priority": 3})
}

/// The ticks of each schedule's jobs (read from the database: every job, no page).
async fn ticks_by_schedule(db_url: &str) -> BTreeMap<String, Vec<DateTime<Utc>>> {
    let db = sea_orm::Database::connect(db_url).await.unwrap();
    let jobs = entities::training_job::Entity::find()
        .filter(entities::training_job::Column::ScheduleId.is_not_null())
        .all(&db)
        .await
        .unwrap();
    db.close().await.ok();
    let mut ticks: BTreeMap<String, Vec<DateTime<Utc>>> = BTreeMap::new();
    for job in jobs {
        if let (Some(schedule), Some(tick)) = (job.schedule_id, job.schedule_tick) {
            ticks.entry(schedule.to_string()).or_default().push(tick);
        }
    }
    for list in ticks.values_mut() {
        list.sort();
    }
    ticks
}

/// Each tick once, and every second from the first to the last (a per-second schedule).
fn assert_each_second_once(ticks: &[DateTime<Utc>], what: &str) {
    let distinct: BTreeSet<&DateTime<Utc>> = ticks.iter().collect();
    assert_eq!(
        distinct.len(),
        ticks.len(),
        "{what}: a tick enqueued twice: {ticks:?}"
    );
    for pair in ticks.windows(2) {
        assert_eq!(
            (pair[1] - pair[0]).num_seconds(),
            1,
            "{what}: a tick between {} and {} is missing",
            pair[0],
            pair[1]
        );
    }
}

#[actix_web::test]
async fn schedules_are_created_read_changed_and_deleted_and_bad_ones_are_422_naming_the_field() {
    let app = spawn_app().await;
    let org = app.create_org("Nightly").await;
    let other = app.create_org("Elsewhere").await;
    let project = app.create_project(&org, "evals").await;
    let body = |cron: &str| json!({"name": "nightly eval", "cron": cron, "job": tracer_job(&project)});

    for (body, loc) in [
        (body("61 * * * *"), json!(["body", "cron"])),
        (body("* * * *"), json!(["body", "cron"])),
        (body("0 0 30 2 *"), json!(["body", "cron"])),
        (body("0 0 * * * * 2027"), json!(["body", "cron"])),
        (
            json!({"name": "x", "cron": "@daily", "timezone": "Mars/Olympus", "job": tracer_job(&project)}),
            json!(["body", "timezone"]),
        ),
        (
            json!({"name": "  ", "cron": "@daily", "job": tracer_job(&project)}),
            json!(["body", "name"]),
        ),
        (
            json!({"name": "x", "cron": "@daily", "catchUp": "all", "job": tracer_job(&project)}),
            json!(["body", "catchUp"]),
        ),
        // The job is checked as POST /api/training/jobs checks it.
        (
            json!({"name": "x", "cron": "@daily", "job": {"action": "training", "projectId": project}}),
            json!(["body", "job", "model"]),
        ),
        (
            json!({"name": "x", "cron": "@daily", "job": {"action": "tracer", "projectId": project, "priority": 12}}),
            json!(["body", "job", "priority"]),
        ),
        (
            json!({"name": "x", "cron": "@daily", "job": {"action": "sweep", "projectId": project}}),
            json!(["body", "job", "action"]),
        ),
        (
            json!({"name": "x", "cron": "@daily", "job": {"action": "tracer", "projectId": project, "runAt": "2030-01-01T00:00:00Z"}}),
            json!(["body", "job", "runAt"]),
        ),
        (
            json!({"name": "x", "cron": "@daily", "orgId": org.org_id, "job": {"action": "tracer", "projectId": project, "orgId": other.org_id}}),
            json!(["body", "job", "orgId"]),
        ),
    ] {
        let issues = validation_issues(app.post(SCHEDULES, &org.api_key, &body).await).await;
        assert!(
            issues.iter().any(|issue| issue["loc"] == loc),
            "{body}: expected an issue at {loc}, got {issues:?}"
        );
    }
    // Another organization's project is 404, as for a job.
    let foreign = app.create_project(&other, "theirs").await;
    let response = app
        .post(
            SCHEDULES,
            &org.api_key,
            &json!({"name": "x", "cron": "@daily", "job": tracer_job(&foreign)}),
        )
        .await;
    assert_eq!(
        code_of(response, StatusCode::NOT_FOUND).await,
        "project_not_found"
    );

    let before = Utc::now();
    let created = json_of(
        app.post(
            SCHEDULES,
            &org.api_key,
            &json!({"name": "nightly eval", "cron": "30 2 * * *",
            "timezone": "Europe/Berlin", "job": tracer_job(&project), "catchUp": "latest"}),
        )
        .await,
        StatusCode::CREATED,
    )
    .await;
    let id = created["scheduleId"].as_str().unwrap().to_owned();
    assert_eq!(created["orgId"], org.org_id.as_str());
    assert_eq!(created["projectId"], project.as_str());
    assert_eq!(created["enabled"], true);
    assert_eq!(created["catchUp"], "latest");
    assert_eq!(created["job"], tracer_job(&project));
    let next: DateTime<Utc> = created["nextRunAt"].as_str().unwrap().parse().unwrap();
    assert!(
        next > before && next - before <= chrono::Duration::hours(25),
        "{next}"
    );
    let next_runs = created["nextRuns"].as_array().unwrap();
    assert_eq!(next_runs.len(), 5);
    assert_eq!(next_runs[0], created["nextRunAt"]);
    // 02:30 on Berlin's clock: 01:30 or 00:30 UTC, by the season.
    assert!([0, 1].contains(&next.hour()) && next.minute() == 30, "{next}");

    // Defaults: UTC, enabled, no catch-up.
    let plain = json_of(
        app.post(SCHEDULES, &org.api_key, &body("@hourly")).await,
        StatusCode::CREATED,
    )
    .await;
    assert_eq!(
        (plain["timezone"].as_str(), plain["catchUp"].as_str()),
        (Some("UTC"), Some("none"))
    );

    let list = json_of(app.get(SCHEDULES, &org.api_key).await, StatusCode::OK).await;
    assert_eq!(list["schedules"].as_array().unwrap().len(), 2);
    let theirs = json_of(app.get(SCHEDULES, &other.api_key).await, StatusCode::OK).await;
    assert!(theirs["schedules"].as_array().unwrap().is_empty());
    let path = format!("{SCHEDULES}/{id}");
    assert_eq!(
        json_of(app.get(&path, &org.api_key).await, StatusCode::OK).await["name"],
        "nightly eval"
    );
    assert_eq!(
        code_of(app.get(&path, &other.api_key).await, StatusCode::NOT_FOUND).await,
        "schedule_not_found"
    );

    let patch = |body: Value| {
        app.request(reqwest::Method::PATCH, &path, Some(&org.api_key))
            .json(&body)
            .send()
    };
    let disabled = json_of(patch(json!({"enabled": false})).await.unwrap(), StatusCode::OK).await;
    assert_eq!(disabled["nextRunAt"], Value::Null);
    assert!(disabled["nextRuns"].as_array().unwrap().is_empty());
    let issues = validation_issues(patch(json!({"cron": "every day"})).await.unwrap()).await;
    assert_eq!(issues[0]["loc"], json!(["body", "cron"]));
    let issues = validation_issues(patch(json!({"timezone": "Europe/Nowhere"})).await.unwrap()).await;
    assert_eq!(issues[0]["loc"], json!(["body", "timezone"]));
    let changed = json_of(
        patch(
            json!({"enabled": true, "cron": "0 */6 * * *", "timezone": "UTC", "name": "four a day",
            "job": {"action": "draft", "projectId": project, "prompt": "summarise"}}),
        )
        .await
        .unwrap(),
        StatusCode::OK,
    )
    .await;
    assert_eq!(changed["name"], "four a day");
    assert_eq!(changed["job"]["action"], "draft");
    let next: DateTime<Utc> = changed["nextRunAt"].as_str().unwrap().parse().unwrap();
    assert_eq!((next.hour() % 6, next.minute(), next.second()), (0, 0, 0));

    assert_eq!(
        app.delete(&path, &org.api_key).await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        code_of(app.get(&path, &org.api_key).await, StatusCode::NOT_FOUND).await,
        "schedule_not_found"
    );
    let run = app.post(&format!("{path}/run"), &org.api_key, &json!({})).await;
    assert_eq!(code_of(run, StatusCode::NOT_FOUND).await, "schedule_not_found");
    let text = app.get(&format!("{SCHEDULES}/not-an-id"), &org.api_key).await;
    assert_eq!(code_of(text, StatusCode::NOT_FOUND).await, "schedule_not_found");
}

#[actix_web::test]
async fn a_seconds_schedule_enqueues_a_job_each_tick_within_two_seconds_even_unfunded_or_paused_until_disabled(
) {
    // No starter credit: the organization cannot pay a run fee, and its ticks still enqueue.
    let app = spawn_app_with(|s| s.billing.starter_credit_cents = keel_core::domain::Cents(0)).await;
    let org = app.create_org("Unfunded").await;
    assert_eq!(app.balance_microcents(&org).await, 0);
    let project = app.create_project(&org, "evals").await;
    let paused = app
        .post("/api/internal/queue/tracer/pause", INTERNAL_KEY, &json!({}))
        .await;
    assert_eq!(paused.status(), StatusCode::OK);
    let created = json_of(
        app.post(
            SCHEDULES,
            &org.api_key,
            &json!({"name": "every second", "cron": "* * * * * *",
            "job": tracer_job(&project)}),
        )
        .await,
        StatusCode::CREATED,
    )
    .await;
    let id = created["scheduleId"].as_str().unwrap().to_owned();
    actix_web::rt::time::sleep(Duration::from_millis(4_500)).await;

    let jobs = json_of(
        app.get("/api/training/jobs?limit=100", &org.api_key).await,
        StatusCode::OK,
    )
    .await;
    let jobs: Vec<&Value> = jobs["jobs"].as_array().unwrap().iter().collect();
    assert!((3..=6).contains(&jobs.len()), "{} jobs in 4.5 s", jobs.len());
    let mut ticks = Vec::new();
    for job in &jobs {
        assert_eq!(job["scheduleId"], id.as_str());
        assert_eq!(job["action"], "tracer");
        assert_eq!(job["priority"], 3);
        // Queued (the action is paused, the organization unfunded): nothing refused them.
        assert_eq!(job["status"], "queued");
        let tick: DateTime<Utc> = job["scheduleTick"].as_str().unwrap().parse().unwrap();
        let created: DateTime<Utc> = job["createdAt"].as_str().unwrap().parse().unwrap();
        assert!(
            created >= tick && created - tick < chrono::Duration::seconds(2),
            "tick {tick}, job at {created}"
        );
        ticks.push(tick);
    }
    ticks.sort();
    assert_each_second_once(&ticks, "one instance");

    let view = json_of(
        app.get(&format!("{SCHEDULES}/{id}"), &org.api_key).await,
        StatusCode::OK,
    )
    .await;
    let recent = view["recentJobs"].as_array().unwrap();
    assert!((jobs.len().min(5)..=5).contains(&recent.len()), "{recent:?}");
    assert_eq!(recent[0]["status"], "queued");
    assert!(view["lastTickAt"].is_string());

    // Disabled: no tick enqueues.
    let disabled = app
        .request(
            reqwest::Method::PATCH,
            &format!("{SCHEDULES}/{id}"),
            Some(&org.api_key),
        )
        .json(&json!({"enabled": false}))
        .send()
        .await
        .unwrap();
    assert_eq!(disabled.status(), StatusCode::OK);
    let count = ticks_by_schedule(&app.db_url).await[&id].len();
    actix_web::rt::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        ticks_by_schedule(&app.db_url).await[&id].len(),
        count,
        "a disabled schedule ticked"
    );

    // Run now: one job, disabled or not, with the schedule's id and no tick.
    let run = json_of(
        app.post(&format!("{SCHEDULES}/{id}/run"), &org.api_key, &json!({}))
            .await,
        StatusCode::ACCEPTED,
    )
    .await;
    assert_eq!(run["scheduleId"], id.as_str());
    assert_eq!(run["scheduleTick"], Value::Null);
    assert_eq!(run["status"], "queued");
    let read = json_of(
        app.get(
            &format!("/api/training/jobs/{}", run["jobId"].as_str().unwrap()),
            &org.api_key,
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(read["scheduleId"], id.as_str());

    // Every job of the schedule, its ticks' and the run now's; a job of no schedule is not one.
    app.post("/api/training/jobs", &org.api_key, &tracer_job(&project))
        .await;
    let of_schedule = json_of(
        app.get(
            &format!("/api/training/jobs?scheduleId={id}&limit=200"),
            &org.api_key,
        )
        .await,
        StatusCode::OK,
    )
    .await;
    let listed = of_schedule["jobs"].as_array().unwrap();
    assert_eq!(listed.len(), count + 1);
    assert!(listed.iter().all(|job| job["scheduleId"] == id.as_str()));
    assert_eq!(listed[0]["jobId"], run["jobId"]);
    let unknown = json_of(
        app.get("/api/training/jobs?scheduleId=not-a-schedule", &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await;
    assert!(unknown["jobs"].as_array().unwrap().is_empty());

    let metrics = app.metrics_text().await;
    assert!(metric(&metrics, "keel_schedule_enqueued_total{trigger=\"tick\"}") >= count as f64);
    assert_eq!(
        metric(&metrics, "keel_schedule_enqueued_total{trigger=\"run_now\"}"),
        1.0
    );
    assert_eq!(metric(&metrics, "keel_schedule_lag_seconds"), 0.0);
}

/// A schedule's body for a `keel serve` process.
async fn create_on(base: &str, key: &str, project: &str, name: &str, cron: &str, catch_up: &str) -> String {
    let response = reqwest::Client::new()
        .post(format!("{base}{SCHEDULES}"))
        .bearer_auth(key)
        .json(&json!({"name": name, "cron": cron, "catchUp": catch_up, "job": tracer_job(project)}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    response.json::<Value>().await.unwrap()["scheduleId"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn project_on(base: &str, key: &str, org_id: &str) -> String {
    let response = reqwest::Client::new()
        .post(format!("{base}/api/projects"))
        .bearer_auth(key)
        .json(&json!({"orgId": org_id, "name": "evals"}))
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    response.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[actix_web::test]
async fn a_tick_missed_while_no_instance_ran_enqueues_nothing_or_only_the_latest() {
    let db = TestDb::new().await;
    // A tick more than a second late counts as missed.
    let envs = [("KEEL__QUEUE__SCHEDULE_GRACE_SECS", "1")];
    let mut instance = Instance::started(&db.url, &envs).await;
    let http = reqwest::Client::new();
    let (org_id, key) = org_with_key(&http, &instance.base, "Restarts").await;
    let project = project_on(&instance.base, &key, &org_id).await;
    // Two daily ticks a few seconds ahead, at the same second of the day.
    let tick = (Utc::now() + chrono::Duration::seconds(5))
        .with_nanosecond(0)
        .unwrap();
    let cron = format!("{} {} {} * * *", tick.second(), tick.minute(), tick.hour());
    let none = create_on(&instance.base, &key, &project, "none", &cron, "none").await;
    let latest = create_on(&instance.base, &key, &project, "latest", &cron, "latest").await;
    let seconds = create_on(&instance.base, &key, &project, "seconds", "* * * * * *", "none").await;
    let down_from = Utc::now();
    instance.kill9();
    // Every instance down through the tick and past its grace.
    while Utc::now() < tick + chrono::Duration::seconds(4) {
        actix_web::rt::time::sleep(Duration::from_millis(200)).await;
    }
    instance.restart(&[]).await;
    let up_at = Utc::now();
    let caught_up = eventually(|| async { ticks_by_schedule(&db.url).await.contains_key(&latest) }).await;
    assert!(caught_up, "catchUp latest enqueued nothing");
    actix_web::rt::time::sleep(Duration::from_millis(1_500)).await;
    let ticks = ticks_by_schedule(&db.url).await;
    assert_eq!(
        ticks[&latest],
        vec![tick],
        "catchUp latest: the missed tick, once"
    );
    assert!(
        !ticks.contains_key(&none),
        "catchUp none enqueued {:?}",
        ticks.get(&none)
    );
    // The per-second schedule: nothing for the seconds no instance ran, then every second.
    let seconds_ticks = &ticks[&seconds];
    assert!(
        !seconds_ticks
            .iter()
            .any(|t| *t > down_from + chrono::Duration::seconds(1)
                && *t < up_at - chrono::Duration::seconds(4)),
        "ticks of the outage ({down_from} to {up_at}) were enqueued: {seconds_ticks:?}"
    );
    let after: Vec<DateTime<Utc>> = seconds_ticks.iter().copied().filter(|t| *t >= up_at).collect();
    assert!(
        !after.is_empty(),
        "nothing ticked after the restart: {seconds_ticks:?}"
    );
    assert_each_second_once(&after, "after the restart");
    // Both daily schedules go on from tomorrow's tick.
    for id in [&none, &latest] {
        let view: Value = http
            .get(instance.url(&format!("{SCHEDULES}/{id}")))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            view["nextRunAt"]
                .as_str()
                .unwrap()
                .parse::<DateTime<Utc>>()
                .unwrap(),
            tick + chrono::Duration::days(1)
        );
    }
    let metrics = http
        .get(instance.url("/metrics"))
        .bearer_auth(INTERNAL_KEY)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        metric(&metrics, "keel_schedule_enqueued_total{trigger=\"catch_up\"}"),
        1.0
    );
}

#[actix_web::test]
async fn each_tick_is_one_job_through_kill_9_with_instances_racing() {
    let db = TestDb::new().await;
    let mut a = Instance::started(&db.url, &[]).await;
    // SQLite is one instance by design; on PostgreSQL a second races the first.
    let b = match postgres() {
        true => Some(Instance::started(&db.url, &[]).await),
        false => None,
    };
    let http = reqwest::Client::new();
    let (org_id, key) = org_with_key(&http, &a.base, "Racing").await;
    let project = project_on(&a.base, &key, &org_id).await;
    // Ten per-second schedules: a pass takes long enough that a kill lands inside one.
    let mut ids = Vec::new();
    for n in 0..10 {
        ids.push(create_on(&a.base, &key, &project, &format!("s{n}"), "* * * * * *", "none").await);
    }
    let started = Utc::now();
    for pause_ms in [2_300, 1_700, 2_900] {
        actix_web::rt::time::sleep(Duration::from_millis(pause_ms)).await;
        a.kill9();
        actix_web::rt::time::sleep(Duration::from_millis(700)).await;
        a.restart(&[]).await;
    }
    actix_web::rt::time::sleep(Duration::from_millis(2_500)).await;
    // Stop ticking, then read what the ticks made.
    for id in &ids {
        let response = http
            .patch(a.url(&format!("{SCHEDULES}/{id}")))
            .bearer_auth(&key)
            .json(&json!({"enabled": false}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    let ended = Utc::now();
    drop(b);
    let ticks = ticks_by_schedule(&db.url).await;
    assert_eq!(ticks.len(), ids.len());
    for id in &ids {
        let of = &ticks[id];
        // Within the default grace (60 s) a tick enqueued late after a restart is on time:
        // every second from the first tick on has its one job.
        assert_each_second_once(of, id);
        assert!(
            of[0] <= started + chrono::Duration::seconds(2),
            "{id}: first tick {}",
            of[0]
        );
        assert!(
            *of.last().unwrap() >= ended - chrono::Duration::seconds(3),
            "{id}: last tick {}",
            of.last().unwrap()
        );
    }
}

#[actix_web::test]
async fn the_console_shows_each_schedules_next_ticks_and_latest_jobs_and_enables_disables_and_runs_it() {
    use crate::console::{org_path, Console};
    let app = spawn_app().await;
    let org = app.create_org("Console").await;
    let project = app.create_project(&org, "evals").await;
    let created = json_of(
        app.post(
            SCHEDULES,
            &org.api_key,
            &json!({"name": "nightly <eval>", "cron": "0 3 * * *",
            "timezone": "America/New_York", "job": tracer_job(&project)}),
        )
        .await,
        StatusCode::CREATED,
    )
    .await;
    let id = created["scheduleId"].as_str().unwrap().to_owned();
    let console = Console::sign_in(&app, &org.api_key).await;
    let page = console.page(&org_path(&org, "/schedules")).await;
    assert!(
        page.contains("nightly &#60;eval&#62;") && !page.contains("nightly <eval>"),
        "{page}"
    );
    assert!(
        page.contains("<code>0 3 * * *</code> in America/New_York"),
        "{page}"
    );
    // Five next ticks, the first the API's nextRunAt; no job yet.
    let section = &page[page.find(&format!("id=\"schedule-{id}\"")).unwrap()..];
    let next = &section
        [section.find("class=\"next-runs\"").unwrap()..section.find("class=\"recent-jobs\"").unwrap()];
    assert_eq!(next.matches("<br>").count(), 5, "{next}");
    assert!(section.contains("none yet"));

    let ran = console
        .submit(&org_path(&org, &format!("/schedules/{id}/run")), &[])
        .await;
    assert!(ran.contains("queued."), "{ran}");
    assert!(
        ran.contains("run now</a> <span class=\"status s-queued\">queued</span>"),
        "{ran}"
    );
    let disabled = console
        .submit(
            &org_path(&org, &format!("/schedules/{id}/enabled")),
            &[("enabled", "false")],
        )
        .await;
    assert!(disabled.contains("disabled: no tick enqueues"), "{disabled}");
    assert!(disabled.contains(&format!("id=\"enable-{id}\"")), "{disabled}");
    assert!(disabled.contains("none (disabled)"));
    let api = json_of(
        app.get(&format!("{SCHEDULES}/{id}"), &org.api_key).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(api["enabled"], false);
    assert_eq!(api["recentJobs"].as_array().unwrap().len(), 1);
    let enabled = console
        .submit(
            &org_path(&org, &format!("/schedules/{id}/enabled")),
            &[("enabled", "true")],
        )
        .await;
    assert!(enabled.contains("enabled: next tick"), "{enabled}");
    // A form without the session's CSRF token changes nothing.
    let forged = console
        .post_raw(
            &org_path(&org, &format!("/schedules/{id}/enabled")),
            &[("enabled", "false")],
        )
        .await;
    assert!(forged.status().is_client_error());
    let api = json_of(
        app.get(&format!("{SCHEDULES}/{id}"), &org.api_key).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(api["enabled"], true);
    // Another organization's schedule is not found.
    let other = app.create_org("Other").await;
    let theirs = Console::sign_in(&app, &other.api_key).await;
    let response = theirs
        .post(&org_path(&other, &format!("/schedules/{id}/run")), &[])
        .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
}

#[actix_web::test]
async fn creates_at_once_never_pass_the_limit_of_a_hundred_schedules() {
    let app = spawn_app().await;
    let org = app.create_org("Many").await;
    let project = app.create_project(&org, "evals").await;
    let body = |n: usize| json!({"name": format!("s{n}"), "cron": "@daily", "job": tracer_job(&project)});
    for n in 0..90 {
        let response = app.post(SCHEDULES, &org.api_key, &body(n)).await;
        assert_eq!(response.status(), StatusCode::CREATED);
    }
    let sends = (90..130).map(|n| {
        let (client, url, key, body) = (
            app.client.clone(),
            app.url(SCHEDULES),
            org.api_key.clone(),
            body(n),
        );
        async move {
            client
                .post(url)
                .bearer_auth(key)
                .json(&body)
                .send()
                .await
                .unwrap()
        }
    });
    let mut created = 0;
    for response in futures_util::future::join_all(sends).await {
        match response.status() {
            StatusCode::CREATED => created += 1,
            StatusCode::CONFLICT => {
                assert_eq!(
                    response.json::<Value>().await.unwrap()["code"],
                    "schedule_limit_reached"
                )
            }
            other => panic!("{other}"),
        }
    }
    assert_eq!(created, 10, "forty creates at once past ninety");
    let list = json_of(app.get(SCHEDULES, &org.api_key).await, StatusCode::OK).await;
    assert_eq!(list["schedules"].as_array().unwrap().len(), 100);
}
