//! `qctl top`: a live full-screen view of qd (ratatui on crossterm). Every
//! `--interval` it sends one `top` request over the admin socket, for the selected
//! queue's tenants, and redraws; Up/Down (or k/j) move the selection, q, Esc or
//! Ctrl-C quit. The terminal is restored on every way out (also on a panic, through
//! ratatui's hook). Outside a terminal it refuses with a usage error (exit 2).

mod view;

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use qd_proto::{Request, Response, TopInfo};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};

use crate::client::{CliError, Client};
use crate::commands::unexpected;
use view::Model;

/// Runs the view until the user quits; errors (the daemon went away) end it with
/// the terminal restored.
pub fn run(
    interval: Duration,
    connect: impl FnOnce() -> Result<Client, CliError>,
) -> Result<(), CliError> {
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        return Err(CliError::Usage(
            "qctl top needs a terminal; in scripts use `qctl queues --json`".into(),
        ));
    }
    let mut client = connect()?;
    let first = fetch(&mut client, None)?;
    let mut terminal = ratatui::try_init()
        .map_err(|e| CliError::Usage(format!("cannot set up the terminal: {e}")))?;
    let _restore = Restore;
    let mut model = Model::new(interval);
    model.update(first, Instant::now());
    loop {
        terminal
            .draw(|f| view::draw(f, &model))
            .map_err(|e| CliError::Protocol(format!("cannot draw: {e}")))?;
        match wait_for_key(interval)? {
            Key::Quit => return Ok(()),
            Key::Move(step) => model.select(step),
            Key::None => {}
        }
        let selected = model.selected_queue().map(str::to_owned);
        model.update(fetch(&mut client, selected)?, Instant::now());
    }
}

/// Leaves raw mode and the alternate screen when `run` returns, however it returns.
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

fn fetch(client: &mut Client, tenants_of: Option<String>) -> Result<TopInfo, CliError> {
    match client.call(Request::Top { tenants_of })? {
        Response::Top(info) => Ok(info),
        other => Err(unexpected(&other, "top")),
    }
}

/// What the user asked for while we waited.
enum Key {
    Quit,
    Move(isize),
    None,
}

/// Waits up to `interval` for a key that means something; returns early on one.
fn wait_for_key(interval: Duration) -> Result<Key, CliError> {
    let deadline = Instant::now() + interval;
    let failed = |e: std::io::Error| CliError::Protocol(format!("cannot read the terminal: {e}"));
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || !event::poll(left).map_err(failed)? {
            return Ok(Key::None);
        }
        let Event::Key(key) = event::read().map_err(failed)? else {
            continue;
        };
        if key.kind != KeyEventKind::Press {
            continue;
        }
        let ctrl_c =
            key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL);
        match key.code {
            KeyCode::Char('q') | KeyCode::Esc => return Ok(Key::Quit),
            _ if ctrl_c => return Ok(Key::Quit),
            KeyCode::Up | KeyCode::Char('k') => return Ok(Key::Move(-1)),
            KeyCode::Down | KeyCode::Char('j') => return Ok(Key::Move(1)),
            _ => {}
        }
    }
}
