//! The console's jobs list for daily work: counts per status, sorting, pages both ways with
//! a total, project names, and stopping or retrying many jobs at once (issue 59, item 1).

use reqwest::StatusCode;
use serde_json::json;

use crate::console::{org_path, Console};
use crate::helpers::*;
use crate::queue::{claim, enqueue, job, tracer};

/// The `href` of the link with `id`, as a path to fetch.
fn link(page: &str, id: &str) -> Option<String> {
    let pattern = regex::Regex::new(&format!(r#"href="([^"]+)"[^>]*? id="{id}""#)).unwrap();
    pattern.captures(page).map(|c| c[1].replace("&amp;", "&"))
}

/// The job ids a page's table lists, in order.
fn listed(page: &str) -> Vec<String> {
    let row = regex::Regex::new(r#"<tr id="job-([0-9a-f-]{36})""#).unwrap();
    row.captures_iter(page).map(|c| c[1].to_owned()).collect()
}

/// The count a status chip shows.
fn chip(page: &str, status: &str) -> String {
    let pattern = regex::Regex::new(&format!(
        r#"id="chip-{status}"[^>]*>.*?<span class="count">([^<]+)</span>"#
    ))
    .unwrap();
    pattern
        .captures(page)
        .unwrap_or_else(|| panic!("no {status} chip"))[1]
        .to_owned()
}

#[actix_web::test]
async fn the_jobs_list_counts_sorts_pages_both_ways_and_names_projects() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    app.fund(&org, 10_000).await;
    let vision = app.create_project(&org, "Vision <b>").await;
    let speech = app.create_project(&org, "Speech").await;
    let mut made = Vec::new();
    for i in 0..52 {
        made.push(tracer(&app, &org, &vision).await);
        if i == 10 {
            // One urgent job in the middle, in the other project.
            let urgent = enqueue(&app, &org, &speech, json!({"action": "tracer", "priority": 0})).await;
            made.push(urgent["jobId"].as_str().unwrap().to_owned());
        }
    }
    // The claim takes the urgent one first; then it fails.
    let claimed = claim(&app, "worker-1", "tracer", 1).await;
    let urgent = claimed[0]["job_id"].as_str().unwrap().to_owned();
    assert_eq!(urgent, made[11]);
    let failed = app
        .post(
            "/api/training/internal/jobs/failed",
            INTERNAL_KEY,
            &json!({"job_id": urgent, "worker_id": "worker-1", "error": "boom"}),
        )
        .await;
    assert!(failed.status().is_success());
    let console = Console::sign_in(&app, &org.api_key).await;

    // Newest first, 50 a page, with the total, counts per status and the project by name.
    let first = console.page(&org_path(&org, "/jobs")).await;
    assert!(
        first.contains("53 job(s)") && first.contains("page 1 of 2"),
        "{first}"
    );
    assert_eq!(chip(&first, "queued"), "52");
    assert_eq!(chip(&first, "failed"), "1");
    assert_eq!(chip(&first, "running"), "0");
    assert!(first.contains("Vision &#60;b&#62;") && !first.contains("Vision <b>"));
    let shown = listed(&first);
    assert_eq!(shown.len(), 50);
    assert_eq!(shown[0], *made.last().unwrap());
    assert!(link(&first, "previous").is_none() && link(&first, "first").is_none());
    // The other page, and back: every job once.
    let second = console.page(&link(&first, "next").unwrap()).await;
    assert!(second.contains("page 2 of 2"));
    let rest = listed(&second);
    assert_eq!(rest.len(), 3);
    let mut all: Vec<String> = shown.iter().chain(&rest).cloned().collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 53);
    assert!(link(&second, "next").is_none() && link(&second, "last").is_none());
    let back = console.page(&link(&second, "previous").unwrap()).await;
    assert_eq!(listed(&back), shown);
    assert_eq!(
        listed(&console.page(&link(&second, "first").unwrap()).await),
        shown
    );

    // By priority: the urgent one first, then the oldest queued; its attempts of the most.
    let by_priority = console.page(&org_path(&org, "/jobs?sort=priority")).await;
    let order = listed(&by_priority);
    assert_eq!(order[0], urgent);
    assert_eq!(order[1], made[0]);
    assert!(
        by_priority.contains(r#"<td class="num attempts">1/3</td>"#),
        "{by_priority}"
    );
    // The sort is kept by the next page's link and by the filter's chips.
    assert!(link(&by_priority, "next").unwrap().contains("sort=priority"));
    let failed_only = link(&by_priority, "chip-failed").unwrap();
    assert!(failed_only.contains("status=failed") && failed_only.contains("sort=priority"));
    let failed_page = console.page(&failed_only).await;
    assert_eq!(listed(&failed_page), vec![urgent.clone()]);
    assert!(failed_page.contains("1 job(s)"));
    // A chip's counts stay those of every status (the status filter set aside).
    assert_eq!(chip(&failed_page, "queued"), "52");
    // Filtered by project, by the name the page shows.
    let speech_page = console
        .page(&org_path(&org, &format!("/jobs?project={speech}")))
        .await;
    assert_eq!(listed(&speech_page), vec![urgent.clone()]);
    assert!(speech_page.contains(&format!(r#"<option value="{speech}" selected"#)));
    // Updated: the failed job changed last.
    assert_eq!(
        listed(&console.page(&org_path(&org, "/jobs?sort=updated")).await)[0],
        urgent
    );
    // Nothing matches: the empty state says it is the filter.
    let none = console.page(&org_path(&org, "/jobs?status=running")).await;
    assert!(none.contains("No jobs match this filter.") && none.contains("0 job(s)"));
    // The job's page names its project and counts its attempts against the most.
    let urgent_page = console.page(&org_path(&org, &format!("/jobs/{urgent}"))).await;
    assert!(
        urgent_page.contains(&format!(
            r#"href="/console/o/{}/projects/{speech}/traces" title="{speech}" id="job-project">Speech</a>"#,
            org.org_id
        )),
        "{urgent_page}"
    );
    assert!(urgent_page.contains(r#"id="job-attempts">1 of 3<"#));
    // A page past the end is empty, not an error.
    assert!(listed(&console.page(&org_path(&org, "/jobs?page=9")).await).is_empty());
    for (path, says) in [
        (
            "/jobs?sort=bogus",
            "which is not one of: created, updated, priority",
        ),
        ("/jobs?page=0", "cannot read"),
        ("/jobs?page=x", "cannot read"),
    ] {
        let response = console.get(&org_path(&org, path)).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{path}");
        assert!(response.text().await.unwrap().contains(says), "{path}");
    }
}

#[actix_web::test]
async fn members_stop_picked_jobs_and_retry_every_job_a_filter_keeps_after_one_confirmation() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let other = app.create_org("Other").await;
    app.fund(&org, 10_000).await;
    let project = app.create_project(&org, "Vision").await;
    let theirs_project = app.create_project(&other, "Theirs").await;
    let mut queued = Vec::new();
    for _ in 0..5 {
        queued.push(tracer(&app, &org, &project).await);
    }
    let running = claim(&app, "worker-1", "tracer", 1).await[0]["job_id"]
        .as_str()
        .unwrap()
        .to_owned();
    queued.retain(|id| *id != running);
    let theirs = tracer(&app, &other, &theirs_project).await;
    let console = Console::sign_in(&app, &org.member_token).await;
    let page = console.page(&org_path(&org, "/jobs")).await;
    assert!(page.contains(r#"id="bulk-stop""#) && page.contains(r#"id="select-page""#));

    // Two queued, the running one, and another organization's job picked: the page asks
    // first and says how many it changes.
    let picked = [
        ("do", "stop"),
        ("job", queued[0].as_str()),
        ("job", queued[1].as_str()),
        ("job", running.as_str()),
        ("job", theirs.as_str()),
        ("reason", "wrong data"),
    ];
    let (asked, done) = console.confirm(&org_path(&org, "/jobs/bulk"), &picked).await;
    assert!(asked.contains("Stop these jobs?"), "{asked}");
    assert!(asked.contains("Stop 3 job(s): 3 of the 3 selected"), "{asked}");
    assert!(!asked.contains(&theirs));
    assert!(done.contains("3 job(s) stopped (or told to stop)."), "{done}");
    for id in &queued[..2] {
        let stopped = job(&app, &org, id).await;
        assert_eq!(stopped["status"], "user_stopped");
    }
    assert_eq!(job(&app, &org, &running).await["status"], "stopping");
    assert_eq!(job(&app, &other, &theirs).await["status"], "queued");
    assert!(done.contains(&format!(r#"id="job-{}""#, queued[0])));

    // Everything the filter keeps (user_stopped), retried: the others are not touched.
    let everything = [("do", "retry"), ("scope", "matching"), ("status", "user_stopped")];
    let (asked, done) = console.confirm(&org_path(&org, "/jobs/bulk"), &everything).await;
    assert!(asked.contains("Retry 2 job(s): 2 of the 2 selected"), "{asked}");
    assert!(done.contains("2 job(s) queued again."), "{done}");
    for id in &queued[..2] {
        assert_eq!(job(&app, &org, id).await["status"], "queued");
    }
    assert_eq!(job(&app, &org, &running).await["status"], "stopping");
    // Back on the list the filter was on.
    assert!(done.contains("0 job(s)"), "{done}");

    // Nothing picked: said, nothing done; an unknown action is a 400 page.
    let nothing = console
        .submit(&org_path(&org, "/jobs/bulk"), &[("do", "stop")])
        .await;
    assert!(nothing.contains("Select the jobs first"));
    let bad = console
        .post(
            &org_path(&org, "/jobs/bulk"),
            &[("do", "explode"), ("job", &queued[2])],
        )
        .await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    assert_eq!(job(&app, &org, &queued[2]).await["status"], "queued");

    // The operator reads the list without acting on it: no form, and a post is refused.
    let operator = Console::sign_in(&app, INTERNAL_KEY).await;
    assert!(!operator
        .page(&org_path(&org, "/jobs"))
        .await
        .contains(r#"id="bulk-stop""#));
    let refused = operator
        .post(
            &org_path(&org, "/jobs/bulk"),
            &[("do", "stop"), ("job", &queued[2]), ("confirmed", "yes")],
        )
        .await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert_eq!(job(&app, &org, &queued[2]).await["status"], "queued");
}
