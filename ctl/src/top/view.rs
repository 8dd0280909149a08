//! The pure part of `qctl top`: what it remembers between refreshes ([`Model`]:
//! the latest answer, counter samples for rates, the selected queue) and how one
//! frame is drawn from it ([`draw`]). No I/O, so it is tested on ratatui's
//! `TestBackend` with hand-made answers and instants.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use qd_proto::{TopInfo, TopQueue};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Paragraph, Row, Table, TableState};

use crate::format::age;

/// Rates are averaged over this much history.
pub const RATE_WINDOW: Duration = Duration::from_secs(10);

/// What `top` knows: the last answer, recent counter readings per queue and the
/// selection.
#[derive(Default)]
pub struct Model {
    info: Option<TopInfo>,
    samples: HashMap<String, VecDeque<Sample>>,
    selected: usize,
    interval: Duration,
}

/// One reading of a queue's cumulative counters.
#[derive(Clone, Copy)]
struct Sample {
    at: Instant,
    completed: u64,
    failed: u64,
}

impl Model {
    /// An empty model refreshed every `interval` (shown in the title).
    pub fn new(interval: Duration) -> Self {
        Model {
            interval,
            ..Model::default()
        }
    }

    /// Records an answer read at `now`, dropping samples older than [`RATE_WINDOW`]
    /// (but always keeping the previous one, so a slow refresh still has a rate).
    pub fn update(&mut self, info: TopInfo, now: Instant) {
        for q in &info.queues {
            let samples = self.samples.entry(q.info.name.clone()).or_default();
            samples.push_back(Sample {
                at: now,
                completed: q.completed_total,
                failed: q.failed_total,
            });
            while samples.len() > 2
                && samples
                    .get(1)
                    .is_some_and(|s| now.duration_since(s.at) >= RATE_WINDOW)
            {
                samples.pop_front();
            }
        }
        self.selected = self.selected.min(info.queues.len().saturating_sub(1));
        self.info = Some(info);
    }

    /// Completed and failed attempts per second of `queue` over the samples kept;
    /// `None` until two readings exist.
    pub fn rates(&self, queue: &str) -> Option<(f64, f64)> {
        let samples = self.samples.get(queue)?;
        let (first, last) = (samples.front()?, samples.back()?);
        let secs = last.at.duration_since(first.at).as_secs_f64();
        if secs <= 0.0 {
            return None;
        }
        let per_sec = |a: u64, b: u64| b.saturating_sub(a) as f64 / secs;
        Some((
            per_sec(first.completed, last.completed),
            per_sec(first.failed, last.failed),
        ))
    }

    /// Moves the selection up (`-1`) or down (`+1`), staying within the queues.
    pub fn select(&mut self, step: isize) {
        let n = self.info.as_ref().map_or(0, |i| i.queues.len());
        self.selected = self
            .selected
            .saturating_add_signed(step)
            .min(n.saturating_sub(1));
    }

    /// The selected queue's name, whose tenants the next request asks for.
    pub fn selected_queue(&self) -> Option<&str> {
        let info = self.info.as_ref()?;
        info.queues.get(self.selected).map(|q| q.info.name.as_str())
    }
}

/// Draws one frame: title and keys, the queue table (selected row marked), and the
/// selected queue's tenants.
pub fn draw(frame: &mut Frame, model: &Model) {
    let [title, queues, tenants] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Percentage(60),
        Constraint::Fill(1),
    ])
    .areas(frame.area());
    let every = age(model.interval.as_secs_f64());
    frame.render_widget(
        Paragraph::new(Line::from(format!(
            "qd top - every {every} - rates over {}s - Up/Down select a queue - q quits",
            RATE_WINDOW.as_secs()
        ))),
        title,
    );
    let Some(info) = &model.info else {
        frame.render_widget(Paragraph::new("waiting for qd..."), queues);
        return;
    };
    let mut state = TableState::default().with_selected(Some(model.selected));
    frame.render_stateful_widget(queue_table(&info.queues, model), queues, &mut state);
    frame.render_widget(tenant_table(info, model.selected_queue()), tenants);
}

fn bold() -> Style {
    Style::default().add_modifier(Modifier::BOLD)
}

fn queue_table<'a>(queues: &'a [TopQueue], model: &Model) -> Table<'a> {
    let header = [
        "QUEUE",
        "READY",
        "DELAYED",
        "WAITING",
        "BLOCKED",
        "LEASED",
        "DLQ",
        "OLDEST",
        "DONE/S",
        "FAILED/S",
        "BUSY/WORKERS",
        "PAUSED",
    ];
    let rows = queues.iter().map(|q| {
        let i = &q.info;
        let (done, failed) = model
            .rates(&i.name)
            .map_or(("-".into(), "-".into()), |(d, f)| {
                (format!("{d:.1}"), format!("{f:.1}"))
            });
        Row::new(vec![
            i.name.clone(),
            i.ready.to_string(),
            i.delayed.to_string(),
            i.waiting.to_string(),
            i.blocked.to_string(),
            i.leased.to_string(),
            i.dead.to_string(),
            i.oldest_ready_age_secs.map_or("-".into(), age),
            done,
            failed,
            format!("{}/{}", i.workers_busy, i.workers_total),
            if i.paused { "yes" } else { "no" }.into(),
        ])
    });
    let widths = [
        Constraint::Min(12),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(9),
        Constraint::Length(13),
        Constraint::Length(6),
    ];
    Table::new(rows, widths)
        .header(Row::new(header).style(bold()))
        .block(Block::default().borders(Borders::ALL).title(" queues "))
        .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED))
        .highlight_symbol("> ")
}

fn tenant_table<'a>(info: &'a TopInfo, queue: Option<&str>) -> Table<'a> {
    let rows = info.tenants.iter().map(|t| {
        Row::new(vec![
            t.tenant.clone(),
            t.ready.to_string(),
            t.delayed.to_string(),
            t.waiting.to_string(),
            t.blocked.to_string(),
            t.leased.to_string(),
            t.dead.to_string(),
        ])
    });
    let widths = [
        Constraint::Length(24),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Fill(1),
    ];
    let title = format!(" tenants of {} ", queue.unwrap_or("-"));
    Table::new(rows, widths)
        .header(
            Row::new([
                "TENANT", "READY", "DELAYED", "WAITING", "BLOCKED", "LEASED", "DLQ",
            ])
            .style(bold()),
        )
        .block(Block::default().borders(Borders::ALL).title(title))
}

#[cfg(test)]
mod tests {
    use super::*;
    use qd_proto::{QueueInfo, TenantCounts};
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    fn queue(name: &str, completed: u64, failed: u64) -> TopQueue {
        TopQueue {
            info: QueueInfo {
                name: name.into(),
                ready: 12,
                delayed: 3,
                leased: 2,
                dead: 1,
                oldest_ready_age_secs: Some(192.0),
                workers_busy: 2,
                workers_total: 4,
                workers_min: 1,
                workers_max: 16,
                paused: false,
                waiting: 41,
                blocked: 17,
            },
            completed_total: completed,
            failed_total: failed,
        }
    }

    fn info(completed: u64, failed: u64) -> TopInfo {
        TopInfo {
            queues: vec![queue("email", completed, failed), queue("thumbs", 0, 0)],
            tenants: vec![TenantCounts {
                tenant: "acme".into(),
                ready: 7,
                waiting: 23,
                blocked: 19,
                ..TenantCounts::default()
            }],
        }
    }

    fn screen(model: &Model) -> String {
        let mut terminal = Terminal::new(TestBackend::new(110, 16)).expect("terminal");
        terminal.draw(|f| draw(f, model)).expect("draw");
        let buffer = terminal.backend().buffer();
        let width = buffer.area.width as usize;
        buffer
            .content
            .chunks(width)
            .map(|row| row.iter().map(|c| c.symbol()).collect::<String>() + "\n")
            .collect()
    }

    #[test]
    fn rates_are_counter_differences_over_the_time_between_readings() {
        let t0 = Instant::now();
        let mut m = Model::new(Duration::from_secs(1));
        m.update(info(100, 10), t0);
        assert_eq!(m.rates("email"), None, "one reading has no rate");
        m.update(info(120, 14), t0 + Duration::from_secs(2));
        assert_eq!(m.rates("email"), Some((10.0, 2.0)));
        for s in 3..=20 {
            m.update(info(120 + 10 * (s - 2), 14), t0 + Duration::from_secs(s));
        }
        let (done, failed) = m.rates("email").expect("rates");
        assert!(
            (done - 10.0).abs() < 1e-9 && failed == 0.0,
            "{done} {failed}"
        );
        assert!(m.samples["email"].len() <= 12, "old samples are dropped");
    }

    #[test]
    fn the_selection_stays_within_the_queues_and_names_the_tenant_query() {
        let mut m = Model::new(Duration::from_secs(1));
        assert_eq!(m.selected_queue(), None);
        m.update(info(0, 0), Instant::now());
        assert_eq!(m.selected_queue(), Some("email"));
        m.select(-1);
        assert_eq!(m.selected_queue(), Some("email"));
        m.select(1);
        m.select(1);
        assert_eq!(m.selected_queue(), Some("thumbs"));
    }

    #[test]
    fn a_frame_shows_every_queue_its_counts_rates_and_the_selected_tenants() {
        let t0 = Instant::now();
        let mut m = Model::new(Duration::from_secs(1));
        m.update(info(100, 10), t0);
        m.update(info(105, 11), t0 + Duration::from_secs(1));
        let text = screen(&m);
        for want in [
            "> email",
            "thumbs",
            "3m12s",
            "5.0",
            "1.0",
            "2/4",
            "tenants of email",
            "acme",
            "q quits",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
        // Waiting and blocked jobs (`after`) have their own columns, per queue
        // and per tenant, in that order after DELAYED.
        let line = |start: &str| {
            text.lines()
                .find(|l| l.contains(start))
                .unwrap_or_else(|| panic!("no line with {start:?} in:\n{text}"))
                .split_whitespace()
                .filter(|w| w.chars().all(|c| c.is_ascii_digit()))
                .map(String::from)
                .collect::<Vec<_>>()
        };
        let header = text.lines().find(|l| l.contains("QUEUE")).expect("header");
        assert!(header.contains("DELAYED  WAITING  BLOCKED"), "{header}");
        assert_eq!(line("> email")[..4], ["12", "3", "41", "17"], "{text}");
        assert_eq!(line("acme")[..4], ["7", "0", "23", "19"], "{text}");
    }
}
