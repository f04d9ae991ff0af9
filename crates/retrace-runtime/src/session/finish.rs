//! Ending sessions: what record, replay and fork store when the program is done.
use super::*;

/// The run label listing the side effects a recording left between intent and completion.
pub const PENDING_INTENTS: &str = "pending_intents";

/// The replay run label saying which agents took steps in another order than recorded (each
/// matched by key, SPEC §7, so no divergence): `agent "a": seq 5 (tool_call email.send) before
/// seq 4 (tool_call card.charge)`, one per agent (its name as a JSON string), `; `-separated.
pub const REORDERED: &str = "reordered";

impl Session {
    /// Ends the run. A session of a daemon's run ([`Session::connect`]) says its agents exited,
    /// ends the run if it created it (a launcher ends the run it started, with the program's
    /// exit status), and returns the divergence the daemon found, if any; of a launcher's run
    /// the report's status is `running`, the verdict being the launcher's once the program
    /// has exited ([`RunReport::status`]). Record: flushes, stores status, final decisions and exit status. Replay:
    /// checks that every recorded step was consumed, that the final decisions and the exit status
    /// match, stores the outcome, and returns the first divergence as an error. A replay of an
    /// interrupted recording never ends matched: it ends with `log_ended` ([`crate::log_end`]).
    pub fn finish(&self, outcome: Outcome) -> RuntimeResult<RunReport> {
        if self.inner.finished.swap(true, Ordering::SeqCst) {
            return Err(RuntimeError::Usage("the session was already finished".into()));
        }
        if let Some(remote) = &self.inner.remote {
            return self.finish_remote(remote, outcome);
        }
        match self.inner.mode {
            Mode::Record | Mode::Fork => self.finish_record(outcome),
            Mode::Replay => self.finish_replay(outcome),
            Mode::Off => Ok(self.report(RunStatus::Ok)),
        }
    }

    fn report(&self, status: RunStatus) -> RunReport {
        let run = self.inner.run.lock();
        RunReport {
            run_id: run.id.clone(),
            source_run: run.source_run.clone(),
            status,
            steps: self.inner.steps.load(Ordering::Relaxed),
            live_calls: self.live_calls(),
        }
    }

    fn finish_record(&self, outcome: Outcome) -> RuntimeResult<RunReport> {
        let writer = self.inner.writer.as_ref().expect("record sessions have a writer");
        let flushed = writer.flush();
        let divergence = self.divergence().or_else(|| self.fork_steps_left(&outcome));
        let status = match (&flushed, outcome.exit_status) {
            _ if divergence.is_some() => RunStatus::Diverged,
            (Err(_), _) => RunStatus::Failed,
            (Ok(()), Some(code)) if code != 0 => RunStatus::Failed,
            _ => RunStatus::Ok,
        };
        // What the store holds: after a failed commit, the events appended since aren't stored.
        let (_, head) = writer.acknowledged();
        let meta = {
            let mut run = self.inner.run.lock();
            run.status = status;
            run.divergence = divergence.as_ref().map(Divergence::to_json);
            run.exit_status = outcome.exit_status;
            run.decisions = self.inner.decisions.lock().clone();
            run.holds_tokens |= self.inner.holds_tokens.load(Ordering::Relaxed);
            run.finished_at_ms = Some(self.inner.clock.now_ms());
            run.head = head;
            // A side effect the program left between its intent and its completion (it exited,
            // its task was cancelled): a replay stops there until `retrace resolve` says what
            // happened, which the recording's end says now rather than the first replay.
            let open = self.inner.open_intents.lock();
            if !open.is_empty() {
                let listed: Vec<String> =
                    open.iter().map(|(seq, label)| format!("seq {seq} ({label})")).collect();
                run.labels.insert(PENDING_INTENTS.into(), listed.join(", "));
            }
            run.clone()
        };
        self.inner.store.update_run(&with_stored_tier(self.inner.store.as_ref(), meta))?;
        writer.release()?;
        flushed?;
        match divergence {
            Some(d) => Err(d.into()),
            None => Ok(self.report(status)),
        }
    }

    fn finish_replay(&self, outcome: Outcome) -> RuntimeResult<RunReport> {
        let scheduler = self.inner.scheduler.as_ref().expect("replay sessions have a scheduler");
        if scheduler.divergence().is_none() {
            if let Some(d) = self.ending_divergence(scheduler.log(), &outcome) {
                scheduler.diverge(d);
            }
        }
        // A recording that could not be read to its end judges nothing: the replay failed.
        let failure = scheduler.log().failure();
        let divergence = scheduler.divergence();
        let status = match (&failure, &divergence) {
            (Some(_), _) => RunStatus::Failed,
            (None, Some(_)) => RunStatus::Diverged,
            (None, None) => RunStatus::Ok,
        };
        let meta = {
            let mut run = self.inner.run.lock();
            run.status = status;
            run.exit_status = outcome.exit_status;
            run.decisions = self.inner.decisions.lock().clone();
            // A failed replay judged nothing: the waiters it released are no divergence.
            run.divergence = divergence.as_ref().filter(|_| failure.is_none()).map(Divergence::to_json);
            run.finished_at_ms = Some(self.inner.clock.now_ms());
            let reordered = scheduler.log().reordered();
            if !reordered.is_empty() {
                let said: Vec<String> = reordered
                    .iter()
                    .map(|(agent, took, before)| {
                        let agent = serde_json::Value::from(agent.as_str());
                        format!(
                            "agent {agent}: seq {} ({}) before seq {} ({})",
                            took.seq, took.label, before.seq, before.label
                        )
                    })
                    .collect();
                run.labels.insert(REORDERED.into(), said.join("; "));
            }
            run.clone()
        };
        self.inner.store.update_run(&meta)?;
        if let Some(e) = failure {
            return Err(e.into());
        }
        match divergence {
            Some(d) => Err(d.into()),
            None => Ok(self.report(status)),
        }
    }

    /// In a fork, the source's steps before the fork point that the program never took (it
    /// ended early): a `steps_left` divergence, as a replay reports steps left, for before the
    /// fork point the program takes the source's steps (QA22 D3: the fork was stored `ok`, its
    /// edit never applied, and its own replay then diverged). None for a program that failed:
    /// that is the report.
    fn fork_steps_left(&self, outcome: &Outcome) -> Option<Divergence> {
        if self.inner.mode != Mode::Fork || outcome.exit_status.is_some_and(|code| code != 0) {
            return None;
        }
        let scheduler = self.inner.scheduler.as_ref()?;
        let at = scheduler.fork_at()?;
        let left: Vec<_> =
            scheduler.log().leftovers().into_iter().filter(|(_, step)| step.seq < at).collect();
        let (agent, first) = left.first()?;
        let mut d = Divergence::new(DivergenceCode::StepsLeft, agent.clone())
            .at(first.seq)
            .step(first.label.clone())
            .keys(first.key, None)
            .detail(format!(
                "the program ended before taking the source's steps before the fork point (--at {at}), so no edit applied"
            ));
        for (agent, step) in &left {
            d = d.detail(format!(
                "agent {agent:?}: first step not taken is seq {} ({})",
                step.seq, step.label
            ));
        }
        Some(d)
    }

    fn ending_divergence(&self, log: &RecordedLog, outcome: &Outcome) -> Option<Divergence> {
        let leftovers = log.leftovers();
        if log.failure().is_some() {
            return None;
        }
        if self.source_ended_early() {
            // Nothing to compare the ending with: the recording holds no exit status or final
            // decisions. Steps the program left are named, but the recording's end is the report,
            // as it is when the program exits without finishing (`retrace replay`).
            let mut d = crate::log_end::log_ended("*", log.last_seq());
            for (agent, step) in &leftovers {
                d = d.detail(format!(
                    "agent {agent:?}: first unconsumed step is seq {} ({})",
                    step.seq, step.label
                ));
            }
            return Some(d);
        }
        if let Some((agent, first)) = leftovers.first() {
            let mut d = Divergence::new(DivergenceCode::StepsLeft, agent.clone())
                .at(first.seq)
                .step(first.label.clone())
                .keys(first.key, None);
            for (agent, step) in &leftovers {
                d = d.detail(format!(
                    "agent {agent:?}: first unconsumed step is seq {} ({})",
                    step.seq, step.label
                ));
            }
            return Some(d);
        }
        let run = self.inner.run.lock();
        let source = self.inner.store.run(run.source_run.as_deref().unwrap_or_default()).ok()?;
        drop(run);
        let now = self.inner.decisions.lock().clone();
        // Agents run concurrently, so decisions of different agents interleave however they
        // raced: only each agent's own order is part of the outcome.
        let per_agent = |ds: &[FinalDecision]| {
            let mut ds = ds.to_vec();
            ds.sort_by(|a, b| a.agent.cmp(&b.agent));
            ds
        };
        if per_agent(&now) != per_agent(&source.decisions) && !source.decisions.is_empty() {
            let render = |ds: &[FinalDecision]| {
                ds.iter()
                    .map(|d| {
                        format!(
                            "{}:{}{}",
                            d.agent,
                            d.action,
                            d.target.as_ref().map(|t| format!("@{t}")).unwrap_or_default()
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Some(
                Divergence::new(DivergenceCode::Decisions, "*")
                    .detail(format!("recorded: [{}]", render(&source.decisions)))
                    .detail(format!("replayed: [{}]", render(&now))),
            );
        }
        if let (Some(recorded), Some(now)) = (source.exit_status, outcome.exit_status) {
            if recorded != now {
                return Some(
                    Divergence::new(DivergenceCode::ExitStatus, "*")
                        .detail(format!("recorded exit status {recorded}, replay exited {now}")),
                );
            }
        }
        None
    }
}

/// `run` with the retention tier the store holds now: `retrace retain` may have pinned the run
/// while it recorded, and a session's copy of its run is as old as the session, so storing
/// that copy whole would undo it. (Nothing else about a recording run is changed by others.)
pub(crate) fn with_stored_tier(store: &dyn Store, mut run: RunMeta) -> RunMeta {
    if let Ok(stored) = store.run(&run.id) {
        run.retention = stored.retention;
    }
    run
}
