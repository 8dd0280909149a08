//! The overview's live figures: one sampler for every viewer.
//!
//! [`sample`] asks the admin handler for `top` (what `qctl top` shows) every
//! [`PERIOD`], turns the completed and failed totals into rates, keeps the last
//! [`HISTORY`] samples per queue for the sparklines and publishes a [`Snapshot`].
//! `GET /live/events` streams the rendered table as server-sent events each time
//! a snapshot is published (at most `console.max_streams` streams at once; more get
//! 503); `GET /live/overview` answers the same fragment once, for the page's
//! polling fallback.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use maud::{Markup, html};
use qd_proto::{QueueInfo, Request, Response as AdminResponse};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::Ctx;
use super::layout;
use super::who::Who;

/// How often the figures are sampled.
pub const PERIOD: Duration = Duration::from_secs(1);

/// Samples kept per queue for the sparklines (one minute).
pub const HISTORY: usize = 60;

/// One queue's figures.
#[derive(Clone, Debug)]
pub struct QueueRow {
    /// What `qctl queues` shows.
    pub info: QueueInfo,
    /// Attempts completed per second since the previous sample.
    pub completed_per_sec: f64,
    /// Attempts failed per second since the previous sample.
    pub failed_per_sec: f64,
    /// Ready jobs, oldest sample first.
    pub ready_history: Vec<u64>,
}

/// The figures of every queue at one moment.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// By queue, in name order.
    pub queues: Vec<QueueRow>,
    /// Why the last sample failed, if it did.
    pub error: Option<String>,
}

/// The latest snapshot, for every viewer.
pub struct Live {
    tx: watch::Sender<Arc<Snapshot>>,
}

impl Live {
    /// No figures yet.
    pub fn new() -> Self {
        Live {
            tx: watch::channel(Arc::new(Snapshot::default())).0,
        }
    }

    /// The latest snapshot.
    pub fn latest(&self) -> Arc<Snapshot> {
        self.tx.borrow().clone()
    }
}

/// The sampler's memory between samples.
#[derive(Default)]
struct Rates {
    last: BTreeMap<String, (Instant, u64, u64)>,
    history: BTreeMap<String, VecDeque<u64>>,
}

impl Rates {
    /// Folds one `top` answer taken at `now` into rows.
    fn rows(&mut self, queues: Vec<qd_proto::TopQueue>, now: Instant) -> Vec<QueueRow> {
        let mut rows = Vec::with_capacity(queues.len());
        self.history
            .retain(|name, _| queues.iter().any(|q| &q.info.name == name));
        for q in queues {
            let name = q.info.name.clone();
            let (completed_per_sec, failed_per_sec) = match self.last.get(&name) {
                Some((then, c, f)) => {
                    let secs = now
                        .saturating_duration_since(*then)
                        .as_secs_f64()
                        .max(0.001);
                    (
                        q.completed_total.saturating_sub(*c) as f64 / secs,
                        q.failed_total.saturating_sub(*f) as f64 / secs,
                    )
                }
                None => (0.0, 0.0),
            };
            self.last
                .insert(name.clone(), (now, q.completed_total, q.failed_total));
            let history = self.history.entry(name).or_default();
            history.push_back(q.info.ready);
            while history.len() > HISTORY {
                history.pop_front();
            }
            rows.push(QueueRow {
                ready_history: history.iter().copied().collect(),
                info: q.info,
                completed_per_sec,
                failed_per_sec,
            });
        }
        rows
    }
}

/// Samples until `stop`, publishing into `ctx.live`.
pub async fn sample(ctx: Arc<Ctx>, stop: CancellationToken) {
    let sampler = Who::sampler();
    let mut rates = Rates::default();
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let answer = ctx.admin(Request::Top { tenants_of: None }, &sampler).await;
        let snapshot = match answer {
            Ok(AdminResponse::Top(top)) => Snapshot {
                queues: rates.rows(top.queues, Instant::now()),
                error: None,
            },
            Ok(other) => Snapshot {
                error: Some(format!("unexpected answer {}", other.kind())),
                ..Snapshot::default()
            },
            Err(e) => Snapshot {
                error: Some(e.message),
                ..(*ctx.live.latest()).clone()
            },
        };
        ctx.live.tx.send_replace(Arc::new(snapshot));
    }
}

/// `GET /live/overview`: the overview table once (the polling fallback).
pub async fn fragment(State(ctx): State<Arc<Ctx>>) -> Response {
    Html(overview_table(&ctx, &ctx.live.latest()).into_string()).into_response()
}

/// `GET /live/events`: the overview table as an `overview` event each time the
/// figures are sampled; 503 when `console.max_streams` streams are open.
pub async fn events(State(ctx): State<Arc<Ctx>>) -> Response {
    let Ok(permit) = ctx.streams.clone().try_acquire_owned() else {
        return layout::error_page(
            &ctx,
            StatusCode::SERVICE_UNAVAILABLE,
            "too many open event streams (console.max_streams); the page falls back to polling",
        );
    };
    let rx = ctx.live.tx.subscribe();
    let stream = futures_util::stream::unfold(
        (rx, ctx, permit, true),
        |(mut rx, ctx, permit, first)| async move {
            if !first && rx.changed().await.is_err() {
                return None;
            }
            let snapshot = rx.borrow_and_update().clone();
            let html = overview_table(&ctx, &snapshot).into_string();
            let event = Event::default().event("overview").data(html);
            Some((Ok::<_, Infallible>(event), (rx, ctx, permit, false)))
        },
    );
    // nginx buffers a proxied answer unless told not to; an event stream must flow.
    (
        [("x-accel-buffering", "no")],
        Sse::new(stream).keep_alive(KeepAlive::default()),
    )
        .into_response()
}

fn sparkline(values: &[u64]) -> Markup {
    let (w, h) = (120.0_f64, 24.0_f64);
    let max = values.iter().copied().max().unwrap_or(0).max(1) as f64;
    let step = if values.len() > 1 {
        w / (values.len() - 1) as f64
    } else {
        0.0
    };
    let points: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            format!(
                "{:.1},{:.1}",
                i as f64 * step,
                h - (*v as f64 / max) * (h - 2.0) - 1.0
            )
        })
        .collect();
    html! {
        svg class="spark" width="120" height="24" viewBox="0 0 120 24" role="img" aria-label="ready jobs, last minute" {
            polyline fill="none" stroke="currentColor" stroke-width="1.5" points=(points.join(" ")) {}
        }
    }
}

fn age(secs: Option<f64>) -> String {
    match secs {
        None => "-".into(),
        Some(s) if s < 120.0 => format!("{s:.0}s"),
        Some(s) if s < 7200.0 => format!("{:.0}m", s / 60.0),
        Some(s) => format!("{:.1}h", s / 3600.0),
    }
}

/// The overview table (also the live fragment).
pub(super) fn overview_table(ctx: &Ctx, snap: &Snapshot) -> Markup {
    html! {
        @if let Some(e) = &snap.error { p class="error" { "Could not read the figures: " (e) } }
        table class="queues" {
            thead { tr {
                th { "Queue" } th { "Ready" } th { "Delayed" } th { "Leased" } th { "Dead" }
                th { "Oldest ready" } th { "Completed/s" } th { "Failed/s" } th { "Workers" }
                th { "Paused" } th { "Ready, last minute" }
            } }
            tbody {
                @for q in &snap.queues {
                    tr data-queue=(q.info.name) {
                        td { a href=(ctx.url(&format!("/queues/{}", q.info.name))) { (q.info.name) } }
                        td class="ready" { (q.info.ready) }
                        td { (q.info.delayed) }
                        td { (q.info.leased) }
                        td { a href=(ctx.url(&format!("/dlq?queue={}", q.info.name))) { (q.info.dead) } }
                        td { (age(q.info.oldest_ready_age_secs)) }
                        td { (format!("{:.1}", q.completed_per_sec)) }
                        td { (format!("{:.1}", q.failed_per_sec)) }
                        td { (q.info.workers_busy) "/" (q.info.workers_total) " (" (q.info.workers_min) ".." (q.info.workers_max) ")" }
                        td class="paused" { @if q.info.paused { "paused" } @else { "no" } }
                        td { (sparkline(&q.ready_history)) }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn top(name: &str, ready: u64, completed: u64, failed: u64) -> qd_proto::TopQueue {
        qd_proto::TopQueue {
            info: QueueInfo {
                name: name.into(),
                ready,
                delayed: 0,
                leased: 0,
                dead: 0,
                oldest_ready_age_secs: None,
                workers_busy: 0,
                workers_total: 0,
                workers_min: 0,
                workers_max: 0,
                paused: false,
                waiting: 0,
                blocked: 0,
            },
            completed_total: completed,
            failed_total: failed,
        }
    }

    #[test]
    fn rates_come_from_the_totals_between_samples_and_history_is_capped() {
        let mut rates = Rates::default();
        let t0 = Instant::now();
        let first = rates.rows(vec![top("email", 5, 100, 10)], t0);
        assert_eq!(first[0].completed_per_sec, 0.0, "no rate from one sample");
        let second = rates.rows(vec![top("email", 7, 120, 11)], t0 + Duration::from_secs(2));
        assert_eq!(second[0].completed_per_sec, 10.0);
        assert_eq!(second[0].failed_per_sec, 0.5);
        assert_eq!(second[0].ready_history, [5, 7]);
        for n in 0..100 {
            rates.rows(
                vec![top("email", n, 120, 11)],
                t0 + Duration::from_secs(3 + n),
            );
        }
        let last = rates.rows(
            vec![top("email", 1, 120, 11)],
            t0 + Duration::from_secs(200),
        );
        assert_eq!(last[0].ready_history.len(), HISTORY);
        assert_eq!(last[0].ready_history.last(), Some(&1));
    }
}
