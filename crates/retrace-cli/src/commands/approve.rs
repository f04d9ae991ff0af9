//! `retrace approve ID --reason TEXT`: release (or `--refuse`) a side effect held by the
//! autonomy policy. The decision goes to the store's approvals table; the process recording the
//! run (the holder of its lease, its one sequencer) appends the `approval` event.
//! `retrace approve --pending` lists the calls waiting for a decision.
use retrace_core::run::RunStatus;
use retrace_store::ledger::ApprovalDecision;
use retrace_store::ledger::ApprovalRecord;
use retrace_store::StoreErrorKind;

use crate::commands::vault::os_user;
use crate::commands::{existing_store_from_env, readable_store_from_env};
use crate::exit::{usage, usage_hint, Failure};
use crate::output::{print_json, table};

macro_rules! examples {
    () => {
        "Examples:\n  \
         retrace approve --pending\n  \
         retrace approve ap_1f2e3d4c5b6a7988 --reason 'checked the recipient list'\n  \
         retrace approve ap_1f2e3d4c5b6a7988 --refuse --reason 'not during the freeze'"
    };
}

/// Release a side effect held by the autonomy policy.
#[derive(Debug, clap::Args)]
#[command(
    after_help = examples!(),
    after_long_help = concat!(
        "A side effect (a tool called with class side_effect) by an agent below the bar of \
[autonomy] in retrace.toml is held when the policy says below = \"hold\": the call blocks up to \
approval_timeout_s, or raises ApprovalRequired(ID) at once. This command decides it, once, with \
your OS user name and the reason. A blocked call goes on (or fails, with --refuse) as soon as it \
sees the decision; a call that raised goes on when the program asks again with the same request. \
Either way the run records an `approval` event, which replay and fork reproduce without reading \
the policy.\n\n\
--pending lists the held calls a decision can still release (their runs are recording), oldest \
first, with how long each has waited; --json for scripts.\n\n\
Exit codes: 0 decided; 1 already decided, or the run that held the call has ended (its call \
was never released, and can't be now); 2 usage (no reason, unknown ID).",
        "\n\n",
        examples!()
    )
)]
pub struct Args {
    /// The approval's id, as the held call printed it (`ap_...`).
    #[arg(required_unless_present = "pending")]
    pub id: Option<String>,
    /// Why (required; recorded in the run's approval event).
    #[arg(long, value_name = "TEXT", required_unless_present = "pending")]
    pub reason: Option<String>,
    /// Refuse the call instead of releasing it.
    #[arg(long)]
    pub refuse: bool,
    /// List the held calls waiting for a decision instead of deciding one.
    #[arg(long, conflicts_with_all = ["id", "reason", "refuse"])]
    pub pending: bool,
    /// With --pending: print JSON (checked in `run`: clap's `requires` made `approve --json`
    /// ask for --pending, --reason and an ID together, which conflict; QA37 D4).
    #[arg(long)]
    pub json: bool,
}

/// Runs `retrace approve`.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.pending {
        return pending(args.json);
    }
    if args.json {
        // Deciding prints one line to standard error; nothing to print as JSON (QA32 S1).
        return Err(usage("--json lists the held calls: use it with --pending"));
    }
    let (Some(id), Some(reason)) = (args.id, args.reason) else {
        unreachable!("clap requires an id and a reason without --pending")
    };
    decide(&id, &reason, args.refuse)
}

/// The held calls a decision can still release: their runs are recording.
fn pending(json: bool) -> anyhow::Result<()> {
    let mut held: Vec<ApprovalRecord> = Vec::new();
    let mut ended = 0;
    // No store yet: nothing was ever held.
    if crate::commands::missing_store_from_env()?.is_none() {
        let store = readable_store_from_env()?;
        for record in store.approvals_undecided()? {
            match store.run(&record.run) {
                Ok(run) if run.status == RunStatus::Running => held.push(record),
                _ => ended += 1,
            }
        }
    }
    let now = super::ledger::now_ms();
    let waited = |r: &ApprovalRecord| now.saturating_sub(r.requested_at_ms) / 1000;
    if json {
        let rows: Vec<serde_json::Value> = held
            .iter()
            .map(|r| {
                serde_json::json!({
                    "id": r.id, "run": r.run, "agent": r.agent, "tool": r.tool, "key": r.key.to_string(),
                    "rung": r.rung, "why": r.why, "requested_at_ms": r.requested_at_ms, "waited_s": waited(r),
                })
            })
            .collect();
        return print_json(&serde_json::Value::Array(rows));
    }
    if held.is_empty() {
        eprintln!("no held call is waiting for a decision");
    } else {
        let rows: Vec<Vec<String>> = held
            .iter()
            .map(|r| {
                vec![
                    r.id.clone(),
                    r.run.clone(),
                    r.agent.clone(),
                    r.tool.clone(),
                    format!("{}s", waited(r)),
                    r.why.clone(),
                ]
            })
            .collect();
        print!("{}", table(&["ID", "RUN", "AGENT", "TOOL", "WAITED", "WHY"], &rows));
        eprintln!("decide one: retrace approve ID --reason TEXT [--refuse]");
    }
    if ended > 0 {
        eprintln!(
            "({ended} more held by runs that have ended: never released, and can't be now; run their programs again)"
        );
    }
    Ok(())
}

/// Approves or refuses one held call.
fn decide(id: &str, reason: &str, refuse: bool) -> anyhow::Result<()> {
    if reason.trim().is_empty() {
        return Err(usage("--reason must say why"));
    }
    let store = existing_store_from_env()?;
    // The reason is persisted (the approvals table, then the run's event): masked first, like
    // anything persisted (QA27 D2: it was stored in clear in the table).
    let mask = super::mask_without_new_key()?;
    let masker = retrace_runtime::masking::masker(mask.rules, Some(&mask.key))?;
    let decision = ApprovalDecision {
        approved: !refuse,
        by: os_user(),
        reason: masker.mask_text(reason).0.into_owned(),
        at_ms: super::ledger::now_ms(),
    };
    // A call held by a run that has ended was decided then: it timed out, or the program gave
    // up on it; a decision now would release nothing.
    if let Some(held) = store.approval(id)?.filter(|held| held.decision.is_none()) {
        if let Ok(run) = store.run(&held.run) {
            if run.status != RunStatus::Running {
                return Err(Failure {
                    code: 1,
                    message: format!(
                        "run {} has ended ({}): the {} call of agent {:?} it held was never released and \
                         can't be now",
                        run.id, run.status, held.tool, held.agent
                    ),
                    hint: Some(
                        "run the program again: the call is held again, under a new id, for you to approve"
                            .to_owned(),
                    ),
                    kind: None,
                }
                .into());
            }
        }
    }
    match store.approval_decide(id, &decision) {
        Ok(record) => {
            eprintln!(
                "{} {} of agent {:?} in run {} ({})",
                if refuse { "refused" } else { "approved" },
                record.tool,
                record.agent,
                record.run,
                record.id
            );
            Ok(())
        }
        Err(e) if e.kind == StoreErrorKind::NotFound => Err(usage_hint(
            format!("no held side effect {id}"),
            "the id is in the held call's ApprovalRequired error, and on the recording's standard error while it waits",
        )),
        Err(e) if e.kind == StoreErrorKind::Conflict => {
            Err(Failure { code: 1, message: e.to_string(), hint: None, kind: None }.into())
        }
        Err(e) => Err(e.into()),
    }
}
