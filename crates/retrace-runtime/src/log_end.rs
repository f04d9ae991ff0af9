//! Where an interrupted recording ends (SPEC §7 "Interrupted recordings"): a replay serves its
//! events and then stops with `log_ended`, "the recording ends at seq N".
//!
//! Built in one place because three paths reach that end and must say the same: an agent asks
//! for a step past it (`step.rs`, `messaging.rs`), the program finishes its session
//! (`session/finish.rs`), or the program exits without finishing one (`retrace replay`). The
//! last two are never a match, even when every recorded step was consumed: a recording whose
//! recorder died holds no outcome (exit status, final decisions) to compare the replay's with.
use retrace_core::run::{RunMeta, RunStatus};
use retrace_core::{Divergence, DivergenceCode};

/// The label a replay run keeps its source's status under, as it was when the replay opened.
pub(crate) const SOURCE_STATUS_LABEL: &str = "source_status";

/// Whether `source`'s recording ends early: its recorder died before the run finished.
pub fn ends_early(source: &RunMeta) -> bool {
    source.status == RunStatus::Interrupted
}

/// The `log_ended` divergence of a recording whose last stored seq is `last_seq`, reported for
/// `agent` (the agent that asked for a step past the end, or `*` when the program ended there).
pub fn log_ended(agent: impl Into<String>, last_seq: u64) -> Divergence {
    let d = Divergence::new(DivergenceCode::LogEnded, agent);
    let d = match last_seq {
        0 => d,
        seq => d.at(seq),
    };
    d.detail(format!("the recording ends at seq {last_seq}"))
        .detail("its recorder stopped before the run finished, so nothing was recorded past that seq")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_last_recorded_seq() {
        let text = log_ended("*", 7).to_string();
        assert_eq!(
            text,
            "divergence [log_ended] at seq 7, agent \"*\": the recording ends here (it was interrupted)\n  \
             the recording ends at seq 7\n  \
             its recorder stopped before the run finished, so nothing was recorded past that seq\n"
        );
    }
}
