//! The console's pages, rendered on the server with `maud` (every value is escaped
//! at compile time unless a template says otherwise, and none does). Each page
//! reads through the same admin requests as qctl; every link, asset and form
//! action is built by [`Ctx::url`], so a `path_prefix` reaches all of them.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use maud::{Markup, html};
use qd_proto::{DlqSelection, Request, Response as AdminResponse};

use super::Ctx;
use super::layout::{admin_error, admin_status, error_page, page, query_escape, respond};
use super::live::overview_table;
use super::who::Who;

/// The most payload bytes a job page shows; the rest is behind the download link.
pub const PAYLOAD_SHOWN: usize = 64 * 1024;
/// Jobs per page of `/jobs` and `/dlq`.
const PAGE: u32 = 50;
/// Dead jobs read to group `/dlq` by error.
const GROUP_SCAN: u32 = 1000;

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

/// `GET /static/console.css`.
pub async fn css() -> Response {
    asset(CSS, "text/css; charset=utf-8")
}

/// `GET /static/console.js`.
pub async fn js() -> Response {
    asset(JS, "text/javascript; charset=utf-8")
}

fn asset(body: &'static str, kind: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        body,
    )
        .into_response()
}

/// Any path the console does not serve.
pub async fn not_found(State(ctx): State<Arc<Ctx>>) -> Response {
    error_page(&ctx, StatusCode::NOT_FOUND, "no such page")
}

type Params = Query<Vec<(String, String)>>;

fn param<'p>(params: &'p [(String, String)], key: &str) -> Option<&'p str> {
    params
        .iter()
        .find(|(k, v)| k == key && !v.is_empty())
        .map(|(_, v)| v.as_str())
}

fn notice(params: &[(String, String)]) -> Option<String> {
    param(params, "notice").map(|n| n.chars().take(300).collect())
}

/// `GET /`: every queue's figures, live.
pub async fn overview(
    State(ctx): State<Arc<Ctx>>,
    Extension(who): Extension<Who>,
    Query(params): Params,
) -> Response {
    let snap = ctx.live.latest();
    let body = html! {
        noscript { p { "Without JavaScript this table does not update; reload the page." } }
        div id="live" data-stream=(ctx.url("/live/events")) data-poll=(ctx.url("/live/overview")) {
            (overview_table(&ctx, &snap))
        }
    };
    respond(
        StatusCode::OK,
        page(
            &ctx,
            Some(&who),
            "Overview",
            notice(&params).as_deref(),
            body,
        ),
    )
}

/// `GET /queues/{queue}`: settings, limits, tenants, actions.
pub async fn queue(
    State(ctx): State<Arc<Ctx>>,
    Extension(who): Extension<Who>,
    Path(name): Path<String>,
    Query(params): Params,
) -> Response {
    let config = ctx.daemon.config();
    let Some(qc) = config.queues.get(&name) else {
        return error_page(
            &ctx,
            StatusCode::NOT_FOUND,
            &format!("unknown queue {name:?}"),
        );
    };
    let top = match ctx
        .admin(
            Request::Top {
                tenants_of: Some(name.clone()),
            },
            &who,
        )
        .await
    {
        Ok(AdminResponse::Top(t)) => t,
        Ok(_) => return error_page(&ctx, StatusCode::INTERNAL_SERVER_ERROR, "unexpected answer"),
        Err(e) => return admin_error(&ctx, &e),
    };
    let info = top.queues.iter().find(|q| q.info.name == name);
    let has_pool = ctx.daemon.executors.has(&name);
    let body = html! {
        @if let Some(q) = info {
            p { "Ready " b { (q.info.ready) } ", delayed " (q.info.delayed) ", leased " (q.info.leased)
                ", dead " (q.info.dead) ". Leasing is " b class="paused" { @if q.info.paused { "paused" } @else { "running" } } "." }
            @if who.admin {
                @if q.info.paused {
                    form method="post" action=(ctx.url(&format!("/queues/{name}/resume"))) { button type="submit" { "Resume" } }
                } @else {
                    form method="post" action=(ctx.url(&format!("/queues/{name}/pause"))) { button type="submit" { "Pause" } }
                }
                @if has_pool {
                    form method="post" action=(ctx.url(&format!("/queues/{name}/workers"))) {
                        label { "Workers min " input type="number" name="min" min="0" value=(q.info.workers_min); }
                        label { " max " input type="number" name="max" min="1" value=(q.info.workers_max); }
                        button type="submit" { "Set workers" }
                    }
                }
            }
        }
        h2 { "Settings" }
        table {
            tr { th { "Lease" } td { (humantime::format_duration(qc.lease)) } }
            tr { th { "Heartbeat" } td { (humantime::format_duration(qc.heartbeat)) } }
            tr { th { "Timeout" } td { (humantime::format_duration(qc.timeout)) } }
            tr { th { "Max attempts" } td { (qc.max_attempts) } }
            tr { th { "Max depth" } td { (qc.max_depth) } }
            tr { th { "Rate limiter" } td { (qc.rate_limiter.as_deref().unwrap_or("-")) } }
            tr { th { "Worker pool" } td { @if has_pool { "yes" } @else { "no (external workers)" } } }
        }
        h2 { "Tenants" }
        table {
            tr { th { "Tenant" } th { "Weight" } th { "Ready" } th { "Delayed" } th { "Leased" } }
            @for t in &top.tenants {
                tr {
                    td { a href=(ctx.url(&format!("/jobs?queue={name}&tenant={}", query_escape(&t.tenant)))) { (t.tenant) } }
                    td { (ctx.daemon.limits.tenant(&t.tenant).weight) }
                    td { (t.ready) } td { (t.delayed) } td { (t.leased) }
                }
            }
        }
        p { a href=(ctx.url(&format!("/jobs?queue={name}"))) { "Jobs of this queue" } }
    };
    respond(
        StatusCode::OK,
        page(
            &ctx,
            Some(&who),
            &format!("Queue {name}"),
            notice(&params).as_deref(),
            body,
        ),
    )
}

fn time(ms: i64) -> String {
    let t =
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_seconds(t).to_string()
}

fn jobs_table(ctx: &Ctx, jobs: &[qd_proto::JobSummary], select: bool) -> Markup {
    html! {
        table class="jobs" {
            tr { @if select { th { "" } } th { "Job" } th { "Queue" } th { "Tenant" } th { "State" } th { "Attempts" } th { "Updated" } th { "Last error" } }
            @for j in jobs {
                tr {
                    @if select { td { input type="checkbox" name="id" value=(j.id); } }
                    td { a href=(ctx.url(&format!("/jobs/{}", j.id))) { code { (j.id) } } }
                    td { (j.queue) } td { (j.tenant) } td { (j.state) }
                    td { (j.attempts) "/" (j.max_attempts) }
                    td { (time(j.updated_at)) }
                    td class="err" { (j.last_error.as_deref().unwrap_or("")) }
                }
            }
        }
    }
}

/// A job's parents or dependents (`after`): each linked to its own page, with
/// the edge's state and the job's; a purged or pruned one has no page.
fn edges_table(ctx: &Ctx, class: &str, edges: &[qd_proto::EdgeInfo]) -> Markup {
    html! {
        table class=(class) {
            tr { th { "Job" } th { "Edge" } th { "State" } th { "Queue" } }
            @for e in edges {
                tr {
                    td {
                        @if e.state.is_some() {
                            a href=(ctx.url(&format!("/jobs/{}", e.id))) { code { (e.id) } }
                        } @else {
                            code { (e.id) }
                        }
                    }
                    td class="edge" { (e.edge) }
                    td class="state" { (e.state.as_deref().unwrap_or("purged")) }
                    td { (e.queue.as_deref().unwrap_or("-")) }
                }
            }
        }
    }
}

/// The filters of `/jobs`, in the order its links carry them.
const JOB_FILTERS: [&str; 5] = ["queue", "tenant", "state", "error", "since"];

/// `GET /jobs?queue&state&tenant&error&since&after`: a keyset-paged list, newest
/// first. A filter the daemon refuses (a bad `since`, state or cursor, an unknown
/// queue) answers its status with the message above the form, and no list.
pub async fn jobs(
    State(ctx): State<Arc<Ctx>>,
    Extension(who): Extension<Who>,
    Query(params): Params,
) -> Response {
    let get = |k| param(&params, k).map(str::to_string);
    let listed = match get("since").as_deref().map(parse_since).transpose() {
        Err(e) => Err((StatusCode::BAD_REQUEST, e)),
        Ok(since_secs) => {
            let req = Request::JobsList {
                queue: get("queue"),
                tenant: get("tenant"),
                state: get("state"),
                error_contains: get("error"),
                since_secs,
                limit: Some(PAGE),
                after: get("after"),
            };
            match ctx.admin(req, &who).await {
                Ok(AdminResponse::Jobs { jobs, next_after }) => Ok((jobs, next_after)),
                Ok(_) => Err((
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "unexpected answer".into(),
                )),
                Err(e) => Err((admin_status(&e), e.message)),
            }
        }
    };
    let filters: Vec<(&str, String)> = JOB_FILTERS
        .into_iter()
        .filter_map(|k| Some((k, get(k)?)))
        .collect();
    let next_link = |after: &str| {
        let mut q: Vec<(&str, String)> = filters.clone();
        q.push(("after", after.to_string()));
        ctx.url(&format!(
            "/jobs?{}",
            serde_urlencoded::to_string(&q).unwrap_or_default()
        ))
    };
    let v = |k| get(k).unwrap_or_default();
    let form = html! {
        form method="get" action=(ctx.url("/jobs")) class="filters" {
            label { "Queue " input name="queue" value=(v("queue")); }
            label { "Tenant " input name="tenant" value=(v("tenant")); }
            label { "State " select name="state" {
                option value="" { "any" }
                @for s in ["ready", "delayed", "leased", "succeeded", "dead", "cancelled"] {
                    option value=(s) selected[get("state").as_deref() == Some(s)] { (s) }
                }
            } }
            label { "Error contains " input name="error" value=(v("error")); }
            label { "Changed since " input name="since" placeholder="1h or 2026-03-01T12:00:00Z" value=(v("since")); }
            button type="submit" { "Filter" }
        }
    };
    let (status, body) = match listed {
        Ok((jobs, next)) => (
            StatusCode::OK,
            html! {
                (form)
                (jobs_table(&ctx, &jobs, false))
                @if let Some(after) = next { p { a href=(next_link(&after)) rel="next" { "Next page" } } }
            },
        ),
        Err((status, message)) => (
            status,
            html! {
                p class="error" role="alert" { (message) }
                (form)
            },
        ),
    };
    respond(
        status,
        page(&ctx, Some(&who), "Jobs", notice(&params).as_deref(), body),
    )
}

/// A `since` filter as seconds before now: a duration as `qctl dlq list --since`
/// takes it (`90m`, `1h 30m`, `2d`), bare seconds (what the DLQ forms carry), or
/// an RFC 3339 time
/// (`2026-03-01T12:00:00Z`, any offset), rounded to whole seconds so that the
/// window includes the time given. A time in the future is refused: it matches
/// nothing and is most likely a mistake.
pub fn parse_since(text: &str) -> Result<u64, String> {
    parse_since_at(text, crate::clock::wall_ms())
}

fn parse_since_at(text: &str, now_ms: i64) -> Result<u64, String> {
    let text = text.trim();
    if let Ok(d) = humantime::parse_duration(text) {
        return Ok(d.as_secs());
    }
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(secs);
    }
    match chrono::DateTime::parse_from_rfc3339(text) {
        Ok(at) => {
            let ago_ms = now_ms.saturating_sub(at.timestamp_millis());
            if ago_ms < 0 {
                return Err(format!("since {text:?} is in the future"));
            }
            Ok(u64::try_from(ago_ms).unwrap_or(0).div_ceil(1000))
        }
        Err(_) => Err(format!(
            "since {text:?} is neither a duration like 1h or 90m nor an RFC 3339 time like 2026-03-01T12:00:00Z"
        )),
    }
}

/// `GET /jobs/{id}`: state, history, payload (escaped, cut at 64 KiB), actions.
/// `no-store`: the payload may be sensitive.
pub async fn job(
    State(ctx): State<Arc<Ctx>>,
    Extension(who): Extension<Who>,
    Path(id): Path<String>,
    Query(params): Params,
) -> Response {
    let detail = match ctx.admin(Request::JobsShow { id: id.clone() }, &who).await {
        Ok(AdminResponse::Job(d)) => d,
        Ok(_) => return error_page(&ctx, StatusCode::INTERNAL_SERVER_ERROR, "unexpected answer"),
        Err(e) => return admin_error(&ctx, &e),
    };
    let payload = match ctx
        .admin(Request::JobsPayload { id: id.clone() }, &who)
        .await
    {
        Ok(AdminResponse::Payload(p)) => base64::engine::general_purpose::STANDARD
            .decode(p.payload_b64)
            .unwrap_or_default(),
        Ok(_) => return error_page(&ctx, StatusCode::INTERNAL_SERVER_ERROR, "unexpected answer"),
        Err(e) => return admin_error(&ctx, &e),
    };
    let shown = String::from_utf8_lossy(&payload[..payload.len().min(PAYLOAD_SHOWN)]).into_owned();
    let s = &detail.summary;
    // Read back from the key, as `GET /v1/jobs/{id}` shows it.
    let schedule = detail
        .idempotency_key
        .as_deref()
        .and_then(crate::schedule::JobSchedule::of_key);
    let cancellable = matches!(s.state.as_str(), "ready" | "delayed" | "leased" | "dead");
    let body = html! {
        table {
            tr { th { "Queue" } td { a href=(ctx.url(&format!("/queues/{}", s.queue))) { (s.queue) } } }
            tr { th { "Tenant" } td { (s.tenant) } }
            tr { th { "State" } td class="state" { (s.state) } }
            tr { th { "Attempts" } td { (s.attempts) " of " (s.max_attempts) } }
            tr { th { "Idempotency key" } td { (detail.idempotency_key.as_deref().unwrap_or("-")) } }
            @if let Some(schedule) = &schedule {
                tr { th { "Schedule" } td class="schedule" { (schedule.name) ", tick " time datetime=(schedule.tick) { (schedule.tick) } } }
            }
            tr { th { "Created" } td { (time(s.created_at)) } }
            tr { th { "Updated" } td { (time(s.updated_at)) } }
        }
        @if who.admin && cancellable {
            form method="post" action=(ctx.url(&format!("/jobs/{id}/cancel"))) { button type="submit" { "Cancel job" } }
        }
        @if !detail.parents.is_empty() {
            h2 { "Runs after (" (detail.parents.len()) ")" }
            (edges_table(&ctx, "parents", &detail.parents))
        }
        @if detail.dependents_total > 0 {
            h2 { "Runs before (" (detail.dependents_total) ")" }
            (edges_table(&ctx, "dependents", &detail.dependents))
            @if detail.dependents_total > detail.dependents.len() as u64 {
                p { "The first " (detail.dependents.len()) " are listed." }
            }
        }
        h2 { "Payload (" (detail.payload_bytes) " bytes)" }
        pre class="payload" { (shown) }
        @if payload.len() > PAYLOAD_SHOWN { p { "Cut at 64 KiB." } }
        p { a href=(ctx.url(&format!("/jobs/{id}/payload"))) download { "Download the payload" } }
        @if who.admin && s.state == "dead" {
            h2 { "Redrive with a new payload" }
            form method="post" action=(ctx.url(&format!("/jobs/{id}/redrive"))) {
                textarea name="payload" rows="4" cols="80" {}
                button type="submit" { "Redrive with this payload" }
            }
        }
        h2 { "History" }
        @if detail.history_elided > 0 { p { (detail.history_elided) " entries elided." } }
        table {
            tr { th { "Attempt" } th { "Outcome" } th { "Worker" } th { "Ended" } th { "Error" } }
            @for h in &detail.history {
                tr { td { (h.attempt) } td { (h.outcome) } td { (h.worker.as_deref().unwrap_or("-")) }
                     td { (time(h.ended_at)) } td class="err" { (h.error.as_deref().unwrap_or("")) } }
            }
        }
    };
    respond(
        StatusCode::OK,
        page(
            &ctx,
            Some(&who),
            &format!("Job {id}"),
            notice(&params).as_deref(),
            body,
        ),
    )
}

/// `GET /jobs/{id}/payload`: the whole payload as a download, never rendered.
pub async fn payload(
    State(ctx): State<Arc<Ctx>>,
    Extension(who): Extension<Who>,
    Path(id): Path<String>,
) -> Response {
    match ctx
        .admin(Request::JobsPayload { id: id.clone() }, &who)
        .await
    {
        Ok(AdminResponse::Payload(p)) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(p.payload_b64)
                .unwrap_or_default();
            let file = format!("attachment; filename=\"{}.payload\"", p.id);
            (
                [
                    (header::CONTENT_TYPE, "application/octet-stream".to_string()),
                    (header::CONTENT_DISPOSITION, file),
                ],
                bytes,
            )
                .into_response()
        }
        Ok(_) => error_page(&ctx, StatusCode::INTERNAL_SERVER_ERROR, "unexpected answer"),
        Err(e) => admin_error(&ctx, &e),
    }
}

/// The DLQ filters of a query or form: `queue`, `tenant`, `error`, `since` (see
/// [`parse_since`]).
pub fn selection(params: &[(String, String)]) -> Result<DlqSelection, String> {
    let get = |k| param(params, k).map(str::to_string);
    let since_secs = get("since").as_deref().map(parse_since).transpose()?;
    Ok(DlqSelection {
        ids: Vec::new(),
        queue: get("queue"),
        tenant: get("tenant"),
        error_contains: get("error"),
        since_secs,
        all: false,
    })
}

/// The hidden inputs that carry a selection's filters into a form.
pub fn filter_inputs(sel: &DlqSelection) -> Markup {
    html! {
        @if let Some(q) = &sel.queue { input type="hidden" name="queue" value=(q); }
        @if let Some(t) = &sel.tenant { input type="hidden" name="tenant" value=(t); }
        @if let Some(e) = &sel.error_contains { input type="hidden" name="error" value=(e); }
        @if let Some(s) = sel.since_secs { input type="hidden" name="since" value=(s); }
    }
}

/// `GET /dlq?queue&tenant&error&since&after`: dead jobs grouped by last error,
/// one page listed with check boxes, redrive and purge by filter.
pub async fn dlq(
    State(ctx): State<Arc<Ctx>>,
    Extension(who): Extension<Who>,
    Query(params): Params,
) -> Response {
    let sel = match selection(&params) {
        Ok(s) => s,
        Err(e) => return error_page(&ctx, StatusCode::BAD_REQUEST, &e),
    };
    let list = |limit, after| Request::DlqList {
        selection: sel.clone(),
        limit: Some(limit),
        after,
    };
    let scan = match ctx.admin(list(GROUP_SCAN, None), &who).await {
        Ok(AdminResponse::Jobs { jobs, next_after }) => (jobs, next_after.is_some()),
        Ok(_) => return error_page(&ctx, StatusCode::INTERNAL_SERVER_ERROR, "unexpected answer"),
        Err(e) => return admin_error(&ctx, &e),
    };
    let mut groups: BTreeMap<String, u64> = BTreeMap::new();
    for j in &scan.0 {
        let key: String = j
            .last_error
            .as_deref()
            .unwrap_or("(no error)")
            .chars()
            .take(120)
            .collect();
        *groups.entry(key).or_default() += 1;
    }
    let mut groups: Vec<(String, u64)> = groups.into_iter().collect();
    groups.sort_by_key(|g| std::cmp::Reverse(g.1));
    let after = param(&params, "after").map(str::to_string);
    let (jobs, next) = match ctx.admin(list(PAGE, after), &who).await {
        Ok(AdminResponse::Jobs { jobs, next_after }) => (jobs, next_after),
        Ok(_) => return error_page(&ctx, StatusCode::INTERNAL_SERVER_ERROR, "unexpected answer"),
        Err(e) => return admin_error(&ctx, &e),
    };
    let mut query: Vec<(&str, String)> = Vec::new();
    for k in ["queue", "tenant", "error", "since"] {
        if let Some(v) = param(&params, k) {
            query.push((k, v.to_string()));
        }
    }
    let next_link = next.map(|a| {
        let mut q = query.clone();
        q.push(("after", a));
        ctx.url(&format!(
            "/dlq?{}",
            serde_urlencoded::to_string(&q).unwrap_or_default()
        ))
    });
    let group_link = |error: &str| {
        let mut q: Vec<(&str, String)> = query
            .iter()
            .filter(|(k, _)| *k != "error")
            .cloned()
            .collect();
        q.push(("error", error.to_string()));
        ctx.url(&format!(
            "/dlq?{}",
            serde_urlencoded::to_string(&q).unwrap_or_default()
        ))
    };
    let v = |k| param(&params, k).unwrap_or_default().to_string();
    let body = html! {
        form method="get" action=(ctx.url("/dlq")) class="filters" {
            label { "Queue " input name="queue" value=(v("queue")); }
            label { "Tenant " input name="tenant" value=(v("tenant")); }
            label { "Error contains " input name="error" value=(v("error")); }
            label { "Since " input name="since" placeholder="1h" value=(v("since")); }
            button type="submit" { "Filter" }
        }
        h2 { "By last error" }
        @if scan.1 { p { "Counted over the first " (GROUP_SCAN) " matching dead jobs." } }
        table class="groups" {
            tr { th { "Last error" } th { "Jobs" } }
            @for (error, n) in &groups {
                tr { td class="err" { a href=(group_link(error)) { (error) } } td { (n) } }
            }
        }
        @if who.admin {
            h2 { "Redrive or purge everything matching the filter" }
            form method="post" action=(ctx.url("/dlq/redrive")) {
                (filter_inputs(&sel))
                input type="hidden" name="step" value="preview";
                @if !sel.has_filter() { label { input type="checkbox" name="all" value="1"; " every dead job (no filter)" } }
                button type="submit" { "Redrive… (count first)" }
            }
            form method="post" action=(ctx.url("/dlq/purge")) {
                (filter_inputs(&sel))
                input type="hidden" name="step" value="preview";
                @if !sel.has_filter() { label { input type="checkbox" name="all" value="1"; " every dead job (no filter)" } }
                button type="submit" { "Purge… (count first)" }
            }
        }
        h2 { "Dead jobs" }
        form method="post" action=(ctx.url("/dlq/redrive")) {
            input type="hidden" name="step" value="confirm";
            (jobs_table(&ctx, &jobs, who.admin))
            @if who.admin && !jobs.is_empty() { button type="submit" { "Redrive selected" } }
        }
        @if let Some(link) = next_link { p { a href=(link) rel="next" { "Next page" } } }
    };
    respond(
        StatusCode::OK,
        page(
            &ctx,
            Some(&who),
            "Dead letters",
            notice(&params).as_deref(),
            body,
        ),
    )
}

/// A dry run's count with the form that confirms it (`what` is `redrive` or `purge`).
pub fn confirm_page(
    ctx: &Ctx,
    who: &Who,
    what: &str,
    sel: &DlqSelection,
    matched: u64,
) -> Response {
    let body = html! {
        p { b { (matched) } " dead jobs match." }
        @if matched > 0 {
            form method="post" action=(ctx.url(&format!("/dlq/{what}"))) {
                (filter_inputs(sel))
                @if sel.all { input type="hidden" name="all" value="1"; }
                input type="hidden" name="step" value="confirm";
                @if what == "redrive" {
                    label { "Jobs per second " input type="number" name="rate" min="1" max="1000" value="50"; }
                } @else {
                    label { "Type " code { "purge" } " to confirm " input name="confirm" autocomplete="off" required; }
                }
                button type="submit" { (if what == "redrive" { "Redrive" } else { "Purge" }) " " (matched) " jobs" }
            }
        }
        p { a href=(ctx.url("/dlq")) { "Back" } }
    };
    respond(
        StatusCode::OK,
        page(ctx, Some(who), &format!("Confirm {what}"), None, body),
    )
}

/// `GET /limits`: tenant and queue limits in force, with set and reset forms.
pub async fn limits(
    State(ctx): State<Arc<Ctx>>,
    Extension(who): Extension<Who>,
    Query(params): Params,
) -> Response {
    let view = match ctx.admin(Request::LimitsShow {}, &who).await {
        Ok(AdminResponse::Limits(v)) => v,
        Ok(_) => return error_page(&ctx, StatusCode::INTERNAL_SERVER_ERROR, "unexpected answer"),
        Err(e) => return admin_error(&ctx, &e),
    };
    let src = |s: qd_proto::Source| match s {
        qd_proto::Source::Config => "config",
        qd_proto::Source::Override => "override",
    };
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let body = html! {
        h2 { "Tenants" }
        table {
            tr { th { "Tenant" } th { "Weight" } th { "Max concurrency" } th { "Max depth" } @if who.admin { th { "" } } }
            @for t in &view.tenants {
                tr {
                    td { (t.tenant) }
                    td { (t.weight.value) " (" (src(t.weight.source)) ")" }
                    td { (opt(t.max_concurrency.value.map(|v| v.to_string()))) " (" (src(t.max_concurrency.source)) ")" }
                    td { (opt(t.max_depth.value.map(|v| v.to_string()))) " (" (src(t.max_depth.source)) ")" }
                    @if who.admin { td {
                        form method="post" action=(ctx.url("/limits/reset")) class="inline" {
                            input type="hidden" name="tenant" value=(t.tenant);
                            button type="submit" { "Reset" }
                        }
                    } }
                }
            }
        }
        @if who.admin {
            form method="post" action=(ctx.url("/limits/tenant")) {
                label { "Tenant " input name="tenant" required; }
                label { " weight " input type="number" name="weight" min="1"; }
                label { " max concurrency " input type="number" name="max_concurrency" min="0"; }
                label { " max depth " input type="number" name="max_depth" min="0"; }
                button type="submit" { "Set" }
            }
        }
        h2 { "Queues" }
        table {
            tr { th { "Queue" } th { "Workers" } th { "Rate limiter" } th { "Paused" } }
            @for q in &view.queues {
                tr {
                    td { a href=(ctx.url(&format!("/queues/{}", q.queue))) { (q.queue) } }
                    td { (q.workers_min.value) ".." (q.workers_max.value) }
                    td { (q.rate_limiter.as_deref().unwrap_or("-")) }
                    td { @if q.paused.value { "paused" } @else { "no" } }
                }
            }
        }
    };
    respond(
        StatusCode::OK,
        page(&ctx, Some(&who), "Limits", notice(&params).as_deref(), body),
    )
}

/// `GET /cluster` (PostgreSQL only): the nodes, their heartbeats and the leader.
pub async fn cluster(State(ctx): State<Arc<Ctx>>, Extension(who): Extension<Who>) -> Response {
    let status = match ctx.admin(Request::Status {}, &who).await {
        Ok(AdminResponse::Status(s)) => s,
        Ok(_) => return error_page(&ctx, StatusCode::INTERNAL_SERVER_ERROR, "unexpected answer"),
        Err(e) => return admin_error(&ctx, &e),
    };
    let body = html! {
        table {
            tr { th { "Node" } th { "Heartbeat age" } th { "Alive" } th { "Leader" } th { "Epoch" } }
            @for n in &status.nodes {
                tr {
                    td { (n.name) @if n.this { " (this node)" } }
                    td { (n.heartbeat_age_ms) " ms" }
                    td { @if n.alive { "yes" } @else { "no" } }
                    td { @if n.leader { "leader" } @else { "-" } }
                    td { (n.epoch.map(|e| e.to_string()).unwrap_or_else(|| "-".into())) }
                }
            }
        }
    };
    respond(
        StatusCode::OK,
        page(&ctx, Some(&who), "Cluster", None, body),
    )
}

#[cfg(test)]
mod tests {
    use super::parse_since_at;

    /// 2026-03-01T12:00:00Z.
    const NOON: i64 = 1_772_366_400_000;

    #[test]
    fn since_takes_durations_and_seconds() {
        assert_eq!(parse_since_at("1h", NOON), Ok(3600));
        assert_eq!(parse_since_at(" 90m ", NOON), Ok(5400));
        assert_eq!(parse_since_at("1h 30m", NOON), Ok(5400));
        assert_eq!(parse_since_at("2d", NOON), Ok(172_800));
        assert_eq!(parse_since_at("600", NOON), Ok(600));
    }

    #[test]
    fn since_takes_rfc3339_times_rounded_to_include_them() {
        assert_eq!(parse_since_at("2026-03-01T11:00:00Z", NOON), Ok(3600));
        assert_eq!(parse_since_at("2026-03-01T12:00:00+01:00", NOON), Ok(3600));
        // 0.5 s ago is 1 s ago, so the window reaches back to the time given.
        assert_eq!(parse_since_at("2026-03-01T11:59:59.500Z", NOON), Ok(1));
        assert_eq!(parse_since_at("2026-03-01T12:00:00Z", NOON), Ok(0));
    }

    #[test]
    fn since_refuses_the_future_and_nonsense_naming_the_value() {
        let future = parse_since_at("2026-03-01T12:00:01Z", NOON).expect_err("a future time");
        assert!(future.contains("in the future"), "{future}");
        for bad in ["yesterday", "1 fortnight", "-1h", "2026-03-01", "", "1e3"] {
            let e = parse_since_at(bad, NOON).expect_err(bad);
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
            assert!(e.contains("RFC 3339"), "{bad}: {e}");
        }
    }
}
