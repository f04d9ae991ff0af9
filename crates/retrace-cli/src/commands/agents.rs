//! `retrace agents`: each agent's replay record and autonomy rung, and why.
use std::collections::BTreeSet;

use retrace_core::autonomy::{AutonomyPolicy, Standing};
use retrace_runtime::autonomy::Governor;

use crate::commands::readable_store_from_env;
use crate::exit::usage;
use crate::output::count;
use crate::output::{print_json, table};

/// What every listing says about scope.
const SCOPE: &str =
    "Only side effects routed through tool(cls=\"side_effect\") (Rust: ToolSpec::side_effect) \
are governed; anything a program does outside Retrace is not.";

/// Each agent's replay record and autonomy rung.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  retrace agents\n  retrace agents --json",
    after_long_help = "Lists the agents of this project (`[project] name` in ./retrace.toml, else the git \
top-level folder's name) found in the store's replay ledger or in the policy's signed ledger, with the \
rung the policy in ./retrace.toml gives each: unproven (no record in a trusted ledger), probation \
(below the bar), autonomous (its side effects run without approval). The rung is computed from the \
signed ledger file [autonomy] names, as the runtime will compute it, not from the local store; a \
file whose signature doesn't verify against ledger_pubkey counts as none. The local store can \
only lower a rung: an agent it shows diverging after the signed ledger was exported is on \
probation until a ledger signed since shows the bar met again. Where no store saw that divergence, \
whoever can write the ledger file can put back an older signed one: ledger_max_age_days = N in \
[autonomy] makes a ledger exported longer ago count as none. A trace counts once: a replay run's \
trace, or an unedited fork's, counts as the recording it replays.\n\n\
Only side effects routed through tool(cls=\"side_effect\") are governed.\n\n\
Examples:\n  retrace agents\n  retrace agents --json"
)]
pub struct Args {
    /// Print `{project, policy, ledger_warning, scope, agents: [{agent, rung, side_effects_allowed,
    /// bar, why, local}]}`.
    #[arg(long)]
    pub json: bool,
}

/// Runs `retrace agents`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let dir = std::env::current_dir()?;
    let governor = Governor::load(&dir).map_err(|e| usage(e.to_string()))?;
    let project = retrace_runtime::autonomy::project(&dir);
    // A machine that only runs agents may hold no store: the rungs come from the signed ledger.
    let config = retrace_store::StoreConfig::from_env()?;
    let no_store =
        matches!(&config.location, retrace_store::StoreLocation::Sqlite { path } if !path.exists());
    let local = match no_store {
        true => {
            eprintln!("retrace: no store here: rungs from the signed ledger alone, with no local record");
            Vec::new()
        }
        false => readable_store_from_env()?.ledger_entries(Some(&project))?,
    };
    let mut names: BTreeSet<String> = local.iter().map(|e| e.agent.clone()).collect();
    if let Some(file) = governor.as_ref().and_then(|g| g.ledger.as_ref()) {
        names.extend(file.entries.iter().filter(|e| e.project == project).map(|e| e.agent.clone()));
    }
    let standings: Vec<Option<Standing>> = names
        .iter()
        .map(|a| governor.as_ref().map(|g| g.standing_with(a, local.iter().find(|e| &e.agent == a))))
        .collect();
    if args.json {
        let agents: Vec<_> = names
            .iter()
            .zip(&standings)
            .map(|(name, s)| {
                serde_json::json!({
                    "agent": name,
                    "rung": s.as_ref().map(|s| s.rung.as_str()),
                    "side_effects_allowed": s.as_ref().is_none_or(|s| s.side_effects_allowed),
                    "bar": s.as_ref().map(|s| s.bar.clone()),
                    "why": s.as_ref().map_or("no [autonomy] policy: not governed".into(), |s| s.why.clone()),
                    "local": local.iter().find(|e| &e.agent == name),
                })
            })
            .collect();
        return print_json(&serde_json::json!({
            "project": project,
            "policy": governor.as_ref().map(|g| &g.policy),
            "ledger_warning": governor.as_ref().and_then(|g| g.warning.clone()),
            "scope": SCOPE,
            "agents": agents,
        }));
    }
    if let Some(w) = governor.as_ref().and_then(|g| g.warning.as_ref()) {
        eprintln!("warning: {w}");
    }
    println!("project {project}: {}", describe(governor.as_ref().map(|g| &g.policy)));
    if names.is_empty() {
        println!("no agent has a replay record yet (`retrace gate PATH...` adds them)");
    } else {
        let rows: Vec<Vec<String>> = names
            .iter()
            .zip(&standings)
            .map(|(name, s)| {
                let l = local.iter().find(|e| &e.agent == name);
                vec![
                    name.clone(),
                    s.as_ref().map_or("-".into(), |s| s.rung.as_str().into()),
                    l.map_or("-".into(), |l| {
                        format!("{} clean / {}", l.clean_streak, count(l.distinct_traces, "trace"))
                    }),
                    s.as_ref().map_or("not governed".into(), |s| s.why.clone()),
                ]
            })
            .collect();
        print!("{}", table(&["AGENT", "RUNG", "LOCAL STORE", "WHY (signed ledger)"], &rows));
    }
    println!("{SCOPE}");
    Ok(())
}

fn describe(policy: Option<&AutonomyPolicy>) -> String {
    match policy {
        None => "no [autonomy] policy in ./retrace.toml: side effects are not governed".into(),
        Some(p) => format!(
            "side effects need {}; below that they are {}",
            p.bar(),
            match p.below {
                retrace_core::autonomy::Below::Refuse => "refused".to_string(),
                retrace_core::autonomy::Below::Hold if p.approval_timeout_s > 0 => {
                    format!("held up to {}s for `retrace approve`", p.approval_timeout_s)
                }
                retrace_core::autonomy::Below::Hold => "held (ApprovalRequired) for `retrace approve`".into(),
            }
        ),
    }
}
