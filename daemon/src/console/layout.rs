//! The frame every console page shares (header, navigation, who is signed in,
//! notice), the error page and the login form. Pages, sessions and the live
//! overview all render through it; it imports none of them.

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};

use super::Ctx;
use super::who::Who;

/// Percent-encodes `text` for a query string value.
pub fn query_escape(text: &str) -> String {
    serde_urlencoded::to_string([("", text)])
        .map(|s| s.trim_start_matches('=').to_string())
        .unwrap_or_default()
}

pub(super) fn page(
    ctx: &Ctx,
    who: Option<&Who>,
    title: &str,
    notice: Option<&str>,
    body: Markup,
) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { "qd · " (title) }
                link rel="stylesheet" href=(ctx.url("/static/console.css"));
                script src=(ctx.url("/static/console.js")) defer {}
            }
            body {
                header {
                    nav {
                        a href=(ctx.url("/")) { "Overview" }
                        a href=(ctx.url("/jobs")) { "Jobs" }
                        a href=(ctx.url("/dlq")) { "Dead letters" }
                        a href=(ctx.url("/limits")) { "Limits" }
                        @if ctx.daemon.config().daemon.database.is_some() {
                            a href=(ctx.url("/cluster")) { "Cluster" }
                        }
                    }
                    @if let Some(who) = who {
                        div class="who" {
                            @match &who.name {
                                Some(name) => { "Signed in as " b { (name) } @if !who.admin { " (read only)" } }
                                None => { "Open console (loopback, no token file)" }
                            }
                            @if who.name.is_some() {
                                form method="post" action=(ctx.url("/logout")) class="inline" {
                                    button type="submit" { "Log out" }
                                }
                            }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    @if let Some(n) = notice {
                        p class="notice" role="status" { (n) }
                    }
                    (body)
                }
            }
        }
    }
}

pub(super) fn respond(status: StatusCode, markup: Markup) -> Response {
    (status, Html(markup.into_string())).into_response()
}

/// An error page with `status` and a message.
pub fn error_page(ctx: &Ctx, status: StatusCode, message: &str) -> Response {
    let title = status.canonical_reason().unwrap_or("Error");
    respond(
        status,
        page(
            ctx,
            None,
            title,
            None,
            html! { p class="error" { (message) } },
        ),
    )
}

/// The status that answers an admin error.
pub(super) fn admin_status(e: &qd_proto::ErrorBody) -> StatusCode {
    use qd_proto::ErrorCode as C;
    match e.code {
        C::NotFound => StatusCode::NOT_FOUND,
        C::BadRequest => StatusCode::BAD_REQUEST,
        C::Conflict => StatusCode::CONFLICT,
        C::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The answer to an admin error: its code as a status, its message on the page.
pub fn admin_error(ctx: &Ctx, e: &qd_proto::ErrorBody) -> Response {
    error_page(ctx, admin_status(e), &e.message)
}

/// The login form; `failed` says why the last try was refused.
pub fn login(ctx: &Ctx, failed: Option<&str>, status: StatusCode) -> Response {
    let body = html! {
        @if let Some(why) = failed { p class="error" { "Login refused: " (why) } }
        form method="post" action=(ctx.url("/login")) {
            label { "API token " input type="password" name="token" autocomplete="off" required; }
            button type="submit" { "Log in" }
        }
        p { "Use a token from daemon.api_tokens_file with the read role (look) or the admin role (act)." }
    };
    respond(status, page(ctx, None, "Log in", None, body))
}
