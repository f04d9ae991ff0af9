//! What a gate prints: one line per trace (with `hint:` lines under a divergence), a summary,
//! the `--json` document and the `--junit` XML.
use retrace_core::{Divergence, DivergenceCode};
use serde_json::json;

use super::accept;
use super::job::{Outcome, Verdict};
use crate::output::count;

/// The one line for a trace, and the lines under it.
pub fn trace_lines(o: &Outcome) -> String {
    // On one line whatever the file is called (a newline in a name would break the report).
    let name = crate::output::one_line(&o.trace.name);
    let mut out = match &o.verdict {
        Verdict::Ok => {
            let mut text = format!("ok        {name} ({}, {:.1} s)\n", count(o.steps, "step"), o.seconds);
            if let Some(said) = &o.reordered {
                text.push_str(&format!(
                    "          note: steps taken in another order than recorded (each matched by key; \
                     --strict-order fails this): {said}\n"
                ));
            }
            text
        }
        Verdict::Diverged { divergence, hints } => {
            let summary = divergence_summary(divergence);
            let sep = if summary.starts_with("at seq") { " " } else { ": " };
            let mut text = format!("DIVERGED  {name}{sep}{summary}\n");
            for line in &divergence.detail {
                text.push_str(&format!("          {line}\n"));
            }
            for hint in hints {
                text.push_str(&format!("          hint: {}: {}\n", step_name(divergence), hint.message()));
            }
            text
        }
        Verdict::Error { message, hint } => {
            let mut text = format!("ERROR     {name}: {message}\n");
            if let Some(hint) = hint {
                text.push_str(&format!("          hint: {hint}\n"));
            }
            text
        }
        Verdict::Interrupted { signal } => format!("STOPPED   {name}: interrupted ({signal}), not judged\n"),
    };
    let judged = !matches!(o.verdict, Verdict::Ok | Verdict::Interrupted { .. });
    if judged && !o.output_tail.is_empty() {
        out.push_str("          the program's last output:\n");
        for line in &o.output_tail {
            out.push_str(&format!("          | {line}\n"));
        }
    }
    out
}

/// `at seq N: agent A, expected KEY, got KEY, first differing path P` for a step that matched
/// no recorded one, or for any other divergence (one that is not about two requests, such as a
/// step asked for past an interrupted recording's end) its code and what it means.
pub fn divergence_summary(d: &Divergence) -> String {
    let short = |k: &Option<retrace_core::Digest>| k.map_or("-".to_owned(), |k| k.short());
    match (d.seq, d.got.is_some() && d.code == DivergenceCode::StepMismatch) {
        (Some(seq), true) => format!(
            "at seq {seq}: agent {}, expected {}, got {}, first differing path {}",
            d.agent,
            short(&d.expected),
            short(&d.got),
            d.path.as_deref().unwrap_or("-")
        ),
        _ => {
            let at = d.seq.map(|s| format!("at seq {s}: ")).unwrap_or_default();
            // `*` is no agent but the whole run (an exit status, the final decisions).
            match d.agent.as_str() {
                "*" => format!("{at}{}: {}", d.code, d.code.meaning()),
                agent => format!("{at}{}: {} (agent {agent})", d.code, d.code.meaning()),
            }
        }
    }
}

/// `seq 7, agent planner, model_call /v1/chat/completions`.
fn step_name(d: &Divergence) -> String {
    let mut name = String::new();
    if let Some(seq) = d.seq {
        name.push_str(&format!("seq {seq}, "));
    }
    name.push_str(&format!("agent {}", d.agent));
    if let Some(step) = &d.step {
        name.push_str(&format!(", {step}"));
    }
    name
}

/// Counts of each verdict.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    /// Traces that replayed exactly.
    pub ok: usize,
    /// Traces that diverged.
    pub diverged: usize,
    /// Traces that could not be replayed.
    pub errors: usize,
    /// Traces whose replay the user stopped, or that never started once they had.
    pub interrupted: usize,
}

impl Tally {
    /// The tally of `outcomes`.
    pub fn of(outcomes: &[Outcome]) -> Tally {
        let mut t = Tally::default();
        for o in outcomes {
            match o.verdict {
                Verdict::Ok => t.ok += 1,
                Verdict::Diverged { .. } => t.diverged += 1,
                Verdict::Error { .. } => t.errors += 1,
                Verdict::Interrupted { .. } => t.interrupted += 1,
            }
        }
        t
    }
}

/// `gate: 5 traces, 4 ok, 1 diverged, 0 errors in 3.2 s (2 jobs)`, with `, N interrupted`
/// after the errors when the user stopped the gate.
pub fn summary(outcomes: &[Outcome], seconds: f64, jobs: usize) -> String {
    let t = Tally::of(outcomes);
    let interrupted = match t.interrupted {
        0 => String::new(),
        n => format!(", {n} interrupted"),
    };
    format!(
        "gate: {}, {} ok, {} diverged, {}{interrupted} in {seconds:.1} s ({})\n",
        count(outcomes.len(), "trace"),
        t.ok,
        t.diverged,
        count(t.errors, "error"),
        count(jobs, "job")
    )
}

/// The `--json` document; with `--accept`, what it did with each diverging trace (`accepted`).
pub fn json(
    outcomes: &[Outcome],
    seconds: f64,
    jobs: usize,
    accepted: Option<&[accept::Report]>,
) -> serde_json::Value {
    let t = Tally::of(outcomes);
    let traces: Vec<serde_json::Value> = outcomes
        .iter()
        .map(|o| {
            let (status, divergence, hints, error) = match &o.verdict {
                Verdict::Ok => ("ok", None, vec![], None),
                Verdict::Diverged { divergence, hints } => (
                    "diverged",
                    Some(divergence.to_json()),
                    hints
                        .iter()
                        .map(|h| json!({"kind": h.kind(), "path": h.path, "message": h.message()}))
                        .collect(),
                    None,
                ),
                Verdict::Error { message, hint } => {
                    ("error", None, vec![], Some(json!({"message": message, "hint": hint})))
                }
                Verdict::Interrupted { .. } => ("interrupted", None, vec![], None),
            };
            json!({
                "name": o.trace.name, "run": o.run_id, "status": status, "steps": o.steps,
                "seconds": o.seconds, "program_seconds": o.program_seconds, "command": o.command,
                "digest": o.digest.map(|d| d.to_string()), "agents": o.agents,
                "divergence": divergence, "hints": hints, "error": error, "output_tail": o.output_tail,
                "reordered": o.reordered,
            })
        })
        .collect();
    let mut document = json!({
        "traces": traces,
        "summary": {"traces": outcomes.len(), "ok": t.ok, "diverged": t.diverged, "errors": t.errors,
                    "interrupted": t.interrupted, "seconds": seconds, "jobs": jobs},
    });
    if let Some(accepted) = accepted {
        document["accepted"] = accepted.iter().map(accept::Report::json).collect();
    }
    document
}

/// JUnit XML: one test suite, one test case per trace; a divergence is a `failure`, a trace
/// that could not be replayed an `error`, one the user stopped `skipped`.
pub fn junit(outcomes: &[Outcome], seconds: f64) -> String {
    let t = Tally::of(outcomes);
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    x.push_str(&format!(
        "<testsuites name=\"retrace gate\" tests=\"{}\" failures=\"{}\" errors=\"{}\" time=\"{seconds:.3}\">\n",
        outcomes.len(),
        t.diverged,
        t.errors
    ));
    x.push_str(&format!(
        "  <testsuite name=\"retrace gate\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{seconds:.3}\">\n",
        outcomes.len(),
        t.diverged,
        t.errors,
        t.interrupted
    ));
    for o in outcomes {
        x.push_str(&format!(
            "    <testcase classname=\"retrace.gate\" name=\"{}\" time=\"{:.3}\"",
            escape(&o.trace.name),
            o.seconds
        ));
        let body = trace_lines(o);
        match &o.verdict {
            Verdict::Ok => x.push_str("/>\n"),
            Verdict::Diverged { divergence, .. } => x.push_str(&format!(
                ">\n      <failure type=\"divergence\" message=\"{}\">{}</failure>\n    </testcase>\n",
                escape(&divergence_summary(divergence)),
                escape(&body)
            )),
            Verdict::Error { message, .. } => x.push_str(&format!(
                ">\n      <error type=\"input\" message=\"{}\">{}</error>\n    </testcase>\n",
                escape(message),
                escape(&body)
            )),
            Verdict::Interrupted { signal } => x.push_str(&format!(
                ">\n      <skipped message=\"interrupted ({signal})\"/>\n    </testcase>\n"
            )),
        }
    }
    x.push_str("  </testsuite>\n</testsuites>\n");
    x
}

/// XML text and attribute escaping; characters XML 1.0 can't hold become `?`.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' | '\t' | '\r' => out.push(c),
            c if (c as u32) < 0x20 => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_is_escaped() {
        assert_eq!(escape("a<b & \"c\"\u{1}"), "a&lt;b &amp; &quot;c&quot;?");
    }
}
