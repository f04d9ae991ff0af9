//! `retrace vault`: reveal the original of a masked value (audited), list the audit log.
use std::io::Write;

use retrace_core::vault::VAULT_KEY_ENV;
use retrace_store::vault::{reveal, Reveal, RevealError, Revealer, ROLE_ADMIN};

use crate::commands::{existing_store_from_env, readable_store_from_env};
use crate::exit::Failure;
use crate::output::{fit, print_json, table, utc_time};

/// The examples every help shows.
macro_rules! examples {
    () => {
        "Examples:\n  \
         head -c 32 /dev/urandom | base64 > vault.key   # once: a new key, kept as a secret\n  \
         export RETRACE_VAULT_KEY=$(cat vault.key)\n  \
         retrace vault reveal rtk_email_k3v7q2mzp4xw6ya5tb2nrc7hdq --reason 'INC-42: which customer?'\n  \
         retrace vault audit\n  \
         retrace vault audit --token rtk_email_k3v7q2mzp4xw6ya5tb2nrc7hdq --json"
    };
}

/// The token vault: originals of masked values, and who looked at them.
#[derive(Debug, clap::Args)]
#[command(
    after_help = examples!(),
    after_long_help = concat!(
        "Masking replaces secrets (API keys, e-mail addresses, ...) by tokens such as \
rtk_email_k3v7q2mzp4xw6ya5tb2nrc7hdq before anything is stored. Where a masking rule keeps the \
original, it is sealed in the vault under RETRACE_VAULT_KEY (32 bytes, base64; not the mask key), \
and only someone holding that key can see it again.\n\n\
Every attempt to see an original is written to the append-only audit log first, refused ones \
included: who (the OS user; the command line acts as role admin), the token, the reason given, \
and the outcome.",
        "\n\n",
        examples!()
    )
)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

/// The vault's subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Print the original of a masked value (needs RETRACE_VAULT_KEY and a reason; audited).
    Reveal(RevealArgs),
    /// List the audit log: every attempt to see an original, oldest first.
    Audit(AuditArgs),
}

/// Reveal one token's original.
#[derive(Debug, clap::Args)]
#[command(
    after_help = examples!(),
    after_long_help = concat!(
        "Print the original that TOKEN stands for on standard output, byte for byte (messages go \
to standard error; a newline follows only on a terminal, so a pipe gets the original exactly; \
--json prints it in a JSON document). Needs RETRACE_VAULT_KEY, the key the original was sealed with, and a reason, \
which is written to the audit log with your OS user name ($USER) and role admin.\n\n\
Every attempt is audited before anything is shown, refused ones included (no key, no reason, \
unknown token, wrong key): see `retrace vault audit`.\n\n\
Exit codes: 0 revealed; 1 refused (the vault holds no such token, or the key is not the one it \
was sealed with); 2 usage (no RETRACE_VAULT_KEY, a malformed key, no reason, TOKEN not shaped like a \
token).",
        "\n\n",
        examples!()
    )
)]
pub struct RevealArgs {
    /// The token, as it appears in the log (`rtk_<kind>_<26 characters>`).
    pub token: String,
    /// Why you need the original (required; written to the audit log).
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
    /// Print `{"token", "original"}` as JSON instead of the bare original (`original_base64`
    /// in place of `original` for bytes that aren't UTF-8).
    #[arg(long)]
    pub json: bool,
}

/// List the audit log.
#[derive(Debug, clap::Args)]
#[command(after_help = examples!())]
pub struct AuditArgs {
    /// Only the entries about this token.
    #[arg(long, value_name = "TOKEN", conflicts_with = "run")]
    pub token: Option<String>,
    /// Only the entries about this replay run (originals handed to a replay).
    #[arg(long, value_name = "RUN")]
    pub run: Option<String>,
    /// Print a JSON array: `{id, at_ms, who, role, action, subject, reason, outcome}` each.
    #[arg(long)]
    pub json: bool,
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::Reveal(args) => run_reveal(args),
        Command::Audit(args) => run_audit(args),
    }
}

/// The OS user, as the audit log names the command line's actions.
pub(crate) fn os_user() -> String {
    retrace_runtime::vaulting::os_user()
}

fn run_reveal(args: RevealArgs) -> anyhow::Result<()> {
    let store = existing_store_from_env()?;
    let key = std::env::var(VAULT_KEY_ENV).ok().filter(|k| !k.trim().is_empty());
    let by = Revealer { who: os_user(), role: ROLE_ADMIN.to_owned() };
    // The reason goes into the audit log: masked like anything persisted (it may quote the
    // incident: a customer's email, a key).
    let mask = super::mask_without_new_key()?;
    let masker = retrace_runtime::masking::masker(mask.rules, Some(&mask.key))?;
    let reason = masker.mask_text(args.reason.as_deref().unwrap_or("")).0.into_owned();
    let request = Reveal {
        token: &args.token,
        reason: &reason,
        key: key.as_deref(),
        at_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    };
    match reveal(&*store, &by, &request) {
        Ok(original) if args.json => {
            let mut said = serde_json::json!({"token": args.token});
            match String::from_utf8(original) {
                Ok(text) => said["original"] = text.into(),
                Err(bytes) => {
                    use base64::Engine;
                    said["original_base64"] =
                        base64::engine::general_purpose::STANDARD.encode(bytes.into_bytes()).into();
                }
            }
            crate::output::print_json(&said)?;
            eprintln!("revealed {} to {} (written to the audit log)", args.token, by.who);
            Ok(())
        }
        Ok(original) => {
            let mut out = std::io::stdout().lock();
            out.write_all(&original)?;
            // The original alone, byte for byte, for a pipe; on a terminal, ended by a newline so
            // the prompt doesn't run into it.
            if std::io::IsTerminal::is_terminal(&out) && !original.ends_with(b"\n") {
                out.write_all(b"\n")?;
            }
            out.flush()?;
            eprintln!("revealed {} to {} (written to the audit log)", args.token, by.who);
            Ok(())
        }
        Err(e) => {
            let hint = match &e {
                RevealError::NoKey | RevealError::BadKey(_) => {
                    Some("export RETRACE_VAULT_KEY=<the 32-byte base64 key the originals were sealed with>")
                }
                RevealError::NoReason => Some("say why: retrace vault reveal TOKEN --reason 'INC-42: ...'"),
                RevealError::UnknownToken { .. } => {
                    Some("tokens are case-sensitive; copy it from `retrace show`")
                }
                RevealError::NotAToken { .. } => Some("copy the token whole from `retrace show RUN --seq N`"),
                _ => None,
            };
            let audited = !matches!(e, RevealError::Store(_));
            let mut message = e.to_string();
            // A message that shows its source already (a bad key's) doesn't say it twice.
            if let Some(source) = std::error::Error::source(&e).map(|s| s.to_string()) {
                if !message.ends_with(&source) {
                    message = format!("{message}: {source}");
                }
            }
            if audited {
                message.push_str(" (this attempt was written to the audit log)");
            }
            Err(Failure { code: e.exit_code(), message, hint: hint.map(str::to_owned), kind: None }.into())
        }
    }
}

fn run_audit(args: AuditArgs) -> anyhow::Result<()> {
    let store = readable_store_from_env()?;
    let subject = args.token.as_deref().or(args.run.as_deref());
    let records = store.audit_list(subject)?;
    if args.json {
        return print_json(&serde_json::to_value(&records)?);
    }
    if records.is_empty() {
        eprintln!("the audit log is empty{}", subject.map_or(String::new(), |s| format!(" for {s}")));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            let e = &r.entry;
            vec![
                r.id.to_string(),
                utc_time(e.at_ms),
                fit(&e.who, 16),
                e.role.clone(),
                e.action.to_string(),
                e.subject.clone(),
                fit(&e.reason, 40),
                e.outcome.clone(),
            ]
        })
        .collect();
    let text = table(&["ID", "TIME (UTC)", "WHO", "ROLE", "ACTION", "SUBJECT", "REASON", "OUTCOME"], &rows);
    std::io::stdout().lock().write_all(text.as_bytes())?;
    Ok(())
}
