//! `retrace approve ID --reason TEXT`: release (or `--refuse`) a side effect held by the
//! autonomy policy. The decision goes to the store's approvals table; the process recording the
//! run (the holder of its lease, its one sequencer) appends the `approval` event.
use retrace_core::run::RunStatus;
use retrace_store::ledger::ApprovalDecision;
use retrace_store::StoreErrorKind;

use crate::commands::existing_store_from_env;
use crate::commands::vault::os_user;
use crate::exit::{usage, usage_hint, Failure};

macro_rules! examples {
    () => {
        "Examples:\n  \
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
Exit codes: 0 decided; 1 already decided, or the run that held the call has ended (its call \
was never released, and can't be now); 2 usage (no reason, unknown ID).",
        "\n\n",
        examples!()
    )
)]
pub struct Args {
    /// The approval's id, as the held call printed it (`ap_...`).
    pub id: String,
    /// Why (required; recorded in the run's approval event).
    #[arg(long, value_name = "TEXT")]
    pub reason: String,
    /// Refuse the call instead of releasing it.
    #[arg(long)]
    pub refuse: bool,
}

/// Runs `retrace approve`.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.reason.trim().is_empty() {
        return Err(usage("--reason must say why"));
    }
    let store = existing_store_from_env()?;
    let decision = ApprovalDecision {
        approved: !args.refuse,
        by: os_user(),
        reason: args.reason.clone(),
        at_ms: super::ledger::now_ms(),
    };
    // A call held by a run that has ended was decided then: it timed out, or the program gave
    // up on it; a decision now would release nothing.
    if let Some(held) = store.approval(&args.id)?.filter(|held| held.decision.is_none()) {
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
                }
                .into());
            }
        }
    }
    match store.approval_decide(&args.id, &decision) {
        Ok(record) => {
            eprintln!(
                "{} {} of agent {:?} in run {} ({})",
                if args.refuse { "refused" } else { "approved" },
                record.tool,
                record.agent,
                record.run,
                record.id
            );
            Ok(())
        }
        Err(e) if e.kind == StoreErrorKind::NotFound => Err(usage_hint(
            format!("no held side effect {}", args.id),
            "the id is in the held call's ApprovalRequired error, and on the recording's standard error while it waits",
        )),
        Err(e) if e.kind == StoreErrorKind::Conflict => {
            Err(Failure { code: 1, message: e.to_string(), hint: None }.into())
        }
        Err(e) => Err(e.into()),
    }
}
