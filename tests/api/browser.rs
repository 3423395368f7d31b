//! The console in a real browser: Chromium through chromedriver (fantoccini). Without
//! Chromium these tests say so and pass, unless `KEEL_BROWSER_TESTS=required` (as `.ci/run`
//! sets it), which makes a missing browser a failure.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::console::{claim_and_fail, traced_app, HOSTILE};
use crate::helpers::*;
use crate::queue::{claim, tracer};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const WIDTHS: [(u32, &str); 2] = [(1280, "desktop"), (390, "phone")];

/// A headless Chromium driven through its own chromedriver; both end with it.
struct Browser {
    client: Client,
    driver: Child,
    downloads: tempfile::TempDir,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Browser {
    /// `None` (and a line saying why) when there is no browser and none is required.
    async fn start() -> Option<Self> {
        if !(Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists()) {
            let required = std::env::var("KEEL_BROWSER_TESTS").is_ok_and(|v| v == "required");
            assert!(
                !required,
                "KEEL_BROWSER_TESTS=required but {CHROMIUM} or {CHROMEDRIVER} is missing"
            );
            say_skipped("needs Chromium: install chromium and chromium-driver to run it");
            return None;
        }
        let port = free_port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let downloads = tempfile::tempdir().unwrap();
        let profile = tempfile::tempdir().unwrap();
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--window-size=1280,900",
                    format!("--user-data-dir={}", profile.path().display())],
                "prefs": {
                    "download.default_directory": downloads.path().display().to_string(),
                    "download.prompt_for_download": false,
                },
            }),
        );
        let mut last = None;
        for _ in 0..50 {
            match ClientBuilder::native()
                .capabilities(caps.clone())
                .connect(&format!("http://127.0.0.1:{port}"))
                .await
            {
                Ok(client) => {
                    return Some(Self {
                        client,
                        driver,
                        downloads,
                        _profile: profile,
                    })
                }
                Err(err) => last = Some(err),
            }
            actix_web::rt::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("chromedriver did not answer: {last:?}");
    }

    async fn open(&self, app: &TestApp, path: &str) {
        self.client.goto(&app.url(path)).await.unwrap();
    }

    async fn text(&self, css: &str) -> String {
        self.client
            .wait()
            .for_element(Locator::Css(css))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    async fn click(&self, css: &str) {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
    }

    /// Clicks what submits a form and waits for the next page to have loaded.
    async fn submit(&self, css: &str) {
        self.client
            .execute("window.__keelOld = true;", vec![])
            .await
            .unwrap();
        self.click(css).await;
        for _ in 0..100 {
            let loaded = self
                .client
                .execute(
                    "return window.__keelOld !== true && document.readyState === 'complete';",
                    vec![],
                )
                .await;
            if loaded.is_ok_and(|v| v == Value::Bool(true)) {
                return;
            }
            actix_web::rt::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no page after submitting {css}");
    }

    async fn fill(&self, css: &str, value: &str) {
        let field = self.client.find(Locator::Css(css)).await.unwrap();
        field.clear().await.unwrap();
        field.send_keys(value).await.unwrap();
    }

    /// Saves the page at both widths under `target/console-shots/` and checks that nothing
    /// overflows the phone's width (tables scroll inside their box).
    async fn shoot(&self, name: &str) {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/console-shots");
        std::fs::create_dir_all(&dir).unwrap();
        for (width, label) in WIDTHS {
            self.client.set_window_size(width, 900).await.unwrap();
            let overflow = self
                .client
                .execute(
                    "return document.documentElement.scrollWidth - document.documentElement.clientWidth;",
                    vec![],
                )
                .await
                .unwrap();
            if overflow.as_i64().unwrap_or(0) > 0 {
                // Name the elements that reach past the window, to say where to look.
                let culprits = self
                    .client
                    .execute(
                        "var w = document.documentElement.clientWidth; return Array.from(document.querySelectorAll('body *')).filter(function (e) { return e.getBoundingClientRect().right > w + 1 && !(e.parentElement && e.parentElement.closest('.scroll')); }).slice(0, 8).map(function (e) { return e.tagName + '#' + e.id + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right); }).join(', ');",
                        vec![],
                    )
                    .await
                    .unwrap();
                panic!("{name} overflows at {width} px by {overflow}: {culprits}");
            }
            let png = self.client.screenshot().await.unwrap();
            std::fs::write(dir.join(format!("{name}-{label}.png")), png).unwrap();
        }
        self.client.set_window_size(1280, 900).await.unwrap();
    }

    /// No alert is open (a script that ran would have opened one).
    async fn assert_no_alert(&self) {
        assert!(self.client.get_alert_text().await.is_err(), "a script ran");
    }

    async fn downloaded(&self) -> String {
        for _ in 0..100 {
            let files: Vec<_> = std::fs::read_dir(self.downloads.path())
                .unwrap()
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
                .collect();
            if let Some(file) = files.first() {
                return std::fs::read_to_string(file).unwrap();
            }
            actix_web::rt::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no download arrived");
    }
}

#[actix_web::test]
async fn an_owner_signs_in_redeems_a_promo_stops_a_job_exports_two_traces_and_signs_out() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let (app, _provider, org, project, traces) = traced_app().await;
    app.fund(&org, 1000).await;
    let job_project = app.create_project(&org, "Vision").await;
    tracer(&app, &org, &job_project).await;
    let claimed = claim(&app, "worker-1", "tracer", 1).await;
    let job = claimed[0]["job_id"].as_str().unwrap().to_owned();
    let org_home = format!("/console/o/{}", org.org_id);
    // Something on the evals and runs pages.
    for passed in [false, true] {
        let cases = json!([
            {"case_id": "a", "input": "2+2", "expected": "4", "actual": "4", "score": 1.0, "success": true},
            {"case_id": "b", "input": "3+3", "expected": "6", "actual": if passed { "6" } else { "7" }, "score": if passed { 1.0 } else { 0.0 }, "success": passed}
        ]);
        let upload = app
            .post(
                "/api/evals/runs",
                &org.api_key,
                &crate::traces::eval_body(&project, cases),
            )
            .await;
        assert_eq!(upload.status(), StatusCode::OK);
    }
    let run = json_of(
        app.post(
            "/api/runs",
            &org.api_key,
            &json!({"projectId": project, "name": "sft-1", "model": "llama"}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    let checkpoints = json!({"orgId": org.org_id, "projectId": project, "runId": run["runId"],
        "checkpoints": [{"step": 100, "subfolder": "step-100"}, {"step": 200, "subfolder": "step-200"}]});
    let stored = app
        .post("/api/runs/internal/checkpoints", INTERNAL_KEY, &checkpoints)
        .await;
    assert!(stored.status().is_success());

    // Sign in with the API key.
    browser.open(&app, "/console").await;
    assert!(browser
        .client
        .current_url()
        .await
        .unwrap()
        .path()
        .ends_with("/console/login"));
    browser.shoot("login").await;
    browser.fill("#credential", "wrong").await;
    browser.submit("button[type=submit]").await;
    assert!(browser.text(".flash.error").await.contains("not accepted"));
    browser.fill("#credential", &org.api_key).await;
    browser.submit("button[type=submit]").await;
    // $10.00 funded, less the run fee charged at the claim.
    assert_eq!(browser.text("#balance").await, "$9.00");

    // Redeem a promo code: the balance changes.
    browser.fill("#code", "WELCOME10").await;
    browser.submit("form[action$='/promo'] button").await;
    assert!(browser.text(".flash").await.contains("$10.00 credited"));
    assert_eq!(browser.text("#balance").await, "$19.00");
    assert_eq!(app.billing(&org).await["balanceCents"], 1900);
    browser.shoot("overview").await;

    for (name, path) in [
        ("ledger", "/ledger"),
        ("jobs", "/jobs"),
        ("traces", "/traces"),
        ("evals", "/evals"),
        ("runs", "/runs"),
        ("keys", "/keys"),
    ] {
        browser.open(&app, &format!("{org_home}{path}")).await;
        browser.text("h1").await;
        browser.shoot(name).await;
    }
    // Each list says how many it holds.
    for (path, total, says) in [
        ("/evals", "#eval-runs-total", "2 run(s)."),
        ("/runs", "#runs-total", "1 run(s)."),
        ("/keys", "#keys-total", "1 key(s)."),
    ] {
        browser.open(&app, &format!("{org_home}{path}")).await;
        assert_eq!(browser.text(total).await, says, "{path}");
    }
    browser.open(&app, &format!("{org_home}/ledger?kind=topup")).await;
    assert_eq!(browser.text("#ledger-total").await, "1 entry of kind topup.");

    // Stop the running job.
    browser.open(&app, &format!("{org_home}/jobs/{job}")).await;
    assert_eq!(browser.text("#job-status").await, "running");
    browser.shoot("job").await;
    browser.submit("#stop").await;
    assert_eq!(browser.text("h1").await, "Stop the job?");
    browser.shoot("confirm-stop").await;
    browser.submit("#confirm").await;
    assert!(browser.text(".flash").await.contains("Stop requested"));
    assert_eq!(browser.text("#job-status").await, "stopping");
    let api = json_of(
        app.get(&format!("/api/training/jobs/{job}"), &org.api_key).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(api["status"], "stopping");

    // Open a trace: the hostile one shows as text and runs nothing.
    let hostile = traces
        .iter()
        .find(|t| t["request"].to_string().contains("alert(1)"))
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    browser.open(&app, &format!("{org_home}/traces/{hostile}")).await;
    browser.assert_no_alert().await;
    assert!(browser
        .text("#conversation .role-user .text")
        .await
        .contains(HOSTILE));
    let images = browser.client.find_all(Locator::Css("#main img")).await.unwrap();
    assert!(images.is_empty(), "the recorded <img> is not an element");
    browser.shoot("trace").await;

    // Select two traces and download them; the file is the API's export of those two.
    browser
        .open(&app, &format!("{org_home}/projects/{project}/traces"))
        .await;
    browser.shoot("project-traces").await;
    let ids: Vec<&str> = traces.iter().take(2).map(|t| t["id"].as_str().unwrap()).collect();
    for id in &ids {
        browser.click(&format!("#sel-{id}")).await;
    }
    browser.click("#export-selected").await;
    let file = browser.downloaded().await;
    let lines: Vec<Value> = file.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let api = json_of(
        app.post(
            "/api/traces/export",
            &org.api_key,
            &json!({"traceIds": ids, "format": "records"}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(json!(lines), api["records"]);

    // Sign out.
    browser.open(&app, &org_home).await;
    browser.submit(".logout button").await;
    assert!(browser
        .client
        .current_url()
        .await
        .unwrap()
        .path()
        .ends_with("/console/login"));
    browser.open(&app, &org_home).await;
    assert!(browser
        .client
        .current_url()
        .await
        .unwrap()
        .path()
        .ends_with("/console/login"));
    browser.client.clone().close().await.unwrap();
}

#[actix_web::test]
async fn the_operator_pages_render_at_both_widths() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    app.fund(&org, 1000).await;
    let project = app.create_project(&org, "Vision").await;
    for _ in 0..3 {
        tracer(&app, &org, &project).await;
    }
    claim(&app, "worker-1", "tracer", 2).await;
    browser.open(&app, "/console/login").await;
    browser.fill("#credential", INTERNAL_KEY).await;
    browser.submit("button[type=submit]").await;
    assert!(browser.text("h1").await.contains("Organizations"));
    browser.shoot("operator-orgs").await;
    browser.open(&app, "/console/operator/queue").await;
    assert!(browser.text("#queue-counts").await.contains("tracer"));
    browser.shoot("operator-queue").await;
    browser.submit("#requeue-stale").await;
    assert_eq!(browser.text("h1").await, "Requeue stale jobs?");
    browser.submit("#confirm").await;
    assert!(browser.text(".flash").await.contains("Stale sweep"));
    browser.open(&app, "/console/operator/writer").await;
    browser.shoot("operator-writer").await;
    browser.client.clone().close().await.unwrap();
}

#[actix_web::test]
async fn an_operator_pauses_and_resumes_an_action_and_an_owner_retries_a_failed_job() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    app.fund(&org, 1000).await;
    let project = app.create_project(&org, "Vision").await;
    let job = tracer(&app, &org, &project).await;
    tracer(&app, &org, &project).await;
    claim(&app, "worker-1", "tracer", 1).await;
    let failed = app
        .post(
            "/api/training/internal/jobs/failed",
            INTERNAL_KEY,
            &json!({"job_id": job, "worker_id": "worker-1", "error": "CUDA out of memory"}),
        )
        .await;
    assert_eq!(failed.status(), StatusCode::OK);
    claim(&app, "worker-2", "tracer", 1).await;
    app.put(
        &format!("/api/internal/orgs/{}/queue", org.org_id),
        INTERNAL_KEY,
        &json!({"weight": 4, "maxRunning": 1}),
    )
    .await;

    // The operator: the organization at its cap, then a pause and a resume.
    browser.open(&app, "/console/login").await;
    browser.fill("#credential", INTERNAL_KEY).await;
    browser.submit("button[type=submit]").await;
    browser.open(&app, "/console/operator/queue").await;
    let shares = browser.text("#shares").await;
    assert!(shares.contains("Acme") && shares.contains("(at cap)"), "{shares}");
    browser.submit("#pause-tracer").await;
    // Asked first: Cancel goes back with nothing paused.
    assert_eq!(browser.text("h1").await, "Pause the queue?");
    browser.submit("#cancel").await;
    assert!(browser.text("#queue-tracer").await.contains("open"));
    browser.submit("#pause-tracer").await;
    browser.submit("#confirm").await;
    assert!(browser.text(".flash").await.contains("paused"));
    assert!(browser.text("#queue-tracer").await.contains("paused"));
    browser.shoot("operator-queue-paused").await;
    let body = json!({"worker_id": "w9", "action": "tracer", "limit": 5});
    let claimed = json_of(
        app.post("/api/training/internal/jobs/claim", INTERNAL_KEY, &body)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(claimed["jobs"].as_array().unwrap().len(), 0);
    browser.submit("#resume-tracer").await;
    assert!(browser.text(".flash").await.contains("resumed"));
    assert!(browser.text("#queue-tracer").await.contains("open"));

    // The owner: the failed job's attempt, then Retry.
    browser.client.delete_all_cookies().await.unwrap();
    browser.open(&app, "/console/login").await;
    browser.fill("#credential", &org.api_key).await;
    browser.submit("button[type=submit]").await;
    browser
        .open(&app, &format!("/console/o/{}/jobs/{job}", org.org_id))
        .await;
    let history = browser.text("#history").await;
    assert!(
        history.contains("worker-1") && history.contains("failed") && history.contains("CUDA out of memory"),
        "{history}"
    );
    assert!(browser.text("#job-priority").await.starts_with('5'));
    browser.shoot("job-failed").await;
    browser.submit("#retry").await;
    assert_eq!(browser.text("h1").await, "Retry the job?");
    browser.submit("#confirm").await;
    assert!(browser.text(".flash").await.contains("queued again"));
    assert_eq!(browser.text("#job-status").await, "queued");
    browser.client.clone().close().await.unwrap();
}

#[actix_web::test]
async fn an_operator_finds_failed_jobs_retries_two_at_once_and_reads_the_throughput_chart() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_app().await;
    let acme = app.create_org("Acme").await;
    let other = app.create_org("Other").await;
    let mut failed = Vec::new();
    for (org, error) in [
        (&acme, "CUDA out of memory"),
        (&acme, "CUDA out of memory"),
        (&other, "dataset missing"),
    ] {
        app.fund(org, 1000).await;
        let project = app.create_project(org, "Vision").await;
        let job = tracer(&app, org, &project).await;
        claim_and_fail(&app, &job, "worker-1", error).await;
        failed.push(job);
    }
    browser.open(&app, "/console/login").await;
    browser.fill("#credential", INTERNAL_KEY).await;
    browser.submit("button[type=submit]").await;

    // The chart: three failed attempts in the last bucket, one bar segment, a summary.
    browser.open(&app, "/console/operator/queue").await;
    assert!(browser.text("#throughput-summary").await.contains("3 failed"));
    let bars = browser
        .client
        .find_all(Locator::Css("#throughput svg rect"))
        .await
        .unwrap();
    assert_eq!(bars.len(), 1);
    assert!(browser.text("#latency-tracer").await.contains("tracer"));
    browser.shoot("operator-throughput").await;

    // Failed jobs, filtered by error text: Acme's two.
    browser.open(&app, "/console/operator/failed").await;
    for job in &failed {
        assert!(browser.text("#failed").await.contains(job.as_str()));
    }
    browser.fill("#filter-q", "cuda").await;
    browser.submit("#filter").await;
    let listed = browser.text("#failed").await;
    assert!(
        listed.contains(&failed[0]) && listed.contains(&failed[1]) && !listed.contains(&failed[2]),
        "{listed}"
    );
    browser.shoot("operator-failed").await;
    for job in &failed[..2] {
        browser
            .click(&format!("#failed-{job} input[type=checkbox]"))
            .await;
    }
    browser.submit("#retry-selected").await;
    assert_eq!(browser.text("h1").await, "Retry failed jobs?");
    let details = browser.text("#confirm-details").await;
    assert!(
        details.contains(&failed[0]) && details.contains(&failed[1]),
        "{details}"
    );
    browser.submit("#confirm").await;
    assert!(browser.text(".flash").await.contains("2 job(s) queued again"));
    for (job, org, status) in [
        (&failed[0], &acme, "queued"),
        (&failed[1], &acme, "queued"),
        (&failed[2], &other, "failed"),
    ] {
        let view = json_of(
            app.get(&format!("/api/training/jobs/{job}"), &org.api_key).await,
            StatusCode::OK,
        )
        .await;
        assert_eq!(view["status"], status, "{job}");
    }
    // The one left, by its own Retry button.
    browser.submit(".retry-one").await;
    browser.submit("#confirm").await;
    assert!(browser.text(".flash").await.contains("1 job(s) queued again"));
    assert!(browser.text("#failed").await.contains("No failed jobs match."));
    browser.client.clone().close().await.unwrap();
}

#[actix_web::test]
async fn long_values_wrap_inside_their_cells() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Vision").await;
    // A 200-character run name without a space, and a model name as long.
    let name = "n".repeat(200);
    let created = app
        .post(
            "/api/runs",
            &org.api_key,
            &json!({"projectId": project, "name": name, "model": "m".repeat(120)}),
        )
        .await;
    assert_eq!(created.status(), reqwest::StatusCode::OK);
    browser.open(&app, "/console/login").await;
    browser.fill("#credential", &org.owner_token).await;
    browser.submit("button[type=submit]").await;
    browser
        .open(&app, &format!("/console/o/{}/runs", org.org_id))
        .await;
    assert!(browser.text("main").await.contains(&name[..50]));
    for width in [1280, 1024] {
        browser.client.set_window_size(width, 900).await.unwrap();
        // No table is wider than the box it scrolls in: its cells wrapped.
        let overflow = browser
            .client
            .execute(
                "return Math.max(0, ...[...document.querySelectorAll('table')].map(t => t.scrollWidth - t.parentElement.clientWidth));",
                vec![],
            )
            .await
            .unwrap();
        assert!(
            overflow.as_i64().unwrap_or(0) <= 0,
            "a table overflows at {width} px by {overflow}"
        );
    }
    browser.shoot("runs-long-names").await;
    browser.client.clone().close().await.unwrap();
}

#[actix_web::test]
async fn a_link_from_another_site_opens_the_console_signed_in() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    browser.open(&app, "/console/login").await;
    browser.fill("#credential", &org.api_key).await;
    browser.submit("button[type=submit]").await;
    assert!(browser.text("h1").await.contains("Overview"));
    // localhost and 127.0.0.1 are different sites: a page on one links to the console on
    // the other, as a chat message or a ticket would.
    let other_site = app.url("/console/login").replace("127.0.0.1", "localhost");
    browser.client.goto(&other_site).await.unwrap();
    let ledger = app.url(&format!("/console/o/{}/ledger", org.org_id));
    browser
        .client
        .execute(
            "const a = document.createElement('a'); a.href = arguments[0]; a.id = 'away'; a.textContent = 'ledger'; document.body.append(a);",
            vec![json!(ledger)],
        )
        .await
        .unwrap();
    browser.click("#away").await;
    assert!(
        browser.text("h1").await.contains("Ledger"),
        "signed out by a cross-site link: {}",
        browser.text("h1").await
    );
    // Still signed in afterwards (the cookie was not cleared).
    browser.open(&app, &format!("/console/o/{}", org.org_id)).await;
    assert!(browser.text("h1").await.contains("Overview"));
    browser.client.clone().close().await.unwrap();
}

#[actix_web::test]
async fn a_page_on_another_site_cannot_sign_a_visitor_in() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_app().await;
    let attacker = app.create_org("Attacker").await;
    // The attacker's page, on another loopback origin: a form that posts the attacker's key
    // to keel's sign-in (a script would submit it on load; the visitor clicks here).
    let page = format!(
        "<!doctype html><form method=post action=\"{}\"><input name=credential value=\"{}\"><button id=go>Claim your prize</button></form>",
        app.url("/console/login"),
        attacker.api_key
    );
    let attacker_site = crate::fakes::serve(move |cfg: &mut actix_web::web::ServiceConfig| {
        let page = page.clone();
        cfg.default_service(actix_web::web::to(move || {
            let page = page.clone();
            async move { actix_web::HttpResponse::Ok().content_type("text/html").body(page) }
        }));
    })
    .replace("127.0.0.1", "localhost");
    browser.client.goto(&attacker_site).await.unwrap();
    browser.submit("#go").await;
    let at = browser.client.current_url().await.unwrap();
    assert_eq!(at.host_str(), Some("127.0.0.1"), "the form reached keel");
    assert!(
        browser.text(".flash.error").await.contains("another site"),
        "the cross-site sign-in was refused: {}",
        browser.client.source().await.unwrap()
    );
    // The visitor's browser holds no session: the console asks it to sign in.
    browser.open(&app, "/console").await;
    assert!(browser
        .client
        .current_url()
        .await
        .unwrap()
        .path()
        .ends_with("/console/login"));
    // Its own sign-in page works.
    browser.fill("#credential", &attacker.api_key).await;
    browser.submit("button[type=submit]").await;
    assert!(browser.text("h1").await.contains("Overview"));
    browser.client.clone().close().await.unwrap();
}

#[actix_web::test]
async fn a_member_adds_a_webhook_endpoint_sees_its_secret_once_and_a_test_delivery_in_the_log() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_app_with(|s| {
        s.webhooks.allow_http = true;
        s.webhooks.allow_private_destinations = true;
    })
    .await;
    let org = app.create_org("Acme").await;
    let (receiver, url) = crate::fakes::FakeJson::start(|_| {
        crate::fakes::Reply::Json(200, json!({"ok": "<img src=x onerror=alert(1)>"}))
    });
    browser.open(&app, "/console").await;
    browser.fill("#credential", &org.member_token).await;
    browser.submit("button[type=submit]").await;
    browser
        .open(&app, &format!("/console/o/{}/webhooks", org.org_id))
        .await;
    assert_eq!(browser.text("h1").await, "Webhooks");
    browser.fill("#url", &format!("{url}/keel")).await;
    browser.click("input[value='webhook.test']").await;
    browser.click("input[value='job.failed']").await;
    browser.submit("#create-endpoint").await;
    let secret = browser.text("#new-secret").await;
    assert!(secret.starts_with("whsec_"), "{secret}");
    browser.shoot("webhooks").await;
    browser.submit("#endpoints .send-test").await;
    assert!(browser.text(".flash").await.contains("Test event queued"));
    // The delivery arrives, signed with the secret the page showed.
    let mut arrived = Vec::new();
    for _ in 0..60 {
        arrived = receiver.calls();
        if !arrived.is_empty() {
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(arrived.len(), 1);
    let mut headers = http::HeaderMap::new();
    for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
        headers.insert(name, arrived[0].headers[name].parse().unwrap());
    }
    assert!(standardwebhooks::Webhook::new(&secret)
        .unwrap()
        .verify(&arrived[0].raw, &headers)
        .is_ok());
    // The log shows it succeeded, the hostile answer as text.
    let mut status = String::new();
    for _ in 0..40 {
        browser.client.refresh().await.unwrap();
        status = browser.text("#deliveries .status").await;
        if status == "succeeded" {
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, "succeeded");
    assert!(browser
        .text("#deliveries code.answer")
        .await
        .contains("<img src=x"));
    browser.assert_no_alert().await;
    browser.shoot("webhook-log").await;
    // Retry from the log.
    browser.submit("#deliveries .retry").await;
    assert!(browser.text(".flash").await.contains("sent again now"));
    for _ in 0..60 {
        if receiver.calls().len() == 2 {
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(receiver.calls().len(), 2);
}

#[actix_web::test]
async fn an_owner_makes_a_limited_key_sees_its_use_and_edits_its_limit() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let (app, _provider) = crate::proxy::proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "browser").await;
    browser.open(&app, "/console").await;
    browser.fill("#credential", &org.owner_token).await;
    browser.submit("button[type=submit]").await;
    browser
        .open(&app, &format!("/console/o/{}/keys", org.org_id))
        .await;
    browser.fill("#name", "eval harness").await;
    browser.fill("#requestsPerMinute", "5").await;
    browser.fill("#tokensPerDay", "1000").await;
    browser.fill("#models", "gpt-4o-mini").await;
    // For the proxy only.
    browser.click("#new-key-form input[value='api']").await;
    browser.submit("#new-key-form button[type=submit]").await;
    let secret = browser.text("#new-key").await;
    assert!(secret.starts_with("keel_sk_"), "{secret}");
    // Copied with its button: pasted into a field, it is the key.
    browser.click("#copy-new-key").await;
    assert_eq!(browser.text("#new-key-copied").await, "Copied.");
    let field = browser.client.find(Locator::Css("#name")).await.unwrap();
    field.clear().await.unwrap();
    field
        .send_keys(&format!("{}v", fantoccini::key::Key::Control))
        .await
        .unwrap();
    let pasted = browser
        .client
        .execute("return document.getElementById('name').value;", vec![])
        .await
        .unwrap();
    assert_eq!(pasted, json!(secret), "the clipboard holds the key");
    browser.shoot("key-copied").await;
    let caller = org.with_key(&secret);
    let call = crate::proxy::sdk_request(
        &app,
        &caller,
        Some(&project),
        &crate::proxy::chat("gpt-4o-mini", "hi"),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(call.status(), StatusCode::OK);
    assert_eq!(
        app.get("/api/projects", &secret).await.status(),
        StatusCode::FORBIDDEN
    );
    // Today's use against the limits, once written.
    let mut tokens = String::new();
    for _ in 0..60 {
        browser
            .open(&app, &format!("/console/o/{}/keys", org.org_id))
            .await;
        tokens = browser.text("#keys tbody tr:first-child .tokens").await;
        // The tokens and the last use are written apart (the limiter's window, the key's
        // usage flush): both must have landed.
        let used = browser.text("#keys tbody tr:first-child .last-used").await;
        if tokens.starts_with("32") && used != "—" {
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(tokens, "32 of 1,000");
    assert!(browser
        .text("#keys tbody tr:first-child .requests")
        .await
        .contains("at most 5 a minute"));
    assert_ne!(browser.text("#keys tbody tr:first-child .last-used").await, "—");
    browser.shoot("keys-limits").await;
    // Edit its limit.
    browser
        .click("#keys tbody tr:first-child details.edit-key summary")
        .await;
    browser
        .fill("#keys tbody tr:first-child input[name=requestsPerMinute]", "50")
        .await;
    browser
        .submit("#keys tbody tr:first-child details.edit-key button[type=submit]")
        .await;
    assert!(browser.text(".flash").await.contains("API key changed"));
    assert!(browser
        .text("#keys tbody tr:first-child .requests")
        .await
        .contains("at most 50 a minute"));
}

#[actix_web::test]
async fn a_member_searches_traces_selects_all_tags_them_scores_one_and_exports_the_tagged() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let (app, _provider, org, project, traces) = traced_app().await;
    let org_home = format!("/console/o/{}", org.org_id);
    browser.open(&app, "/console").await;
    browser.fill("#credential", &org.member_token).await;
    browser.submit("button[type=submit]").await;
    browser
        .open(&app, &format!("{org_home}/projects/{project}/traces"))
        .await;
    // Search.
    browser.fill("#q", "weather").await;
    browser.submit("#trace-filters button[type=submit]").await;
    let rows = browser
        .client
        .find_all(Locator::Css("#traces input[name=traceIds]"))
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert!(browser
        .text("#traces .preview-input")
        .await
        .contains("Weather in Paris?"));
    browser.shoot("traces-search").await;
    // Every trace: select all, tag them.
    browser
        .open(&app, &format!("{org_home}/projects/{project}/traces"))
        .await;
    browser.click("#select-all").await;
    browser.fill("#bulk-tag", "golden").await;
    browser.submit("#tag-selected").await;
    assert!(browser.text(".flash").await.contains("Tagged 3 traces."));
    // Score one on its page.
    let first = traces[0]["id"].as_str().unwrap();
    browser.open(&app, &format!("{org_home}/traces/{first}")).await;
    browser.fill("#score-name", "quality").await;
    browser.fill("#score-value", "0.8").await;
    browser.submit("#set-score button[type=submit]").await;
    assert!(browser.text(".flash").await.contains("Score saved."));
    assert!(browser.text("#scores").await.contains("0.8"));
    assert!(browser.text("#trace-tags").await.contains("golden"));
    browser.shoot("trace-marks").await;
    // The tagged traces, exported.
    browser
        .open(&app, &format!("{org_home}/projects/{project}/traces?tag=golden"))
        .await;
    browser.click("#select-all").await;
    browser
        .client
        .find(Locator::Css("#format"))
        .await
        .unwrap()
        .select_by_value("raw")
        .await
        .unwrap();
    browser.click("#export-selected").await;
    let file = browser.downloaded().await;
    let lines: Vec<Value> = file.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3);
    assert!(lines.iter().all(|l| l["tags"] == json!(["golden"])));
    let scored = lines.iter().find(|l| l["id"] == first).unwrap();
    assert_eq!(scored["scores"]["quality"]["value"], 0.8);
}

#[actix_web::test]
async fn a_refreshing_page_keeps_the_keyboards_focus() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_app_with(|s| s.console.refresh_secs = 1).await;
    let org = app.create_org("Acme").await;
    app.fund(&org, 1000).await;
    let project = app.create_project(&org, "Vision").await;
    let job = tracer(&app, &org, &project).await;
    claim(&app, "worker-1", "tracer", 1).await;
    browser.open(&app, "/console/login").await;
    browser.fill("#credential", &org.api_key).await;
    browser.submit("button[type=submit]").await;
    browser
        .open(&app, &format!("/console/o/{}/jobs/{job}", org.org_id))
        .await;
    // Tabbed to the Stop button; three refreshes go by.
    browser
        .client
        .execute("document.getElementById('stop').focus();", vec![])
        .await
        .unwrap();
    actix_web::rt::time::sleep(Duration::from_millis(3500)).await;
    let focused = browser
        .client
        .execute(
            "return document.activeElement ? document.activeElement.id : '';",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(focused, json!("stop"), "the focus stayed on Stop");
    // Once the focus leaves, the region refreshes again (the job, stopped meanwhile, shows it).
    app.post(
        &format!("/api/training/jobs/{job}/stop"),
        &org.api_key,
        &json!({}),
    )
    .await;
    browser
        .client
        .execute("document.activeElement.blur();", vec![])
        .await
        .unwrap();
    // Read in one script: the region is replaced every second, so an element found by one
    // call can be gone (stale) by the next.
    let mut status = Value::Null;
    for _ in 0..200 {
        status = browser
            .client
            .execute(
                "var e = document.getElementById('job-status'); return e ? e.textContent.trim() : null;",
                vec![],
            )
            .await
            .unwrap();
        if status == json!("stopping") {
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, json!("stopping"));
    browser.client.clone().close().await.unwrap();
}

#[actix_web::test]
async fn a_member_picks_jobs_that_stay_picked_through_refreshes_stops_them_and_retries_all_a_filter_keeps() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_app_with(|s| s.console.refresh_secs = 1).await;
    let org = app.create_org("Acme").await;
    app.fund(&org, 1000).await;
    let project = app.create_project(&org, "Vision").await;
    let mut jobs = Vec::new();
    for _ in 0..3 {
        jobs.push(tracer(&app, &org, &project).await);
    }
    browser.open(&app, "/console/login").await;
    browser.fill("#credential", &org.member_token).await;
    browser.submit("button[type=submit]").await;
    let list = format!("/console/o/{}/jobs", org.org_id);
    browser.open(&app, &list).await;
    assert_eq!(browser.text("#jobs-total").await, "3 job(s)");
    assert_eq!(browser.text("#chip-queued .count").await, "3");
    assert!(browser.text("#jobs").await.contains("Vision"));
    browser.click(&format!("#sel-{}", jobs[0])).await;
    browser.click(&format!("#sel-{}", jobs[1])).await;
    browser
        .client
        .execute("document.activeElement.blur();", vec![])
        .await
        .unwrap();
    // A job made meanwhile appears by itself; the two picked stay picked.
    let later = tracer(&app, &org, &project).await;
    let mut seen = Value::Null;
    for _ in 0..100 {
        seen = browser
            .client
            .execute(
                &format!("return document.getElementById('job-{later}') !== null;"),
                vec![],
            )
            .await
            .unwrap();
        if seen == json!(true) {
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen, json!(true), "the list refreshed");
    let picked = browser
        .client
        .execute(
            "return Array.from(document.querySelectorAll('input[name=job]:checked')).map(function (b) { return b.value; });",
            vec![],
        )
        .await
        .unwrap();
    let mut picked: Vec<String> = serde_json::from_value(picked).unwrap();
    picked.sort();
    let mut expected = vec![jobs[0].clone(), jobs[1].clone()];
    expected.sort();
    assert_eq!(picked, expected, "the selection survived the refresh");
    browser.shoot("jobs-picked").await;

    // Stop the two: one confirmation that says how many.
    browser.submit("#bulk-stop").await;
    assert_eq!(browser.text("h1").await, "Stop these jobs?");
    assert!(browser
        .text("#confirm-question")
        .await
        .starts_with("Stop 2 job(s)"));
    browser.submit("#confirm").await;
    assert!(browser.text(".flash").await.contains("2 job(s) stopped"));
    for id in &jobs[..2] {
        let api = json_of(
            app.get(&format!("/api/training/jobs/{id}"), &org.api_key).await,
            StatusCode::OK,
        )
        .await;
        assert_eq!(api["status"], "user_stopped");
    }
    assert_eq!(browser.text("#chip-user_stopped .count").await, "2");

    // Everything the filter keeps, retried from the filtered list.
    browser.submit("#chip-user_stopped").await;
    assert_eq!(browser.text("#jobs-total").await, "2 job(s)");
    browser.click("#scope-matching").await;
    browser.submit("#bulk-retry").await;
    assert_eq!(browser.text("h1").await, "Retry these jobs?");
    assert!(browser
        .text("#confirm-question")
        .await
        .starts_with("Retry 2 job(s)"));
    browser.submit("#confirm").await;
    assert!(browser.text(".flash").await.contains("2 job(s) queued again"));
    for id in &jobs[..2] {
        let api = json_of(
            app.get(&format!("/api/training/jobs/{id}"), &org.api_key).await,
            StatusCode::OK,
        )
        .await;
        assert_eq!(api["status"], "queued");
    }
    // Sorted by priority, then paged: the address holds it, and Back returns to it.
    browser.open(&app, &list).await;
    browser.submit("#sort-priority").await;
    let url = browser.client.current_url().await.unwrap();
    assert!(url.query().unwrap_or_default().contains("sort=priority"));
    assert_eq!(browser.text("#sort-priority").await, "priority");
    browser.shoot("jobs-sorted").await;
    browser.client.clone().close().await.unwrap();
}

#[actix_web::test]
async fn an_owner_reads_grants_grouped_and_follows_them_to_every_grant() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    for _ in 0..4 {
        app.fund(&org, 250).await;
    }
    browser.open(&app, "/console/login").await;
    browser.fill("#credential", &org.owner_token).await;
    browser.submit("button[type=submit]").await;
    browser.open(&app, &format!("/console/o/{}", org.org_id)).await;
    assert_eq!(
        browser.text("#credits").await,
        "$10.00 top-up (4 grants) never expires"
    );
    browser.shoot("overview-grants").await;
    browser.submit("#all-credits").await;
    assert_eq!(browser.text("h1").await, "Credits");
    let rows = browser
        .client
        .find_all(Locator::Css("#grants tr.grant"))
        .await
        .unwrap()
        .len();
    let api = json_of(
        app.get(&format!("/api/billing/grants?orgId={}", org.org_id), &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(rows, api["grants"].as_array().unwrap().len());
    assert_eq!(browser.text("#grants-total").await, "4 grant(s)");
    browser.shoot("credits").await;
}

#[actix_web::test]
async fn a_member_reads_a_deliverys_body_and_attempts_retries_it_filters_the_log_and_edits_the_endpoint() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = crate::webhooks::local_app().await;
    let org = app.create_org("Acme").await;
    let (receiver, url) = crate::fakes::FakeJson::start(|_| {
        crate::fakes::Reply::Json(500, json!({"error": "<script>alert(1)</script>"}))
    });
    let created = crate::webhooks::create(
        &app,
        &org,
        json!({"url": format!("{url}/hooks"), "events": ["webhook.test"]}),
    )
    .await;
    let id = created["endpointId"].as_str().unwrap().to_owned();
    browser.open(&app, "/console/login").await;
    browser.fill("#credential", &org.member_token).await;
    browser.submit("button[type=submit]").await;
    let log = format!("/console/o/{}/webhooks/{id}", org.org_id);
    browser.open(&app, &log).await;
    browser.submit(".send-test").await;
    for _ in 0..60 {
        if !receiver.calls().is_empty() {
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(receiver.calls().len(), 1);
    // The delivery's page: the event as sent, its attempt with the (hostile) answer as text.
    let mut attempts = 0;
    for _ in 0..40 {
        browser.open(&app, &log).await;
        browser.submit("#deliveries .delivery-link").await;
        attempts = browser
            .client
            .find_all(Locator::Css("#attempts tr.attempt"))
            .await
            .unwrap()
            .len();
        if attempts == 1 {
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(attempts, 1);
    let body: Value = serde_json::from_str(&browser.text("#event-body").await).unwrap();
    let sent: Value = serde_json::from_slice(&receiver.calls()[0].raw).unwrap();
    assert_eq!(body, sent, "the page shows the body as it was sent");
    assert!(browser.text("#attempts").await.contains("500"));
    assert!(browser.text("#attempts code.answer").await.contains("<script>"));
    browser.assert_no_alert().await;
    browser.shoot("delivery").await;
    browser.submit("#retry-delivery").await;
    assert!(browser.text(".flash").await.contains("sent again now"));
    for _ in 0..60 {
        if receiver.calls().len() == 2 {
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(receiver.calls().len(), 2);
    // The log filtered by status and event: the address holds the filter.
    browser.open(&app, &log).await;
    browser
        .client
        .execute(
            "document.getElementById('filter-status').value = 'succeeded';",
            vec![],
        )
        .await
        .unwrap();
    browser.submit("#filter-deliveries").await;
    assert!(browser
        .client
        .current_url()
        .await
        .unwrap()
        .query()
        .unwrap_or_default()
        .contains("status=succeeded"));
    assert!(browser
        .text("#deliveries")
        .await
        .contains("No deliveries match this filter."));
    // Edit the endpoint on its page: the API then reads the change.
    browser.click("#edit-endpoint summary").await;
    browser.fill("#edit-description", "billing alerts").await;
    browser.click("#edit-event-job\\.failed").await;
    browser
        .client
        .execute("document.getElementById('edit-enabled').value = 'no';", vec![])
        .await
        .unwrap();
    browser.submit("#save-endpoint").await;
    assert!(browser.text(".flash").await.contains("Endpoint saved."));
    assert_eq!(browser.text("#endpoint-status").await, "disabled");
    assert_eq!(browser.text("#endpoint-description").await, "billing alerts");
    let read = json_of(
        app.get(&format!("/api/webhooks/endpoints/{id}"), &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(read["description"], "billing alerts");
    assert_eq!(read["enabled"], false);
    assert_eq!(read["events"], json!(["job.failed", "webhook.test"]));
    browser.shoot("webhook-edit").await;
}

#[actix_web::test]
async fn a_member_tags_every_trace_a_filter_keeps_and_steps_through_them() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let (app, _provider, org, project, traces) = traced_app().await;
    let plain: Vec<String> = traces
        .iter()
        .filter(|t| t["model"] == "gpt-plain")
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect();
    browser.open(&app, "/console/login").await;
    browser.fill("#credential", &org.member_token).await;
    browser.submit("button[type=submit]").await;
    browser
        .open(
            &app,
            &format!(
                "/console/o/{}/projects/{project}/traces?model=gpt-plain",
                org.org_id
            ),
        )
        .await;
    assert_eq!(browser.text("#traces-total").await, "2 trace(s) match.");
    browser.click("#scope-matching").await;
    browser.fill("#bulk-tag", "plain").await;
    browser.submit("#tag-selected").await;
    assert!(browser.text(".flash").await.contains("Tagged 2 traces."));
    for t in &traces {
        let id = t["id"].as_str().unwrap();
        let api = json_of(
            app.get(&format!("/api/traces/{id}"), &org.api_key).await,
            StatusCode::OK,
        )
        .await;
        assert_eq!(
            api["tags"] == json!(["plain"]),
            plain.contains(&id.to_owned()),
            "{id}"
        );
    }
    // Step from the first of the filtered list to the next one, and back to the list.
    browser
        .open(
            &app,
            &format!(
                "/console/o/{}/projects/{project}/traces?model=gpt-plain",
                org.org_id
            ),
        )
        .await;
    browser.submit("#traces .trace-link").await;
    assert!(browser
        .client
        .current_url()
        .await
        .unwrap()
        .path()
        .ends_with(&plain[0]));
    browser.submit("#older-trace").await;
    assert!(browser
        .client
        .current_url()
        .await
        .unwrap()
        .path()
        .ends_with(&plain[1]));
    browser.shoot("trace-stepping").await;
    browser.submit("#back-to-list").await;
    let url = browser.client.current_url().await.unwrap();
    assert!(url.query().unwrap_or_default().contains("model=gpt-plain"));
    assert_eq!(browser.text("#traces-total").await, "2 trace(s) match.");
    browser.shoot("traces-filtered").await;
}

#[actix_web::test]
async fn an_operator_changes_an_organizations_weight_in_place_and_reads_the_hourly_chart_at_phone_width() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_app().await;
    let org = app.create_org("Acme Robotics").await;
    app.fund(&org, 1000).await;
    let project = app.create_project(&org, "Vision").await;
    tracer(&app, &org, &project).await;
    tracer(&app, &org, &project).await;
    claim(&app, "worker-1", "tracer", 1).await;
    browser.open(&app, "/console/login").await;
    browser.fill("#credential", INTERNAL_KEY).await;
    browser.submit("button[type=submit]").await;
    browser.open(&app, "/console/operator/queue").await;
    let row = format!("#share-{}", org.org_id);
    assert_eq!(browser.text(&format!("{row} .org-name")).await, "Acme Robotics");
    browser.click(&format!("{row} details.edit-share summary")).await;
    browser.fill(&format!("#weight-{}", org.org_id), "4").await;
    browser.fill(&format!("#cap-{}", org.org_id), "7").await;
    browser.submit(&format!("{row} .save-share")).await;
    assert_eq!(browser.text("h1").await, "Change the organization's share?");
    browser.submit("#confirm").await;
    assert!(browser
        .text(".flash")
        .await
        .contains("weight 4, a cap of 7 running jobs"));
    assert_eq!(browser.text(&format!("{row} .weight")).await, "4");
    assert_eq!(browser.text(&format!("{row} .cap")).await, "7");
    let read = json_of(
        app.get(&format!("/api/internal/orgs/{}/queue", org.org_id), INTERNAL_KEY)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        (read["weight"].as_i64(), read["maxRunning"].as_i64()),
        (Some(4), Some(7))
    );
    // The chart's hour labels do not overlap at 390 px.
    browser.client.set_window_size(390, 900).await.unwrap();
    let overlap = browser
        .client
        .execute(
            "var labels = Array.from(document.querySelectorAll('#throughput svg text')).map(function (t) { return t.getBoundingClientRect(); }).filter(function (r) { return r.width > 0; }); for (var i = 1; i < labels.length; i++) { if (labels[i].left < labels[i - 1].right && labels[i].top < labels[i - 1].bottom && labels[i - 1].top < labels[i].bottom) { return true; } } return false;",
            vec![],
        )
        .await
        .unwrap();
    browser.client.set_window_size(1280, 900).await.unwrap();
    assert_eq!(overlap, json!(false), "the chart's labels overlap at 390 px");
    browser.shoot("operator-share").await;
}

#[actix_web::test]
async fn a_member_saves_a_filter_as_a_dataset_reads_its_version_and_downloads_a_split() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let (app, _provider, org, project, _traces) = traced_app().await;
    browser.open(&app, "/console/login").await;
    browser.fill("#credential", &org.member_token).await;
    browser.submit("button[type=submit]").await;
    browser
        .open(
            &app,
            &format!(
                "/console/o/{}/projects/{project}/traces?model=gpt-plain",
                org.org_id
            ),
        )
        .await;
    assert_eq!(browser.text("#traces-total").await, "2 trace(s) match.");
    browser.click("#scope-matching").await;
    browser.fill("#dataset-name", "plain-set").await;
    browser.fill("#dataset-validation", "0").await;
    browser.submit("#save-dataset-button").await;
    assert!(
        browser
            .text(".flash")
            .await
            .contains("Saved dataset plain-set: version 1 has 2 training and 0 validation lines."),
        "{}",
        browser.text(".flash").await
    );
    browser.shoot("datasets").await;
    let listed = json_of(
        app.get(&format!("/api/datasets?projectId={project}"), &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await;
    let id = listed["datasets"][0]["datasetId"].as_str().unwrap().to_owned();
    assert_eq!(
        listed["datasets"][0]["versions"][0]["filter"],
        json!({"model": "gpt-plain"})
    );
    browser
        .submit(&format!("#version-{id}-1 a[href$='/versions/1']"))
        .await;
    assert_eq!(
        browser
            .client
            .find_all(Locator::Css("#version-items .trace-link"))
            .await
            .unwrap()
            .len(),
        2
    );
    browser.shoot("dataset-version").await;
    browser.click("#version-facts a[href$='split=train']").await;
    let downloaded = browser.downloaded().await;
    let api = app
        .get(
            &format!("/api/datasets/{id}/versions/1/export?split=train"),
            &org.api_key,
        )
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(downloaded, api);
    assert_eq!(downloaded.lines().count(), 2);
    browser.assert_no_alert().await;
}

#[actix_web::test]
async fn a_member_reads_a_schedules_next_ticks_runs_it_now_and_disables_it() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_app().await;
    let org = app.create_org("Cron").await;
    let project = app.create_project(&org, "evals").await;
    let created = json_of(
        app.post(
            "/api/training/schedules",
            &org.api_key,
            &json!({"name": "nightly eval", "cron": "30 2 * * *", "timezone": "Europe/Berlin",
                "job": {"action": "tracer", "projectId": project}}),
        )
        .await,
        StatusCode::CREATED,
    )
    .await;
    let id = created["scheduleId"].as_str().unwrap().to_owned();
    browser.open(&app, "/console/login").await;
    browser.fill("#credential", &org.member_token).await;
    browser.submit("button[type=submit]").await;
    browser.click("nav a[href$='/schedules']").await;
    let section = format!("#schedule-{id}");
    assert!(browser
        .text(&section)
        .await
        .contains("30 2 * * * in Europe/Berlin"));
    assert_eq!(
        browser
            .text(&format!("{section} .next-runs"))
            .await
            .lines()
            .count(),
        5
    );
    browser.shoot("schedules").await;
    browser.submit(&format!("#run-{id}")).await;
    assert!(
        browser.text(".flash").await.contains("queued."),
        "{}",
        browser.text(".flash").await
    );
    assert!(browser
        .text(&format!("{section} .recent-jobs"))
        .await
        .contains("run now queued"));
    browser.submit(&format!("#disable-{id}")).await;
    assert!(browser.text(".flash").await.contains("disabled"));
    assert!(browser
        .text(&format!("{section} .next-runs"))
        .await
        .contains("none (disabled)"));
    let api = json_of(
        app.get(&format!("/api/training/schedules/{id}"), &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(api["enabled"], false);
    assert_eq!(api["recentJobs"][0]["scheduleTick"], Value::Null);
    browser.assert_no_alert().await;
}

#[actix_web::test]
async fn a_member_follows_a_pipeline_drawn_on_a_jobs_page() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = spawn_app().await;
    let (org, project) = crate::queue::funded(&app, "Flow").await;
    let answer = json_of(
        app.post(
            "/api/training/jobs/batch",
            &org.api_key,
            &json!({"jobs": [
                {"ref": "a", "action": "tracer", "projectId": project},
                {"ref": "b", "action": "draft", "projectId": project, "dependsOn": ["ref:a"]},
                {"ref": "c", "action": "optimize", "projectId": project, "dependsOn": ["ref:a"]},
                {"action": "draft", "projectId": project, "dependsOn": ["ref:b", "ref:c"]},
            ]}),
        )
        .await,
        StatusCode::ACCEPTED,
    )
    .await;
    let ids: Vec<String> = answer["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["jobId"].as_str().unwrap().to_owned())
        .collect();
    browser.open(&app, "/console/login").await;
    browser.fill("#credential", &org.member_token).await;
    browser.submit("button[type=submit]").await;
    browser
        .open(&app, &format!("/console/o/{}/jobs/{}", org.org_id, ids[3]))
        .await;
    // Every job drawn as a box of its own size, each arrow from a box's right edge.
    let drawn = browser
        .client
        .execute(
            "var s = document.getElementById('pipeline'); if (!s) { return null; } \
             var nodes = Array.from(s.querySelectorAll('a.node')).map(function (a) { \
               var r = a.getBoundingClientRect(); return [a.getAttribute('data-job'), a.getAttribute('data-status'), r.width > 100 && r.height > 30]; }); \
             return {nodes: nodes, edges: s.querySelectorAll('path.edge').length};",
            vec![],
        )
        .await
        .unwrap();
    let mut nodes: Vec<(String, String, bool)> = drawn["nodes"]
        .as_array()
        .unwrap_or_else(|| panic!("no pipeline drawn: {drawn}"))
        .iter()
        .map(|n| {
            (
                n[0].as_str().unwrap().to_owned(),
                n[1].as_str().unwrap().to_owned(),
                n[2].as_bool().unwrap(),
            )
        })
        .collect();
    nodes.sort();
    let mut expected: Vec<(String, String, bool)> = ids
        .iter()
        .zip(["queued", "waiting", "waiting", "waiting"])
        .map(|(id, status)| (id.clone(), status.to_owned(), true))
        .collect();
    expected.sort();
    assert_eq!(nodes, expected);
    assert_eq!(drawn["edges"], 4);
    browser.shoot("pipeline").await;
    // The first job's box leads to its page.
    browser
        .submit(&format!("#pipeline a[data-job='{}']", ids[0]))
        .await;
    assert!(browser.text("h1").await.contains(ids[0].as_str()));
    assert_eq!(browser.text("#job-status").await, "queued");
}
