//! Which requests a web page may not make: the cross-site check and the `Host`
//! allow-list, shared by the HTTP API and the console.
//!
//! A page on another origin, open in a browser on the operator's machine, can send
//! a `POST` to a loopback port without a preflight (`mode: "no-cors"`), and through
//! DNS rebinding it can make its own name resolve to 127.0.0.1. Two checks close
//! both, using only headers the browser sets and a page cannot forge:
//!
//! - [`cross_origin`]: the algorithm of Go 1.25's `net/http.CrossOriginProtection`.
//!   `GET`, `HEAD` and `OPTIONS` pass. Otherwise `Sec-Fetch-Site` decides when
//!   present (`same-origin` and `none` pass, anything else is refused); without it,
//!   an `Origin` whose host differs from `Host` is refused. A request with neither
//!   header (curl, SDKs, workers) is not from a browser page and passes.
//! - [`HostAllow`]: the `Host` must name this listener (its address, or
//!   `localhost`, `127.0.0.1`, `[::1]` with its port) or a configured name; a
//!   rebinding page sends its own name, so it is answered `421 Misdirected Request`.

use std::net::SocketAddr;

use axum::http::{HeaderMap, Method, header};

/// Why [`cross_origin`] refused a request (said in the 403's message).
#[derive(Debug, PartialEq, Eq)]
pub enum CrossOrigin {
    /// `Sec-Fetch-Site` was `cross-site` or `same-site` (or another value).
    FetchSite(String),
    /// No `Sec-Fetch-Site`, and `Origin` does not match `Host`.
    Origin(String),
}

impl std::fmt::Display for CrossOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CrossOrigin::FetchSite(site) => write!(
                f,
                "cross-site request refused (Sec-Fetch-Site: {site}); \
                 a web page on another origin may not call qd"
            ),
            CrossOrigin::Origin(origin) => write!(
                f,
                "cross-origin request refused (Origin {origin} does not match Host); \
                 a web page on another origin may not call qd"
            ),
        }
    }
}

/// Go 1.25's `CrossOriginProtection.Check`, without trusted origins or bypasses.
///
/// # Errors
/// [`CrossOrigin`] naming the header that showed the request came from another site.
pub fn cross_origin(method: &Method, headers: &HeaderMap) -> Result<(), CrossOrigin> {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return Ok(());
    }
    let text = |name: &str| {
        headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()))
    };
    match text("sec-fetch-site").as_deref() {
        Some("same-origin" | "none") => return Ok(()),
        Some(other) => return Err(CrossOrigin::FetchSite(other.to_string())),
        None => {}
    }
    let Some(origin) = text(header::ORIGIN.as_str()) else {
        return Ok(());
    };
    let host = text(header::HOST.as_str()).unwrap_or_default();
    if origin_host(&origin).is_some_and(|o| o == host) {
        Ok(())
    } else {
        Err(CrossOrigin::Origin(origin.into_owned()))
    }
}

/// The `host[:port]` of a serialized origin (`scheme://host[:port]`), as Go's
/// `url.Parse(origin).Host` gives it; `None` for `null` or anything unparsable.
fn origin_host(origin: &str) -> Option<&str> {
    let (_, rest) = origin.split_once("://")?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    (!host.is_empty() && !host.contains('@')).then_some(host)
}

/// The `Host` values a listener answers; anything else gets `421`.
#[derive(Clone, Debug)]
pub struct HostAllow {
    /// `host:port` accepted exactly (lower case).
    exact: Vec<String>,
    /// Configured names given without a port: accepted with any port.
    any_port: Vec<String>,
    /// A wildcard listener (`0.0.0.0`, `[::]`) with no configured names: it has no
    /// name of its own to check against, so every `Host` passes (such a listener
    /// needs a token file, which a rebinding page cannot present).
    open: bool,
}

impl HostAllow {
    /// The allow-list of a listener bound at `listen` (the address as configured,
    /// so port 0 means "whatever port was bound", taken from `bound`), plus
    /// `configured` names (`name` or `name:port`).
    pub fn new(listen: SocketAddr, bound: SocketAddr, configured: &[String]) -> HostAllow {
        let port = bound.port();
        let mut exact = vec![
            format!("localhost:{port}"),
            format!("127.0.0.1:{port}"),
            format!("[::1]:{port}"),
            SocketAddr::new(bound.ip(), port).to_string(),
        ];
        let mut any_port = Vec::new();
        for name in configured {
            let name = name.to_ascii_lowercase();
            if has_port(&name) {
                exact.push(name);
            } else {
                any_port.push(name);
            }
        }
        // Port 80 is left out of `Host` by browsers and clients alike.
        if port == 80 {
            exact.extend(["localhost", "127.0.0.1", "[::1]"].map(String::from));
            exact.push(bound.ip().to_string());
        }
        HostAllow {
            open: listen.ip().is_unspecified() && configured.is_empty(),
            exact,
            any_port,
        }
    }

    /// True when `host` (a `Host` header value) names this listener.
    pub fn allows(&self, host: Option<&str>) -> bool {
        if self.open {
            return true;
        }
        let Some(host) = host else { return false };
        let host = host.trim().to_ascii_lowercase();
        let host = host.strip_suffix('.').unwrap_or(&host);
        if self.exact.iter().any(|h| h == host) {
            return true;
        }
        let name = if has_port(host) {
            host.rsplit_once(':').map_or(host, |(n, _)| n)
        } else {
            host
        };
        self.any_port.iter().any(|h| h == name)
    }
}

/// True when `host` ends in `:PORT` (an IPv6 literal's colons are inside `[...]`).
fn has_port(host: &str) -> bool {
    match host.rsplit_once(':') {
        Some((name, port)) => {
            !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && (!name.starts_with('[') || name.ends_with(']'))
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    /// The cases of Go's `TestCrossOriginProtectionSecFetchSite`.
    #[test]
    fn cross_origin_follows_go_cross_origin_protection() {
        let post = Method::POST;
        let host = ("host", "example.com");
        let pass = |h: &[(&'static str, &'static str)]| cross_origin(&post, &headers(h));
        assert!(pass(&[host, ("sec-fetch-site", "same-origin")]).is_ok());
        assert!(pass(&[host, ("sec-fetch-site", "none")]).is_ok());
        assert!(pass(&[host, ("sec-fetch-site", "cross-site")]).is_err());
        assert!(pass(&[host, ("sec-fetch-site", "same-site")]).is_err());
        assert!(pass(&[host]).is_ok(), "no header, no origin: not a browser");
        assert!(pass(&[host, ("origin", "https://example.com")]).is_ok());
        assert_eq!(
            pass(&[host, ("origin", "https://attacker.example")]),
            Err(CrossOrigin::Origin("https://attacker.example".into()))
        );
        assert!(pass(&[host, ("origin", "null")]).is_err());
        // Sec-Fetch-Site wins over a matching Origin.
        assert!(
            pass(&[
                host,
                ("sec-fetch-site", "cross-site"),
                ("origin", "https://example.com")
            ])
            .is_err()
        );
        for safe in [Method::GET, Method::HEAD, Method::OPTIONS] {
            let h = headers(&[host, ("sec-fetch-site", "cross-site")]);
            assert!(cross_origin(&safe, &h).is_ok(), "{safe} is safe");
        }
        let put = headers(&[host, ("sec-fetch-site", "cross-site")]);
        assert!(cross_origin(&Method::PUT, &put).is_err());
    }

    #[test]
    fn the_host_must_name_the_listener_or_a_configured_name() {
        let addr: SocketAddr = "127.0.0.1:7070".parse().expect("addr");
        let allow = HostAllow::new(addr, addr, &["qd.example.com".into(), "ops:8443".into()]);
        for ok in [
            "127.0.0.1:7070",
            "localhost:7070",
            "LOCALHOST:7070",
            "[::1]:7070",
            "qd.example.com",
            "qd.example.com:9999",
            "ops:8443",
        ] {
            assert!(allow.allows(Some(ok)), "{ok}");
        }
        for bad in [
            "attacker.example:7070",
            "localhost:7071",
            "localhost",
            "ops:8444",
            "ops",
            "",
        ] {
            assert!(!allow.allows(Some(bad)), "{bad}");
        }
        assert!(!allow.allows(None), "HTTP/1.1 needs a Host");
    }

    #[test]
    fn a_wildcard_listener_without_names_takes_any_host_and_port_0_uses_the_bound_port() {
        let any: SocketAddr = "0.0.0.0:7070".parse().expect("addr");
        assert!(HostAllow::new(any, any, &[]).allows(Some("10.0.0.5:7070")));
        let named = HostAllow::new(any, any, &["qd.internal".into()]);
        assert!(!named.allows(Some("10.0.0.5:7070")));
        assert!(named.allows(Some("qd.internal:7070")));
        let zero: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        let bound: SocketAddr = "127.0.0.1:41234".parse().expect("addr");
        assert!(HostAllow::new(zero, bound, &[]).allows(Some("localhost:41234")));
    }
}
