//! Every console page: its template and the values it shows, already formatted.

use askama::Template;

use super::session::{OrgView, Viewer};
use super::Flash;

/// What every page's frame shows.
pub struct Layout {
    pub title: String,
    pub csrf: String,
    pub signed_in: bool,
    pub operator: bool,
    /// A user session with several organizations may switch.
    pub pick_org: bool,
    pub org: Option<OrgNav>,
    pub active: &'static str,
    pub flash: Option<Flash>,
}

pub struct OrgNav {
    pub id: String,
    pub name: String,
    pub read_only: bool,
    pub is_owner: bool,
}

impl Layout {
    /// A frame without a session (sign-in and error pages).
    pub fn bare(title: &str) -> Self {
        Self {
            title: title.to_owned(),
            csrf: String::new(),
            signed_in: false,
            operator: false,
            pick_org: false,
            org: None,
            active: "",
            flash: None,
        }
    }

    pub fn new(
        title: impl Into<String>,
        viewer: &Viewer,
        active: &'static str,
        flash: Option<Flash>,
    ) -> Self {
        Self {
            title: title.into(),
            csrf: viewer.csrf.clone(),
            signed_in: true,
            operator: viewer.is_operator(),
            pick_org: matches!(viewer.standing, super::session::Standing::User { .. }),
            org: None,
            active,
            flash,
        }
    }

    pub fn with_org(mut self, org: &OrgView, name: String) -> Self {
        self.org = Some(OrgNav {
            id: org.org_id.to_string(),
            name,
            read_only: !org.can_act(),
            is_owner: org.is_owner(),
        });
        self
    }
}

#[derive(Template)]
#[template(path = "console/error.html")]
pub struct ErrorPage {
    pub l: Layout,
    pub status: u16,
    pub message: String,
}

#[derive(Template)]
#[template(path = "console/login.html")]
pub struct LoginPage {
    pub l: Layout,
    pub error: Option<String>,
    /// Where to go once signed in (empty: the session's home).
    pub next: String,
}

pub struct OrgRow {
    pub id: String,
    pub name: String,
    pub slug: String,
    pub role: String,
    pub balance: String,
    pub queued: i64,
    pub running: i64,
    pub last_activity: String,
}

#[derive(Template)]
#[template(path = "console/orgs.html")]
pub struct OrgsPage {
    pub l: Layout,
    pub orgs: Vec<OrgRow>,
    /// The operator's search as typed, and how many organizations it shows.
    pub q: String,
    pub total: usize,
}

pub struct LedgerRow {
    pub at: String,
    pub kind: String,
    pub amount: String,
    pub amount_exact: String,
    pub credit: bool,
    pub balance_after: String,
    pub reason: String,
    pub key: String,
}

pub struct UsageRow {
    pub model: String,
    pub requests: i64,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub charged: String,
}

#[derive(Template)]
#[template(path = "console/overview.html")]
pub struct OverviewPage {
    pub l: Layout,
    pub balance: String,
    pub balance_exact: String,
    pub card: Option<String>,
    pub auto_enabled: bool,
    pub auto_paused: bool,
    pub auto_threshold: String,
    pub auto_amount: String,
    /// The monthly cap in cents (empty: none), and what auto top-up charged this month.
    pub auto_limit: String,
    /// The monthly cap as money (empty: none).
    pub auto_limit_money: String,
    pub auto_charged: String,
    /// The active credit grants grouped by kind and day of expiry, in the order debits draw
    /// from them (the first few groups), and how many grants are active.
    pub credits: Vec<CreditRow>,
    pub grant_count: usize,
    pub starter_granted: bool,
    pub starter_amount: String,
    pub chart: String,
    pub chart_summary: String,
    pub usage: Vec<UsageRow>,
    pub recent: Vec<LedgerRow>,
    pub topup_key: String,
    pub test_cards: Vec<(&'static str, &'static str)>,
}

/// One active credit grant, as people read it: "$10.00 promotional credit expires in 5 days".
pub struct CreditRow {
    pub left: String,
    pub left_exact: String,
    pub kind: String,
    pub expires: String,
}

/// One grant on the credits page.
pub struct GrantRow {
    pub created: String,
    pub kind: String,
    pub granted: String,
    pub left: String,
    pub left_exact: String,
    /// `active`, `spent` or `expired`.
    pub state: &'static str,
    pub expires: String,
    pub reason: String,
}

#[derive(Template)]
#[template(path = "console/credits.html")]
pub struct CreditsPage {
    pub l: Layout,
    pub rows: Vec<GrantRow>,
    pub total: String,
    /// The state filter (`active`, `ended`; empty: every grant).
    pub state: String,
}

#[derive(Template)]
#[template(path = "console/ledger.html")]
pub struct LedgerPage {
    pub l: Layout,
    pub kinds: Vec<&'static str>,
    pub kind: String,
    pub entries: Vec<LedgerRow>,
    /// Entries of the kind shown (every kind when none).
    pub total: String,
    pub next: Option<String>,
    /// The month's statement: (what, amount, exact amount).
    pub statement: Vec<(String, String, String)>,
    pub month: String,
}

pub struct KeyRow {
    pub id: String,
    pub name: String,
    pub prefix: String,
    pub created: String,
    pub revoked: Option<String>,
    /// `inference, api`.
    pub scopes: String,
    pub inference: bool,
    pub api: bool,
    /// The models it may call, comma-separated; empty: any.
    pub models: String,
    /// Limits as the edit form shows them (empty: none).
    pub rpm: String,
    pub tokens_per_day: String,
    pub streams: String,
    /// Today's requests, and against the limit (`/ 60 a minute`).
    pub requests_today: String,
    pub requests_limit: String,
    /// Today's tokens, and against the limit (`of 100,000`).
    pub tokens_today: String,
    pub tokens_limit: String,
    pub streams_limit: String,
    pub expires: String,
    /// The expiry as the edit form's `datetime-local` takes it (UTC).
    pub expires_input: String,
    pub expired: bool,
    pub last_used: String,
}

pub struct MemberRow {
    pub user_id: String,
    pub email: String,
    pub role: String,
    pub since: String,
}

#[derive(Template)]
#[template(path = "console/keys.html")]
pub struct KeysPage {
    pub l: Layout,
    pub keys: Vec<KeyRow>,
    pub members: Vec<MemberRow>,
    /// A key just created, shown this once.
    pub new_key: Option<String>,
    /// The page was asked to show a new key that was already shown (or has expired).
    pub key_gone: bool,
    pub is_owner: bool,
    /// What the new-key form holds: empty, or what was typed into it when it was refused.
    pub draft: KeyDraft,
}

/// The new-key form's fields as typed (kept when the form is refused, so nothing is typed
/// twice).
pub struct KeyDraft {
    pub name: String,
    pub rpm: String,
    pub tokens_per_day: String,
    pub streams: String,
    pub inference: bool,
    pub api: bool,
    pub models: String,
    pub expires_on: String,
}

impl Default for KeyDraft {
    fn default() -> Self {
        Self {
            name: String::new(),
            rpm: String::new(),
            tokens_per_day: String::new(),
            streams: String::new(),
            inference: true,
            api: true,
            models: String::new(),
            expires_on: String::new(),
        }
    }
}

pub struct JobRow {
    pub id: String,
    pub action: String,
    pub status: String,
    pub project: String,
    /// The project's name (its id when it has none to show).
    pub project_name: String,
    pub task: String,
    pub worker: String,
    pub attempts: i32,
    pub max_attempts: u32,
    pub priority: i32,
    /// When a scheduled job is due (empty for the others).
    pub scheduled: String,
    pub created: String,
    pub updated: String,
}

/// A status to filter by, with how many jobs the rest of the filter keeps in it.
pub struct StatusChip {
    pub status: &'static str,
    pub count: String,
    pub chosen: bool,
    /// The page with this status added to (or removed from) the filter.
    pub link: String,
}

/// Where a list is and the links to the pages around it.
pub struct Pager {
    pub page: u64,
    pub pages: u64,
    pub total: String,
    pub first: Option<String>,
    pub previous: Option<String>,
    pub next: Option<String>,
    pub last: Option<String>,
}

impl Pager {
    /// The page number an address asks for (1 for none; anything but 1.. is a 400 page).
    pub fn number(raw: Option<&str>, per_page: u64) -> Result<u64, super::ConsoleError> {
        match raw.map(str::trim).filter(|p| !p.is_empty()) {
            None => Ok(1),
            Some(p) => p
                .parse::<u64>()
                .ok()
                .filter(|n| *n >= 1 && *n <= u64::MAX / per_page)
                .ok_or_else(|| super::unreadable("\"page\"")),
        }
    }

    /// Page `page` of `total` rows, `per_page` a page; `link` writes a page's address.
    pub fn of(page: u64, total: u64, per_page: u64, link: impl Fn(u64) -> String) -> Self {
        let pages = total.div_ceil(per_page).max(1);
        Pager {
            page,
            pages,
            total: super::format::count(i64::try_from(total).unwrap_or(i64::MAX)),
            first: (page > 1).then(|| link(1)),
            previous: (page > 1).then(|| link((page - 1).min(pages))),
            next: (page < pages).then(|| link(page + 1)),
            last: (page < pages).then(|| link(pages)),
        }
    }
}

#[derive(Template)]
#[template(path = "console/jobs.html")]
pub struct JobsPage {
    pub l: Layout,
    pub statuses: Vec<&'static str>,
    pub actions: Vec<&'static str>,
    /// The statuses chosen (none: any).
    pub status: Vec<&'static str>,
    pub action: String,
    pub project: String,
    /// The organization's projects `(id, name)`, by name.
    pub projects: Vec<(String, String)>,
    /// The chosen project is one of `projects` (else it is shown as its id).
    pub project_listed: bool,
    pub task: String,
    pub sort: &'static str,
    /// Each order `(name, link, chosen)`.
    pub sorts: Vec<(&'static str, String, bool)>,
    pub chips: Vec<StatusChip>,
    /// The filter as the bulk form carries it.
    pub carried: Vec<(String, String)>,
    pub table: JobsTable,
    pub refresh_url: String,
    pub refresh_secs: u64,
}

#[derive(Template)]
#[template(path = "console/jobs_table.html")]
pub struct JobsTable {
    pub org_id: String,
    pub jobs: Vec<JobRow>,
    /// Rows carry a box to pick them for a stop or retry.
    pub selectable: bool,
    pub pager: Pager,
    /// A filter is set (an empty list says so).
    pub filtered: bool,
}

pub struct Event {
    pub at: String,
    pub what: String,
}

/// One ended attempt of a job, as its page lists it.
pub struct AttemptRow {
    pub attempt: i32,
    pub worker: String,
    pub claimed: String,
    pub ended: String,
    pub outcome: String,
    pub error: String,
}

#[derive(Template)]
#[template(path = "console/job.html")]
pub struct JobPage {
    pub l: Layout,
    pub id: String,
    /// The rendered [`JobDetail`] (escaped by its own template).
    pub detail: String,
    pub refresh_url: String,
    pub refresh_secs: u64,
    pub live: bool,
}

#[derive(Template)]
#[template(path = "console/job_detail.html")]
pub struct JobDetail {
    pub org_id: String,
    pub csrf: String,
    pub job: JobRow,
    pub priority: i32,
    pub scheduled_at: Option<String>,
    pub history: Vec<AttemptRow>,
    pub can_stop: bool,
    pub can_retry: bool,
    pub stop_requested: bool,
    /// The user's reason for stopping it.
    pub stop_reason: Option<String>,
    pub timeline: Vec<Event>,
    pub live_status: Option<String>,
    pub result: Option<String>,
    pub error: Option<String>,
    pub payload: String,
    /// The pipeline it is in, drawn (none for a job without dependencies or dependents).
    pub pipeline: Option<PipelineDrawing>,
}

/// A pipeline laid out in columns: each job one column right of the last job it waits for.
pub struct PipelineDrawing {
    pub width: i64,
    pub height: i64,
    pub nodes: Vec<PipelineNode>,
    pub edges: Vec<PipelineEdge>,
    /// Jobs past those drawn.
    pub more: bool,
    /// Each job's box.
    pub node_w: i64,
    pub node_h: i64,
}

pub struct PipelineNode {
    pub id: String,
    pub short: String,
    pub action: String,
    pub status: String,
    pub x: i64,
    pub y: i64,
    /// The job whose page this is.
    pub current: bool,
    /// Its box's colour, by its state (the status chips' palette).
    pub fill: &'static str,
}

/// An edge from a job to one that waits for it.
pub struct PipelineEdge {
    pub x1: i64,
    pub y1: i64,
    pub x2: i64,
    pub y2: i64,
    /// The job it leads from succeeded.
    pub done: bool,
}

pub struct ProjectRow {
    pub id: String,
    pub name: String,
    pub count: i64,
    pub last: String,
}

#[derive(Template)]
#[template(path = "console/trace_projects.html")]
pub struct TraceProjectsPage {
    pub l: Layout,
    pub projects: Vec<ProjectRow>,
}

pub struct TraceRow {
    pub id: String,
    pub at: String,
    pub provider: String,
    pub model: String,
    pub status: i32,
    pub ok: bool,
    pub latency: i64,
    pub ttfb: String,
    pub tokens: String,
    pub stream: bool,
    /// The last user message and the reply (200 characters each).
    pub preview_input: String,
    pub preview_output: String,
    pub tags: Vec<String>,
    /// `name value` of each score, by name.
    pub scores: Vec<(String, String)>,
}

pub struct ScoreRow {
    pub name: String,
    pub value: String,
    pub comment: String,
}

#[derive(Template)]
#[template(path = "console/traces.html")]
pub struct TracesPage {
    pub l: Layout,
    pub project_id: String,
    pub project_name: String,
    pub models: Vec<String>,
    pub model: String,
    pub status: String,
    /// The search box, tag and date range as typed.
    pub q: String,
    pub tag: String,
    pub since: String,
    pub until: String,
    /// `NAME:VALUE` as typed.
    pub min_score: String,
    /// The filter as the forms carry it (`filter_<name>`), and as a query string.
    pub carried: Vec<(String, String)>,
    pub filter_query: String,
    /// How many traces the filter keeps, and the cap of an action on all of them when it
    /// keeps more.
    pub total: String,
    pub matching_cap: Option<String>,
    /// The first page, when this is a later one.
    pub first_page: Option<String>,
    pub traces: Vec<TraceRow>,
    pub next: Option<String>,
    /// Days the project keeps its traces; empty: forever.
    pub retention_days: String,
    /// Where its recorded calls are pushed (OTLP), if anywhere.
    pub otlp_export: Option<OtlpExportRow>,
}

/// A project's OTLP push as its settings show it (never a header's value).
pub struct OtlpExportRow {
    pub endpoint: String,
    pub header_names: String,
    pub last_exported_at: String,
    pub last_error: String,
    pub last_error_at: String,
    pub pending: String,
}

pub struct Part {
    /// `text`, `image`, `tool_call` or `other`.
    pub kind: &'static str,
    pub text: String,
}

pub struct Message {
    pub role: String,
    pub parts: Vec<Part>,
}

#[derive(Template)]
#[template(path = "console/trace.html")]
pub struct TracePage {
    pub l: Layout,
    pub row: TraceRow,
    pub conversation: Vec<Message>,
    pub reply: Vec<Message>,
    pub request: String,
    pub response: String,
    pub error: Option<String>,
    pub scores: Vec<ScoreRow>,
    /// The traces either side in the list it was opened from, and that list.
    pub newer: Option<String>,
    pub older: Option<String>,
    pub list: String,
}

pub struct EvalRow {
    pub id: String,
    pub project: String,
    pub suite: String,
    pub model: String,
    pub status: String,
    pub total: i32,
    pub passed: i32,
    pub graded: i32,
    pub errored: i32,
    pub mean: String,
    pub at: String,
}

pub struct SuiteChart {
    pub suite: String,
    pub svg: String,
    pub summary: String,
}

#[derive(Template)]
#[template(path = "console/evals.html")]
pub struct EvalsPage {
    pub l: Layout,
    pub runs: Vec<EvalRow>,
    /// Runs of the project shown (every project when none).
    pub total: String,
    pub charts: Vec<SuiteChart>,
    /// The next (older) page.
    pub next: Option<String>,
}

pub struct CaseRow {
    pub position: i32,
    pub case_id: String,
    pub outcome: &'static str,
    pub score: String,
    pub input: String,
    pub expected: String,
    pub actual: String,
    pub reason: String,
    pub error: String,
}

#[derive(Template)]
#[template(path = "console/eval_run.html")]
pub struct EvalRunPage {
    pub l: Layout,
    pub run: EvalRow,
    pub filter: String,
    pub cases: Vec<CaseRow>,
    pub next: Option<String>,
}

pub struct RunRow {
    pub id: String,
    pub name: String,
    pub project: String,
    pub model: String,
    pub status: String,
    pub metrics: String,
    pub tracker: Option<String>,
    pub checkpoints: Vec<(i64, String)>,
    pub updated: String,
}

#[derive(Template)]
#[template(path = "console/runs.html")]
pub struct RunsPage {
    pub l: Layout,
    pub runs: Vec<RunRow>,
    /// Runs of the project shown (every project when none).
    pub total: String,
    /// The next (older) page.
    pub next: Option<String>,
}

pub struct CountRow {
    pub action: String,
    pub paused: bool,
    pub counts: Vec<i64>,
    pub oldest: String,
}

/// An organization's share of the queue, as the operator's page lists it.
pub struct OrgShareRow {
    pub org_id: String,
    pub org_name: String,
    /// The cap as set (empty: the default), for the form.
    pub max_running: String,
    pub weight: i32,
    pub queued: i64,
    pub running: i64,
    /// "none" or the cap, with "(default)" when it is `queue.max_running_per_org`.
    pub cap: String,
    pub at_cap: bool,
}

pub struct HeldRow {
    pub worker: String,
    pub jobs: Vec<HeldJob>,
}

pub struct HeldJob {
    pub id: String,
    pub org_id: String,
    pub org_name: String,
    pub action: String,
    pub status: String,
    pub heartbeat: String,
    pub stale: bool,
}

/// One action's queue wait and run time percentiles, written for the page.
pub struct LatencyRow {
    pub action: String,
    pub waits: u64,
    pub wait: [String; 3],
    pub runs: u64,
    pub run: [String; 3],
}

#[derive(Template)]
#[template(path = "console/queue.html")]
pub struct QueuePage {
    pub l: Layout,
    pub statuses: Vec<&'static str>,
    pub counts: Vec<CountRow>,
    pub shares: Vec<OrgShareRow>,
    pub held: Vec<HeldRow>,
    pub stale: Vec<HeldJob>,
    pub stale_after: String,
    /// Attempts ended per 5 minutes over 24 hours, by outcome (SVG, labels escaped).
    pub throughput_svg: String,
    pub throughput_summary: String,
    /// `(CSS class, outcome)` of the chart's key.
    pub throughput_keys: Vec<(&'static str, &'static str)>,
    pub latencies: Vec<LatencyRow>,
}

/// A failed job as the operator's listing shows it.
pub struct FailedRow {
    pub id: String,
    pub org_id: String,
    pub org_name: String,
    pub action: String,
    pub attempts: i32,
    pub error: String,
    pub failed: String,
}

#[derive(Template)]
#[template(path = "console/failed.html")]
pub struct FailedPage {
    pub l: Layout,
    pub actions: Vec<&'static str>,
    pub action: String,
    pub org: String,
    /// Every organization `(id, name)`, by name, for the filter.
    pub orgs: Vec<(String, String)>,
    pub q: String,
    pub jobs: Vec<FailedRow>,
    pub pager: Pager,
    /// The most a retry of every match takes, when more match.
    pub all_cap: Option<String>,
}

/// The second step of a destructive form: what it will do, and the same form again with
/// `confirmed=yes`.
#[derive(Template)]
#[template(path = "console/confirm.html")]
pub struct ConfirmPage {
    pub l: Layout,
    pub question: String,
    pub details: Vec<String>,
    pub more: usize,
    pub action: String,
    pub fields: Vec<(String, String)>,
    pub button: String,
    pub back: String,
}

#[derive(Template)]
#[template(path = "console/writer.html")]
pub struct WriterPage {
    pub l: Layout,
    pub figures: Vec<(&'static str, String)>,
}

pub struct EndpointRow {
    pub id: String,
    pub url: String,
    pub description: String,
    pub events: String,
    pub enabled: bool,
    /// enabled, disabled, or failing since when.
    pub status: String,
    pub disabled_reason: Option<String>,
    pub created: String,
}

pub struct ConsoleEventRow {
    pub at: String,
    pub message: String,
}

#[derive(Template)]
#[template(path = "console/webhooks.html")]
pub struct WebhooksPage {
    pub l: Layout,
    pub endpoints: Vec<EndpointRow>,
    pub events: Vec<ConsoleEventRow>,
    pub event_types: Vec<&'static str>,
    /// A secret just made, shown this once.
    pub new_secret: Option<String>,
    pub secret_gone: bool,
    pub can_act: bool,
    /// What the new-endpoint form holds: empty, or what was typed when it was refused.
    pub draft: EndpointDraft,
}

/// The new-endpoint form's fields as typed (kept when the form is refused).
#[derive(Default)]
pub struct EndpointDraft {
    pub url: String,
    pub description: String,
    pub events: Vec<String>,
}

impl EndpointDraft {
    /// Whether `event`'s box was ticked.
    pub fn has(&self, event: &str) -> bool {
        self.events.iter().any(|e| e == event)
    }
}

pub struct HookDeliveryRow {
    pub id: String,
    pub event_id: String,
    pub event_type: String,
    pub status: String,
    pub created: String,
    pub attempts: usize,
    pub last_code: String,
    pub last_latency: String,
    /// The start of the last answer (or why there was none): hostile text, escaped.
    pub last_answer: String,
    pub next_attempt: String,
}

#[derive(Template)]
#[template(path = "console/webhook_log.html")]
pub struct WebhookLogPage {
    pub l: Layout,
    pub endpoint: EndpointRow,
    pub deliveries: Vec<HookDeliveryRow>,
    /// Deliveries the filter keeps.
    pub total: String,
    /// The query of the next (older) page (its filters kept).
    pub older: Option<String>,
    pub can_act: bool,
    pub statuses: Vec<&'static str>,
    /// The status and event type filtered by (empty: any).
    pub status: &'static str,
    pub event_types: Vec<&'static str>,
    pub event: &'static str,
    /// The endpoint's events as its edit form ticks them (`*`: every event).
    pub subscribed: Vec<String>,
    pub filtered: bool,
}

impl WebhookLogPage {
    /// Whether the endpoint subscribes to `event` by name (or `*` for every event).
    pub fn subscribes(&self, event: &str) -> bool {
        self.subscribed.iter().any(|e| e == event)
    }
}

/// One attempt on a delivery's page.
pub struct DeliveryAttemptRow {
    pub attempt: i32,
    pub at: String,
    pub code: String,
    pub latency: String,
    /// The answer's start (or why there was none): hostile text, escaped.
    pub answer: String,
}

#[derive(Template)]
#[template(path = "console/delivery.html")]
pub struct DeliveryPage {
    pub l: Layout,
    pub id: String,
    pub endpoint_id: String,
    pub endpoint_url: String,
    pub event_id: String,
    pub event_type: String,
    /// The event's body as sent, pretty-printed and bounded.
    pub body: String,
    pub status: String,
    pub created: String,
    pub next_attempt: String,
    pub attempts: Vec<DeliveryAttemptRow>,
    pub can_act: bool,
}

pub struct FailingEndpointRow {
    pub org_id: String,
    pub url: String,
    pub failing_for: String,
    pub status: String,
    pub pending: u64,
    pub log: String,
}

#[derive(Template)]
#[template(path = "console/operator_webhooks.html")]
pub struct OperatorWebhooksPage {
    pub l: Layout,
    pub rows: Vec<FailingEndpointRow>,
}

#[derive(Template)]
#[template(path = "console/operator_grants.html")]
pub struct GrantPage {
    pub l: Layout,
    /// The form's idempotency key: a resubmitted form makes one grant.
    pub key: String,
}

pub struct VersionJobRow {
    pub id: String,
    pub link: String,
    pub action: String,
    pub status: &'static str,
}

pub struct DatasetVersionRow {
    pub version: i32,
    pub created: String,
    pub train: String,
    pub validation: String,
    pub skipped: String,
    pub sha_train: String,
    pub sha_validation: String,
    /// The version's page (its traces); its downloads add `/export?split=`.
    pub link: String,
    pub jobs: Vec<VersionJobRow>,
}

pub struct DatasetRow {
    pub id: String,
    pub name: String,
    pub description: String,
    pub created: String,
    /// A version ran a filter, which a new version runs again.
    pub refreshable: bool,
    /// Newest first.
    pub versions: Vec<DatasetVersionRow>,
}

#[derive(Template)]
#[template(path = "console/datasets.html")]
pub struct DatasetsPage {
    pub l: Layout,
    pub project_id: String,
    pub project_name: String,
    pub can_act: bool,
    pub datasets: Vec<DatasetRow>,
}

pub struct VersionItemRow {
    /// 1-based, in the version's order.
    pub place: String,
    pub split: &'static str,
    pub trace_id: String,
    /// The trace's page, while retention keeps it.
    pub link: Option<String>,
    pub question: String,
    pub answer: String,
}

#[derive(Template)]
#[template(path = "console/dataset_version.html")]
pub struct DatasetVersionPage {
    pub l: Layout,
    pub dataset_id: String,
    pub name: String,
    pub project_id: String,
    pub version: i32,
    pub created: String,
    pub train: String,
    pub validation: String,
    pub sha_train: String,
    pub sha_validation: String,
    /// The filter it ran, as JSON (empty: ids only).
    pub filter: String,
    pub items: Vec<VersionItemRow>,
    pub first_page: Option<String>,
    pub older: Option<String>,
}

pub struct ScheduleJobRow {
    pub link: String,
    pub id: String,
    pub status: String,
    /// The tick it was enqueued for, or "run now".
    pub tick: String,
    pub error: String,
}

pub struct ScheduleRow {
    pub id: String,
    pub name: String,
    pub cron: String,
    pub timezone: String,
    pub enabled: bool,
    pub catch_up: String,
    /// The job body's action.
    pub action: String,
    pub next_runs: Vec<String>,
    pub jobs: Vec<ScheduleJobRow>,
}

#[derive(Template)]
#[template(path = "console/schedules.html")]
pub struct SchedulesPage {
    pub l: Layout,
    pub can_act: bool,
    pub schedules: Vec<ScheduleRow>,
}
