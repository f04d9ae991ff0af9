//! Who may call what: bearer tokens with roles, and THE table of each route's minimum role.
//!
//! A daemon configured with [`Tokens`] checks every request ([`middleware`]): the token comes
//! from `Authorization: Bearer` on `/api/*` and from `X-Retrace-Token` on `/proxy/*`, where
//! `Authorization` and `x-api-key` belong to the provider and pass through unchecked. A missing
//! or unknown token is 401, a role below the route's minimum ([`required`]) is 403: JSON on the
//! API, the provider's error shape (with `x-should-retry: false`) on the proxy. A daemon with no
//! tokens (the loopback default, the one `record` and `replay` embed) lets everything through.
//!
//! Roles are ordered: `viewer` < `debugger` < `admin`. [`ROUTES`] is the one rule set; the web
//! UI asks [`allows`] with the same method and route, so the two can't disagree.
use std::fmt;
use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use retrace_core::Digest;
use serde_json::json;

use crate::proxy::reply::{self, Provider};
use crate::AppState;

mod tokens;

pub use tokens::{Holder, Tokens, TokensError, MAX_NAME_LEN};

/// What a token may do; each role may do everything the roles below it may.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Reads masked data: runs, events, blobs, exports.
    Viewer,
    /// A viewer who also records, replays and forks: runs, the SDK's step routes, the proxy.
    Debugger,
    /// A debugger who also reveals masked values and runs retention and garbage collection.
    Admin,
}

impl Role {
    /// `viewer`, `debugger` or `admin`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Debugger => "debugger",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Role, String> {
        match s {
            "viewer" => Ok(Role::Viewer),
            "debugger" => Ok(Role::Debugger),
            "admin" => Ok(Role::Admin),
            other => Err(format!("unknown role {other:?} (roles: viewer, debugger, admin)")),
        }
    }
}

/// What a route needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Anyone, token or not.
    Open,
    /// A token of at least this role.
    AtLeast(Role),
}

/// Every route of the router with its method (`*` for any) and what it needs. A test checks that
/// it names every route `router` serves.
pub const ROUTES: &[(&str, &str, Access)] = &[
    ("GET", "/api/health", Access::Open),
    ("GET", "/api/openapi.json", Access::Open),
    ("GET", "/api/runs", Access::AtLeast(Role::Viewer)),
    ("POST", "/api/runs", Access::AtLeast(Role::Debugger)),
    ("GET", "/api/runs/{run}", Access::AtLeast(Role::Viewer)),
    ("GET", "/api/runs/{run}/events", Access::AtLeast(Role::Viewer)),
    ("GET", "/api/runs/{run}/export", Access::AtLeast(Role::Viewer)),
    ("GET", "/api/blobs/{*digest}", Access::AtLeast(Role::Viewer)),
    ("POST", "/api/runs/{run}/replay", Access::AtLeast(Role::Debugger)),
    ("POST", "/api/runs/{run}/finish", Access::AtLeast(Role::Debugger)),
    ("POST", "/api/runs/{run}/agents/{agent}/steps", Access::AtLeast(Role::Debugger)),
    ("POST", "/api/runs/{run}/agents/{agent}/send", Access::AtLeast(Role::Debugger)),
    ("POST", "/api/runs/{run}/agents/{agent}/recv", Access::AtLeast(Role::Debugger)),
    ("POST", "/api/runs/{run}/agents/{agent}/decide", Access::AtLeast(Role::Debugger)),
    ("POST", "/api/runs/{run}/agents/{agent}/template", Access::AtLeast(Role::Debugger)),
    ("POST", "/api/runs/{run}/agents/{agent}/exit", Access::AtLeast(Role::Debugger)),
    ("POST", "/api/runs/{run}/agents/{agent}/role", Access::AtLeast(Role::Debugger)),
    ("POST", "/api/runs/{run}/agents/{agent}/claim", Access::AtLeast(Role::Debugger)),
    ("POST", "/api/runs/{run}/retain", Access::AtLeast(Role::Admin)),
    ("POST", "/api/gc", Access::AtLeast(Role::Admin)),
    ("POST", "/api/runs/{run}/delete", Access::AtLeast(Role::Admin)),
    // Any role may ask, so that the handler audits a refused attempt (`admin::vault`).
    ("POST", "/api/vault/reveal", Access::AtLeast(Role::Viewer)),
    ("GET", "/api/vault/audit", Access::AtLeast(Role::Admin)),
    ("*", "/proxy/openai/v1/{*rest}", Access::AtLeast(Role::Debugger)),
    ("*", "/proxy/anthropic/{*rest}", Access::AtLeast(Role::Debugger)),
    ("*", "/proxy/run/{run}/agent/{agent}/openai/v1/{*rest}", Access::AtLeast(Role::Debugger)),
    ("*", "/proxy/run/{run}/agent/{agent}/anthropic/{*rest}", Access::AtLeast(Role::Debugger)),
];

/// What `method` on `route` (the router's pattern, such as `/api/runs/{run}`) needs. A route
/// or method the table doesn't name (a 404 or 405 to be) needs a valid token of any role, so a
/// caller without one learns nothing about what is served.
pub fn required(method: &Method, route: Option<&str>) -> Access {
    // HEAD is answered by the GET handler, so it needs what GET needs.
    let method = if method == Method::HEAD { &Method::GET } else { method };
    let found = route.and_then(|route| {
        ROUTES.iter().find(|(m, r, _)| *r == route && (*m == "*" || *m == method.as_str()))
    });
    found.map_or(Access::AtLeast(Role::Viewer), |(_, _, access)| *access)
}

/// Whether `role` (or no token, `None`) may call `method` on `route`.
pub fn allows(role: Option<Role>, method: &Method, route: Option<&str>) -> bool {
    match required(method, route) {
        Access::Open => true,
        Access::AtLeast(min) => role.is_some_and(|role| role >= min),
    }
}

/// A daemon reachable beyond this machine with no tokens would hand anyone on the network the
/// recorded data and the proxy; it is refused.
#[derive(Debug, thiserror::Error)]
#[error(
    "refusing to serve on {addr} without tokens: anyone who can reach it could read every run and \
     use the proxy. Listen on a loopback address (127.0.0.1, ::1), or configure tokens with \
     RETRACE_SERVE_TOKENS=role:TOKEN,... or --tokens FILE"
)]
pub struct OpenExposure {
    /// The non-loopback address.
    pub addr: std::net::SocketAddr,
}

/// Refuses to listen on any address in `addrs` that is not loopback unless `tokens` are set.
pub fn check_exposure(addrs: &[std::net::SocketAddr], tokens: &Tokens) -> Result<(), OpenExposure> {
    match addrs.iter().find(|a| !a.ip().is_loopback()) {
        Some(addr) if tokens.is_empty() => Err(OpenExposure { addr: *addr }),
        _ => Ok(()),
    }
}

/// Checks each request's token against the route's minimum role (see the module doc). A request
/// let through on a token carries its [`Holder`] in its extensions, for handlers that record
/// who asked (the vault's audit log).
pub async fn middleware(State(app): State<Arc<AppState>>, mut request: Request, next: Next) -> Response {
    let tokens = &app.config.tokens;
    if tokens.is_empty() {
        return next.run(request).await;
    }
    let route = request.extensions().get::<MatchedPath>().map(|m| m.as_str().to_owned());
    let access = required(request.method(), route.as_deref());
    let Access::AtLeast(min) = access else {
        return next.run(request).await;
    };
    let path = request.uri().path();
    let proxy = path.starts_with("/proxy/");
    let presented = if proxy { proxy_token(request.headers()) } else { bearer(request.headers()) };
    let denied = match presented.map(|t| tokens.holder_of(t)) {
        None => Denied::Missing { proxy },
        Some(None) => Denied::Unknown,
        Some(Some(holder)) if holder.role < min => Denied::Role { role: holder.role, min },
        Some(Some(holder)) => {
            request.extensions_mut().insert(holder);
            return next.run(request).await;
        }
    };
    if route.as_deref() == Some("/api/vault/reveal")
        && matches!(denied, Denied::Missing { .. } | Denied::Unknown)
    {
        audit_unauthenticated_reveal(&app, &denied, request).await;
        return denied.api_reply();
    }
    match proxy {
        true => denied.proxy_reply(provider_of(path)),
        false => denied.api_reply(),
    }
}

/// A reveal attempt with no token, or one no role holds, is in the audit log too (QA38 S1:
/// only token holders' attempts were, so a probe with a guessed or revoked token left no
/// trace): who says which, and the subject is the token asked for, if the body names one. The
/// reason is not kept: nobody vouched for it. A log that can't be written leaves the 401 as it
/// is.
async fn audit_unauthenticated_reveal(app: &AppState, denied: &Denied, request: Request) {
    use retrace_store::vault::{AuditAction, AuditEntry};
    let body = axum::body::to_bytes(request.into_body(), 64 << 10).await.unwrap_or_default();
    let asked = serde_json::from_slice::<serde_json::Value>(&body).ok();
    let subject = match asked.as_ref().and_then(|v| v.get("token")?.as_str()) {
        Some(token) => retrace_store::vault::audit_subject(token),
        None => "(no token named)".to_owned(),
    };
    let who = match denied {
        Denied::Missing { .. } => "(no api token)",
        _ => "(an unknown api token)",
    };
    let entry = AuditEntry {
        at_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        who: who.into(),
        role: "none".into(),
        action: AuditAction::RevealRefused,
        subject,
        reason: String::new(),
        outcome: "no valid api token (401)".into(),
    };
    let store = app.host.store().clone();
    let _ = tokio::task::spawn_blocking(move || store.audit_append(&entry)).await;
}

/// The token of an API request: `Authorization: Bearer TOKEN`.
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get("authorization")?.as_bytes();
    let scheme = value.get(..7)?;
    scheme.eq_ignore_ascii_case(b"bearer ").then(|| value[7..].trim_ascii())
}

/// The token of a proxied call: `X-Retrace-Token: TOKEN` (never the provider's own headers).
fn proxy_token(headers: &HeaderMap) -> Option<&[u8]> {
    headers.get("x-retrace-token").map(|v| v.as_bytes().trim_ascii())
}

fn provider_of(path: &str) -> Provider {
    if path.contains("/anthropic/") {
        Provider::Anthropic
    } else {
        Provider::OpenAi
    }
}

/// Why a request was turned away.
enum Denied {
    Missing { proxy: bool },
    Unknown,
    Role { role: Role, min: Role },
}

impl Denied {
    fn status(&self) -> StatusCode {
        match self {
            Denied::Missing { .. } | Denied::Unknown => StatusCode::UNAUTHORIZED,
            Denied::Role { .. } => StatusCode::FORBIDDEN,
        }
    }

    fn message(&self) -> String {
        match self {
            Denied::Missing { proxy: false } => {
                "this daemon needs a token: send Authorization: Bearer $RETRACE_TOKEN".into()
            }
            Denied::Missing { proxy: true } => "this daemon needs a token: send X-Retrace-Token: \
                 $RETRACE_TOKEN (Authorization and x-api-key go to the provider)"
                .into(),
            Denied::Unknown => "the token is not one this daemon knows".into(),
            Denied::Role { role, min } => format!("this needs the {min} role; the token's role is {role}"),
        }
    }

    fn api_reply(&self) -> Response {
        let code = match self {
            Denied::Role { .. } => "forbidden",
            _ => "unauthorized",
        };
        let body = json!({"error": {"code": code, "message": self.message()}});
        let mut response = (self.status(), Json(body)).into_response();
        if self.status() == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert("www-authenticate", HeaderValue::from_static("Bearer"));
        }
        response
    }

    fn proxy_reply(&self, provider: Provider) -> Response {
        reply::error(provider, self.status(), &format!("retrace proxy: {}", self.message()))
    }
}

/// `a == b` in time that depends only on their lengths, never on where they differ.
fn same_digest(a: &Digest, b: &Digest) -> bool {
    let diff = a.as_bytes().iter().zip(b.as_bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table names every route the router serves, and only those.
    #[test]
    fn the_table_names_exactly_the_routes_served() {
        let source = include_str!("lib.rs");
        let mut served: Vec<&str> =
            source.split(".route(\"").skip(1).filter_map(|rest| rest.split('"').next()).collect();
        served.sort();
        served.dedup();
        let mut listed: Vec<&str> = ROUTES.iter().map(|(_, route, _)| *route).collect();
        listed.sort();
        listed.dedup();
        assert_eq!(served, listed);
    }

    #[test]
    fn roles_are_ordered_and_the_table_is_applied() {
        let get = Method::GET;
        let post = Method::POST;
        assert!(allows(None, &get, Some("/api/health")));
        assert!(!allows(None, &get, Some("/api/runs")));
        assert!(allows(Some(Role::Viewer), &get, Some("/api/runs")));
        assert!(!allows(Some(Role::Viewer), &post, Some("/api/runs")));
        assert!(allows(Some(Role::Debugger), &post, Some("/api/runs")));
        assert!(allows(Some(Role::Admin), &post, Some("/proxy/anthropic/{*rest}")));
        // The router lets any token ask for an original; the handler refuses and audits it.
        assert!(allows(Some(Role::Viewer), &post, Some("/api/vault/reveal")));
        assert!(!allows(None, &post, Some("/api/vault/reveal")));
        assert!(!allows(Some(Role::Debugger), &get, Some("/api/vault/audit")));
        assert!(allows(Some(Role::Admin), &post, Some("/api/gc")));
        assert!(!allows(Some(Role::Debugger), &Method::HEAD, Some("/api/vault/audit")));
        assert!(!allows(None, &Method::DELETE, Some("/api/runs")));
        assert!(allows(Some(Role::Viewer), &Method::DELETE, Some("/api/runs")));
        assert!(allows(None, &Method::HEAD, Some("/api/health")));
        assert!(!allows(None, &Method::HEAD, Some("/api/runs/{run}/export")));
        assert!(!allows(None, &get, None));
    }

    #[test]
    fn bearer_tokens_are_read_from_their_own_header_only() {
        let mut headers = HeaderMap::new();
        headers.insert("authorization", HeaderValue::from_static("Bearer  abc "));
        assert_eq!(bearer(&headers), Some(&b"abc"[..]));
        assert_eq!(proxy_token(&headers), None);
        headers.insert("authorization", HeaderValue::from_static("Basic abc"));
        assert_eq!(bearer(&headers), None);
        headers.insert("x-retrace-token", HeaderValue::from_static("t1"));
        assert_eq!(proxy_token(&headers), Some(&b"t1"[..]));
    }
}
