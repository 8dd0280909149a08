//! Who a console request is from, as the session layer established it: the
//! token's name and whether it may act. Every page and action reads it; it
//! imports nothing of the console, so the layout can show it.

use axum::http::StatusCode;

/// Who a request is from.
#[derive(Clone, Debug)]
pub struct Who {
    /// The token's name; `None` on an open console (no token file).
    pub name: Option<String>,
    /// May act (role `admin`, or an open console).
    pub admin: bool,
    /// The session id, if logged in (for logout).
    pub(super) session: Option<String>,
}

impl Who {
    /// The overview's sampler: reads only, so it never writes an audit line.
    pub fn sampler() -> Who {
        Who {
            name: Some("sampler".into()),
            admin: false,
            session: None,
        }
    }

    /// 403 unless this caller may act.
    pub fn require_admin(&self) -> Result<(), (StatusCode, String)> {
        if self.admin {
            Ok(())
        } else {
            Err((
                StatusCode::FORBIDDEN,
                format!(
                    "token {:?} has the read role only; actions need a token with the admin role",
                    self.name.as_deref().unwrap_or("")
                ),
            ))
        }
    }
}
