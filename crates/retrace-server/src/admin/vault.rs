//! `POST /api/vault/reveal` and `GET /api/vault/audit`: `retrace vault reveal` and `retrace
//! vault audit` over HTTP, through the same [`retrace_store::vault::reveal`], which writes the
//! audit entry (refusals included) before it answers.
//!
//! The audit entry names the caller: the name the tokens file gives their token (`admin TOKEN
//! alice`), else `api token sha256:…` (the start of the token's digest, which tells tokens
//! apart without revealing them), else, on a daemon without tokens, `api`; and their role (a
//! daemon without tokens lets everyone act as admin).
//!
//! Any token may ask, so that every attempt is audited: one whose role is below `admin` is
//! refused (403) here, after its attempt is in the log, rather than by the router, which would
//! leave no trace of a lower-privileged token probing for originals.
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use base64::Engine as _;
use retrace_store::vault::{
    reveal as reveal_original, AuditAction, AuditEntry, Reveal, RevealError, Revealer,
};
use retrace_store::StoreErrorKind;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{answer, blocking, now_ms, required_body, AdminError};
use crate::auth::{Holder, Role};
use crate::AppState;

/// Who the audit log names when the caller's token has no name, or there are no tokens.
pub const ANONYMOUS: &str = "api";

/// The body of `POST /api/vault/reveal`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RevealBody {
    token: String,
    /// Missing is an empty reason: refused, and audited as such.
    #[serde(default)]
    reason: String,
}

/// The audit log's subject for a refused request whose body is not a reveal body.
const NOT_A_BODY: &str = "(a request that is not a reveal body)";

/// `POST /api/vault/reveal`: the original of a token, under the daemon's vault key.
pub async fn reveal(
    State(app): State<Arc<AppState>>,
    holder: Option<Extension<Holder>>,
    body: Bytes,
) -> Response {
    let holder = holder.map(|Extension(h)| h);
    let below_admin = holder.as_ref().map(|h| h.role).filter(|role| *role < Role::Admin);
    // A caller below admin is refused whatever the body (and audited with what of it reads):
    // a malformed request is no way round the role, nor round the audit log (QA10 D6).
    let body: RevealBody = match (required_body(&body), below_admin) {
        (Ok(body), _) => body,
        (Err(_), Some(_)) => {
            let read = serde_json::from_slice::<serde_json::Value>(&body).ok();
            let field = |name: &str| read.as_ref().and_then(|v| v.get(name)?.as_str().map(str::to_owned));
            RevealBody {
                token: field("token").unwrap_or_else(|| NOT_A_BODY.into()),
                reason: field("reason").unwrap_or_default(),
            }
        }
        (Err(e), None) => return e.into_response(),
    };
    let by = revealer(holder);
    // The reason goes into the audit log: masked like anything persisted (it may quote the
    // incident: a customer's email, a key).
    let mut body = body;
    if let Ok(masker) =
        retrace_runtime::masking::masker(app.config.mask_rules.clone(), app.config.mask_key.as_ref())
    {
        body.reason = masker.mask_text(&body.reason).0.into_owned();
    }
    let key = app.config.vault_key.as_ref().map(|k| k.to_base64());
    let store = app.host.store().clone();
    answer(
        blocking(move || {
            if let Some(role) = below_admin {
                let outcome = format!("this needs the admin role; the token's role is {}", role.as_str());
                store
                    .audit_append(&AuditEntry {
                        at_ms: now_ms(),
                        who: by.who,
                        role: by.role,
                        action: AuditAction::RevealRefused,
                        subject: match body.token.as_str() {
                            NOT_A_BODY => body.token,
                            token => retrace_store::vault::audit_subject(token),
                        },
                        reason: body.reason,
                        outcome: outcome.clone(),
                    })
                    .map_err(|e| {
                        AdminError::Store(format!(
                            "the audit log could not be written: {e}; nothing was revealed"
                        ))
                    })?;
                return Err(AdminError::Forbidden(format!(
                    "{outcome} (this attempt was written to the audit log)"
                )));
            }
            let request =
                Reveal { token: &body.token, reason: &body.reason, key: key.as_deref(), at_ms: now_ms() };
            let original = reveal_original(&*store, &by, &request).map_err(refusal)?;
            Ok(revealed(body.token, original))
        })
        .await,
    )
}

/// The audit log's `who` and `role` for a caller.
pub(crate) fn revealer(holder: Option<Holder>) -> Revealer {
    let (who, role) = match holder {
        Some(Holder { role, name: Some(name), .. }) => (name, role),
        Some(Holder { role, name: None, fingerprint }) => (format!("{ANONYMOUS} token {fingerprint}"), role),
        None => (ANONYMOUS.to_owned(), Role::Admin),
    };
    Revealer { who, role: role.as_str().to_owned() }
}

/// `{token, original}`: the original as text when it is UTF-8, else base64 with
/// `encoding: "base64"`.
fn revealed(token: String, original: Vec<u8>) -> Value {
    match String::from_utf8(original) {
        Ok(text) => json!({"token": token, "original": text}),
        Err(e) => {
            let encoded = base64::engine::general_purpose::STANDARD.encode(e.into_bytes());
            json!({"token": token, "original": encoded, "encoding": "base64"})
        }
    }
}

/// Each refusal's status (every one but a store failure is in the audit log already).
fn refusal(e: RevealError) -> AdminError {
    let audited = |m: String| format!("{m} (this attempt was written to the audit log)");
    match e {
        RevealError::NoKey | RevealError::BadKey(_) => AdminError::NoVaultKey(audited(
            "this daemon has no usable vault key: start it with RETRACE_VAULT_KEY set to the key the \
             originals were sealed with"
                .into(),
        )),
        RevealError::NoReason => AdminError::MissingReason(audited(e.to_string())),
        RevealError::NotAToken { .. } => AdminError::BadRequest(audited(e.to_string())),
        RevealError::Role { .. } => AdminError::Forbidden(audited(e.to_string())),
        RevealError::UnknownToken { .. } => AdminError::UnknownToken(audited(e.to_string())),
        RevealError::CannotOpen(_) => AdminError::CannotOpen(audited(e.to_string())),
        RevealError::Store(ref source) if source.kind == StoreErrorKind::ReadOnly => {
            AdminError::ReadOnly(format!("{e}: {source}; nothing was revealed"))
        }
        RevealError::Store(ref source) => AdminError::Store(format!("{e}: {source}; nothing was revealed")),
    }
}

/// The query of `GET /api/vault/audit`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// Only the entries about this token.
    token: Option<String>,
    /// Only the entries about this replay run.
    run: Option<String>,
}

/// `GET /api/vault/audit[?token=TOKEN | ?run=RUN]`: the audit log, oldest first, as
/// `retrace vault audit --json` prints it.
pub async fn audit(
    State(app): State<Arc<AppState>>,
    query: Result<Query<AuditQuery>, QueryRejection>,
) -> Response {
    let subject = match query {
        Ok(Query(AuditQuery { token: Some(_), run: Some(_) })) => {
            return AdminError::BadRequest("name a token or a run, not both".into()).into_response()
        }
        Ok(Query(AuditQuery { token, run })) => token.or(run),
        Err(e) => return AdminError::BadRequest(e.body_text()).into_response(),
    };
    let store = app.host.store().clone();
    answer(
        blocking(move || store.audit_list(subject.as_deref()).map_err(|e| AdminError::Store(e.to_string())))
            .await,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_audit_names_a_caller_by_its_token_and_role() {
        let by = |holder| {
            let r = revealer(holder);
            (r.who, r.role)
        };
        let named =
            Holder { role: Role::Debugger, name: Some("alice".into()), fingerprint: "sha256:ab".into() };
        assert_eq!(by(Some(named)), ("alice".to_owned(), "debugger".to_owned()));
        let unnamed = Holder { role: Role::Debugger, name: None, fingerprint: "sha256:0123456789ab".into() };
        assert_eq!(by(Some(unnamed)), ("api token sha256:0123456789ab".to_owned(), "debugger".to_owned()));
        assert_eq!(by(None), ("api".to_owned(), "admin".to_owned()), "a daemon without tokens");
    }
}
