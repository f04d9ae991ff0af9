//! Divergence: the program asked for something other than what the log holds, or ended differently.
//!
//! Built in one place, with a stable code, the seq, the agent, both keys and the first JSON path
//! where the two requests differ, and rendered for a terminal by its `Display`.
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::digest::Digest;

/// The stable codes of divergences. The text form never changes once released.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DivergenceCode {
    /// A step's key matches none of its agent's unconsumed recorded steps.
    StepMismatch,
    /// The agent asked for a step of a type and name none of its unconsumed recorded steps has
    /// (an extra step, or one after its recorded steps ran out).
    UnexpectedStep,
    /// The program ended with recorded steps still unconsumed.
    StepsLeft,
    /// The recording itself ends here (it was interrupted).
    LogEnded,
    /// The program exited with another status.
    ExitStatus,
    /// The final decisions differ.
    Decisions,
    /// No waiting step can proceed.
    Stall,
    /// A side effect's intent was logged but its completion was not.
    PendingIntent,
    /// An agent took its recorded steps in another order than recorded (`gate --strict-order`;
    /// SPEC §7 matches by key, so without it this is no divergence).
    OutOfOrder,
}

impl DivergenceCode {
    /// The stable text form, e.g. `step_mismatch`.
    pub fn as_str(self) -> &'static str {
        match self {
            DivergenceCode::StepMismatch => "step_mismatch",
            DivergenceCode::UnexpectedStep => "unexpected_step",
            DivergenceCode::StepsLeft => "steps_left",
            DivergenceCode::LogEnded => "log_ended",
            DivergenceCode::ExitStatus => "exit_status",
            DivergenceCode::Decisions => "decisions",
            DivergenceCode::Stall => "stall",
            DivergenceCode::PendingIntent => "pending_intent",
            DivergenceCode::OutOfOrder => "out_of_order",
        }
    }

    /// What the code means, in one line.
    pub fn meaning(self) -> &'static str {
        match self {
            DivergenceCode::StepMismatch => "the step asked for something the recording does not hold",
            DivergenceCode::UnexpectedStep => "the agent took a step its recording holds no more of",
            DivergenceCode::StepsLeft => "the program ended before taking every recorded step",
            DivergenceCode::LogEnded => "the recording ends here (it was interrupted)",
            DivergenceCode::ExitStatus => "the program exited with another status",
            DivergenceCode::Decisions => "the final decisions differ",
            DivergenceCode::Stall => "no waiting step can proceed",
            DivergenceCode::PendingIntent => "a side effect may or may not have happened",
            DivergenceCode::OutOfOrder => "an agent took its steps in another order than recorded",
        }
    }
}

impl fmt::Display for DivergenceCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One divergence, with everything needed to find it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub struct Divergence {
    /// Stable code.
    pub code: DivergenceCode,
    /// The recorded seq the divergence is about (the expected step), if any.
    pub seq: Option<u64>,
    /// The agent that diverged.
    pub agent: String,
    /// The step asked for, e.g. `tool_call sql.query`.
    pub step: Option<String>,
    /// Key of the expected step: the agent's earliest unconsumed recorded step of the same type and name.
    pub expected: Option<Digest>,
    /// Key of the step the program asked for.
    pub got: Option<Digest>,
    /// The first JSON path where the two requests differ.
    pub path: Option<String>,
    /// Blob of the (masked) request the program asked for, stored when the step didn't match so
    /// that tools such as `retrace gate` can compare it whole with the expected step's request.
    /// Absent in divergences recorded before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub got_request: Option<Digest>,
    /// Extra lines: the expected and actual values at `path`, waiting agents, hints.
    pub detail: Vec<String>,
}

impl Divergence {
    /// A divergence of `code` for `agent`, to be filled with the builder methods.
    pub fn new(code: DivergenceCode, agent: impl Into<String>) -> Divergence {
        Divergence {
            code,
            seq: None,
            agent: agent.into(),
            step: None,
            expected: None,
            got: None,
            path: None,
            got_request: None,
            detail: Vec::new(),
        }
    }

    /// Sets the seq.
    pub fn at(mut self, seq: u64) -> Self {
        self.seq = Some(seq);
        self
    }

    /// Sets the step label.
    pub fn step(mut self, step: impl Into<String>) -> Self {
        self.step = Some(step.into());
        self
    }

    /// Sets both keys.
    pub fn keys(mut self, expected: Option<Digest>, got: Option<Digest>) -> Self {
        self.expected = expected;
        self.got = got;
        self
    }

    /// Sets the first differing path.
    pub fn path(mut self, path: Option<String>) -> Self {
        self.path = path;
        self
    }

    /// Sets the blob of the request the program asked for.
    pub fn got_request(mut self, blob: Option<Digest>) -> Self {
        self.got_request = blob;
        self
    }

    /// Adds a line of detail.
    pub fn detail(mut self, line: impl Into<String>) -> Self {
        self.detail.push(line.into());
        self
    }

    /// The JSON form used by `--json` output, run metadata and the HTTP API.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("a divergence serializes")
    }
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "divergence [{}]", self.code)?;
        if let Some(seq) = self.seq {
            write!(f, " at seq {seq}")?;
        }
        writeln!(f, ", agent {:?}: {}", self.agent, self.code.meaning())?;
        if let Some(step) = &self.step {
            writeln!(f, "  step:      {step}")?;
        }
        match (&self.expected, self.seq) {
            (Some(k), Some(seq)) => writeln!(f, "  expected:  {k} (recorded seq {seq})")?,
            (Some(k), None) => writeln!(f, "  expected:  {k}")?,
            (None, _) => {}
        }
        if let Some(k) = &self.got {
            writeln!(f, "  got:       {k}")?;
        }
        if let Some(path) = &self.path {
            writeln!(f, "  first difference at {path}")?;
        }
        for line in &self.detail {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;

    #[test]
    fn renders_for_a_terminal() {
        let d = Divergence::new(DivergenceCode::StepMismatch, "reviewer")
            .at(14)
            .step("tool_call sql.query")
            .keys(Some(Digest::of(b"a")), Some(Digest::of(b"b")))
            .path(Some("$.q".into()))
            .detail("expected at $.q: \"select 1\"")
            .detail("got at $.q:      \"select 2\"");
        expect![[r#"
            divergence [step_mismatch] at seq 14, agent "reviewer": the step asked for something the recording does not hold
              step:      tool_call sql.query
              expected:  sha256:ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb (recorded seq 14)
              got:       sha256:3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73eeaed59c009d
              first difference at $.q
              expected at $.q: "select 1"
              got at $.q:      "select 2"
        "#]]
        .assert_eq(&d.to_string());
    }
}
