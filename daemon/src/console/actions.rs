//! The console's actions: one handler per form, each checking on the server that
//! the session may act (role `admin`; a `read` session gets 403 whatever it sends)
//! and then sending the admin request qctl would send, so the change is validated,
//! applied, paced and audited exactly as from qctl. Each answers with a redirect
//! back to the page and a notice, or an error page naming the problem.

use std::sync::Arc;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use qd_proto::{DlqSelection, Payload, Request, Response as AdminResponse};

use super::layout;
use super::pages::{confirm_page, selection};
use super::who::Who;
use super::{Ctx, see_other};

/// The pace of a console redrive: jobs per batch, and the default and largest rate.
const REDRIVE_BATCH: u32 = 100;
const DEFAULT_RATE: f64 = 50.0;
const MAX_RATE: f64 = 1000.0;

type Form = Vec<(String, String)>;

fn form(body: &[u8]) -> Result<Form, String> {
    serde_urlencoded::from_bytes(body).map_err(|e| format!("malformed form: {e}"))
}

fn field<'f>(form: &'f Form, key: &str) -> Option<&'f str> {
    form.iter()
        .find(|(k, v)| k == key && !v.is_empty())
        .map(|(_, v)| v.as_str())
}

/// The role check and form parse every action starts with.
fn start(ctx: &Ctx, who: &Who, body: &[u8]) -> Result<Form, Box<Response>> {
    who.require_admin()
        .map_err(|(status, message)| Box::new(layout::error_page(ctx, status, &message)))?;
    form(body).map_err(|e| Box::new(bad_request(ctx, &e)))
}

async fn run(ctx: &Ctx, who: &Who, req: Request) -> Result<AdminResponse, Box<Response>> {
    ctx.admin(req, who)
        .await
        .map_err(|e| Box::new(layout::admin_error(ctx, &e)))
}

macro_rules! attempt {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(response) => return *response,
        }
    };
}

/// `POST /queues/{queue}/pause`.
pub async fn pause(
    State(ctx): State<Arc<Ctx>>,
    Extension(who): Extension<Who>,
    Path(queue): Path<String>,
    body: Bytes,
) -> Response {
    let req = Request::QueuePause {
        queue: queue.clone(),
    };
    queue_action(&ctx, &who, &body, &queue, req, "paused").await
}

/// `POST /queues/{queue}/resume`.
pub async fn resume(
    State(ctx): State<Arc<Ctx>>,
    Extension(who): Extension<Who>,
    Path(queue): Path<String>,
    body: Bytes,
) -> Response {
    let req = Request::QueueResume {
        queue: queue.clone(),
    };
    queue_action(&ctx, &who, &body, &queue, req, "resumed").await
}

/// An action on a queue that takes no form field: back to the queue's page, saying
/// what was `done`.
async fn queue_action(
    ctx: &Ctx,
    who: &Who,
    body: &[u8],
    queue: &str,
    req: Request,
    done: &str,
) -> Response {
    attempt!(start(ctx, who, body));
    attempt!(run(ctx, who, req).await);
    see_other(
        ctx,
        &format!("/queues/{queue}"),
        &format!("Queue {queue} {done}."),
    )
}

fn bad_request(ctx: &Ctx, message: &str) -> Response {
    layout::error_page(ctx, StatusCode::BAD_REQUEST, message)
}

/// The daemon answered with a kind the action does not expect (a bug, not bad input).
fn unexpected(ctx: &Ctx, other: &AdminResponse) -> Response {
    layout::error_page(
        ctx,
        StatusCode::INTERNAL_SERVER_ERROR,
        &format!("unexpected answer {}", other.kind()),
    )
}

fn number<T: std::str::FromStr>(
    ctx: &Ctx,
    form: &Form,
    key: &str,
) -> Result<Option<T>, Box<Response>> {
    match field(form, key) {
        None => Ok(None),
        Some(v) => v.trim().parse().map(Some).map_err(|_| {
            Box::new(bad_request(
                ctx,
                &format!("{key} {v:?} is not a whole number"),
            ))
        }),
    }
}

/// `POST /queues/{queue}/workers` with `min` and `max`.
pub async fn workers(
    State(ctx): State<Arc<Ctx>>,
    Extension(who): Extension<Who>,
    Path(queue): Path<String>,
    body: Bytes,
) -> Response {
    let form = attempt!(start(&ctx, &who, &body));
    let min = attempt!(number::<u32>(&ctx, &form, "min"));
    let max = attempt!(number::<u32>(&ctx, &form, "max"));
    let (Some(min), Some(max)) = (min, max) else {
        return bad_request(&ctx, "give both min and max");
    };
    attempt!(
        run(
            &ctx,
            &who,
            Request::WorkersSet {
                queue: queue.clone(),
                min,
                max
            }
        )
        .await
    );
    see_other(
        &ctx,
        &format!("/queues/{queue}"),
        &format!("Workers of {queue} set to {min}..{max}."),
    )
}

/// `POST /jobs/{id}/cancel`.
pub async fn cancel(
    State(ctx): State<Arc<Ctx>>,
    Extension(who): Extension<Who>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    attempt!(start(&ctx, &who, &body));
    let answer = attempt!(
        run(
            &ctx,
            &who,
            Request::JobsCancel {
                id: id.clone(),
                keep_dependents: false,
            }
        )
        .await
    );
    let note = match answer {
        AdminResponse::Cancelled { previous_state, .. } => {
            format!("Job cancelled (it was {previous_state}).")
        }
        _ => "Job cancelled.".into(),
    };
    see_other(&ctx, &format!("/jobs/{id}"), &note)
}

/// `POST /jobs/{id}/redrive` with `payload`: a dead job back to ready with a new payload.
pub async fn redrive_one(
    State(ctx): State<Arc<Ctx>>,
    Extension(who): Extension<Who>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let form = attempt!(start(&ctx, &who, &body));
    let Some(payload) = form
        .iter()
        .find(|(k, _)| k == "payload")
        .map(|(_, v)| v.clone())
    else {
        return bad_request(&ctx, "give the new payload");
    };
    let req = Request::DlqRedrive {
        selection: DlqSelection {
            ids: vec![id.clone()],
            ..DlqSelection::default()
        },
        dry_run: false,
        batch_size: None,
        rate_per_sec: None,
        payload: Some(Payload::Text(payload)),
    };
    attempt!(run(&ctx, &who, req).await);
    see_other(
        &ctx,
        &format!("/jobs/{id}"),
        "Redriven with the new payload.",
    )
}

/// The selection of a bulk form: checked ids, or the filters (`all` for none).
fn bulk_selection(ctx: &Ctx, form: &Form) -> Result<DlqSelection, Box<Response>> {
    let ids: Vec<String> = form
        .iter()
        .filter(|(k, v)| k == "id" && !v.is_empty())
        .map(|(_, v)| v.clone())
        .collect();
    if !ids.is_empty() {
        return Ok(DlqSelection {
            ids,
            ..DlqSelection::default()
        });
    }
    let bad = |e: String| Box::new(bad_request(ctx, &e));
    let mut sel = selection(form).map_err(bad)?;
    sel.all = !sel.has_filter() && field(form, "all") == Some("1");
    sel.check_mutation().map_err(bad)?;
    Ok(sel)
}

/// `POST /dlq/redrive`: `step=preview` answers the dry run's count with a form to
/// confirm it; `step=confirm` redrives, paced at `rate` jobs per second.
pub async fn redrive(
    State(ctx): State<Arc<Ctx>>,
    Extension(who): Extension<Who>,
    body: Bytes,
) -> Response {
    let form = attempt!(start(&ctx, &who, &body));
    let sel = attempt!(bulk_selection(&ctx, &form));
    let preview = field(&form, "step") != Some("confirm");
    let rate = match field(&form, "rate") {
        None => DEFAULT_RATE,
        Some(r) => match r.parse::<f64>() {
            Ok(r) if (1.0..=MAX_RATE).contains(&r) => r,
            _ => {
                return bad_request(
                    &ctx,
                    &format!("rate {r:?}: give 1 to {MAX_RATE} jobs per second"),
                );
            }
        },
    };
    let req = Request::DlqRedrive {
        selection: sel.clone(),
        dry_run: preview,
        batch_size: Some(REDRIVE_BATCH),
        rate_per_sec: Some(rate),
        payload: None,
    };
    match attempt!(run(&ctx, &who, req).await) {
        AdminResponse::Redrive(r) if preview => {
            confirm_page(&ctx, &who, "redrive", &sel, r.matched)
        }
        AdminResponse::Redrive(r) => see_other(
            &ctx,
            "/dlq",
            &format!("Redrove {} of {} matching dead jobs.", r.moved, r.matched),
        ),
        other => unexpected(&ctx, &other),
    }
}

/// `POST /dlq/purge`: `step=preview` answers the count; `step=confirm` with
/// `confirm=purge` typed deletes.
pub async fn purge(
    State(ctx): State<Arc<Ctx>>,
    Extension(who): Extension<Who>,
    body: Bytes,
) -> Response {
    let form = attempt!(start(&ctx, &who, &body));
    let sel = attempt!(bulk_selection(&ctx, &form));
    let preview = field(&form, "step") != Some("confirm");
    if !preview && field(&form, "confirm").map(str::trim) != Some("purge") {
        return bad_request(&ctx, "type the word purge to confirm; nothing was deleted");
    }
    let req = Request::DlqPurge {
        selection: sel.clone(),
        dry_run: preview,
        cascade: false,
        release: false,
    };
    match attempt!(run(&ctx, &who, req).await) {
        AdminResponse::Purge(r) if preview => confirm_page(&ctx, &who, "purge", &sel, r.matched),
        AdminResponse::Purge(r) => {
            // A dead job that holds back unfinished jobs is kept: say which and why.
            let notice = match r.refused.first() {
                None => format!("Purged {} dead jobs.", r.purged),
                Some(first) => format!(
                    "Purged {} dead jobs; {} refused, e.g. {}",
                    r.purged,
                    r.refused.len(),
                    first.reason
                ),
            };
            see_other(&ctx, "/dlq", &notice)
        }
        other => unexpected(&ctx, &other),
    }
}

/// `POST /limits/tenant` with `tenant` and any of `weight`, `max_concurrency`, `max_depth`.
pub async fn tenant_set(
    State(ctx): State<Arc<Ctx>>,
    Extension(who): Extension<Who>,
    body: Bytes,
) -> Response {
    let form = attempt!(start(&ctx, &who, &body));
    let Some(tenant) = field(&form, "tenant").map(str::to_string) else {
        return bad_request(&ctx, "give the tenant");
    };
    let weight = attempt!(number::<u32>(&ctx, &form, "weight"));
    let max_concurrency = attempt!(number::<u32>(&ctx, &form, "max_concurrency"));
    let max_depth = attempt!(number::<u64>(&ctx, &form, "max_depth"));
    if weight.is_none() && max_concurrency.is_none() && max_depth.is_none() {
        return bad_request(&ctx, "give a weight, max concurrency or max depth");
    }
    let req = Request::LimitsSet {
        tenant: tenant.clone(),
        weight,
        max_concurrency,
        max_depth,
    };
    attempt!(run(&ctx, &who, req).await);
    see_other(&ctx, "/limits", &format!("Limits of tenant {tenant} set."))
}

/// `POST /limits/reset` with `tenant`: back to the config's values.
pub async fn tenant_reset(
    State(ctx): State<Arc<Ctx>>,
    Extension(who): Extension<Who>,
    body: Bytes,
) -> Response {
    let form = attempt!(start(&ctx, &who, &body));
    let Some(tenant) = field(&form, "tenant").map(str::to_string) else {
        return bad_request(&ctx, "give the tenant");
    };
    let req = Request::LimitsReset {
        tenant: Some(tenant.clone()),
        queue: None,
        limiter: None,
    };
    attempt!(run(&ctx, &who, req).await);
    see_other(
        &ctx,
        "/limits",
        &format!("Limits of tenant {tenant} reset."),
    )
}
