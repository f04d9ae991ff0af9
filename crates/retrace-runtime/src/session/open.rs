//! Opening sessions: record, replay, fork, off, and joining the run a launcher set up.
use super::*;
use crate::log_end::SOURCE_STATUS_LABEL;
use crate::remote_session::{DaemonRun, RemoteRun};
use crate::vaulting::Reveal;

impl Session {
    /// Starts recording a new run.
    pub fn record(store: Arc<dyn Store>, options: SessionOptions) -> RuntimeResult<Session> {
        let id = options.run_id.clone().unwrap_or_else(new_run_id);
        let mut meta = RunMeta::new(id.clone(), RunMode::Record, options.clock.now_ms());
        meta.name = options.name.clone();
        meta.labels = options.labels.clone();
        meta.command = options.command.clone();
        // A literal rule's value is the secret itself: the run records its digest.
        meta.masking_rules = options.mask_rules.sealed(options.mask_key.as_ref());
        meta.mask_key_fingerprint = options.mask_key.as_ref().map(MaskKey::fingerprint);
        meta.chaos_seed = options.chaos_seed;
        let masker = masking::masker(options.mask_rules.clone(), options.mask_key.as_ref())?;
        store.create_run(&meta)?;
        let writer = RunWriter::open(store.clone(), &id, LeaseHolder::unique())?;
        Ok(Session::build(Mode::Record, store, Some(writer), None, meta, masker, options))
    }

    /// Replays `source` (a run id or unique prefix) exactly, as a new replay run.
    pub fn replay(store: Arc<dyn Store>, source: &str, options: SessionOptions) -> RuntimeResult<Session> {
        let mut source_meta = store.find_run(source)?;
        if source_meta.mode == RunMode::Replay {
            let of = source_meta.source_run.clone().ok_or_else(|| {
                RuntimeError::Usage(format!("replay run {} names no source run", source_meta.id))
            })?;
            source_meta = store.run(&of)?;
        }
        if source_meta.status == RunStatus::Running {
            if let Some(holder) = store.lease_holder(&source_meta.id)? {
                return Err(RuntimeError::Usage(format!(
                    "run {} is still being recorded by {}; replay it once it has finished",
                    source_meta.id, holder.0
                )));
            }
        }
        masking::check_key(&source_meta, options.mask_key.as_ref())?;
        // Replay masks with the recorded rule set: a change of rules is never a divergence.
        let masker = masking::masker_with(
            source_meta.masking_rules.clone(),
            &options.mask_rules,
            options.mask_key.as_ref(),
        )?;
        // Outputs are read ahead, verified and decoded on the log's reader thread when the
        // program gets them as stored (no rule hands originals back).
        let outputs = !Reveal::needed(&source_meta.masking_rules);
        let log = RecordedLog::stream(store.clone(), &source_meta.id, outputs)?;
        let id = options.run_id.clone().unwrap_or_else(new_run_id);
        let mut meta = match store.run(&id) {
            Ok(existing) if existing.mode == RunMode::Replay => existing,
            _ => {
                let mut m = RunMeta::new(id.clone(), RunMode::Replay, options.clock.now_ms());
                m.source_run = Some(source_meta.id.clone());
                m.command = options.command.clone().or_else(|| source_meta.command.clone());
                m.name = options.name.clone().or_else(|| source_meta.name.clone());
                store.create_run(&m)?;
                m
            }
        };
        // A replay holds no lease: while this process, which hosts it, lives, no one takes the
        // run for one whose replayer died, however long it runs.
        store.keep_run(&id, &LeaseHolder::current())?;
        meta.source_run = Some(source_meta.id.clone());
        meta.masking_rules = source_meta.masking_rules.clone();
        meta.mask_key_fingerprint = source_meta.mask_key_fingerprint.clone();
        let config = SchedulerConfig { strict: options.strict, stall_timeout: options.stall_timeout };
        let scheduler = Scheduler::new(log, config);
        store_divergence_when_found(&scheduler, &store, &meta.id);
        // A replay of a fork applies the fork's edits again, so its steps ask what the fork asked.
        let plan = match source_meta.mode {
            RunMode::Fork => Some(plan_of(store.as_ref(), &source_meta)?),
            _ => None,
        };
        let reveal = Reveal::open(
            store.as_ref(),
            &meta.masking_rules,
            options.vault_key.as_ref(),
            options.revealer.as_ref(),
            &meta.id,
            options.clock.now_ms(),
        )?;
        let mut session = Session::build(Mode::Replay, store, None, Some(scheduler), meta, masker, options);
        let inner = Arc::get_mut(&mut session.inner).expect("just built");
        inner.plan = plan.map(Arc::new);
        inner.reveal = reveal;
        session.inner.run.lock().labels.insert(SOURCE_STATUS_LABEL.into(), source_meta.status.to_string());
        Ok(session)
    }

    /// Executes fork run `fork_id` (created by [`Session::fork_new`] or `retrace fork`): the
    /// program re-runs from the start; steps matching the source get its recorded output, changed
    /// and new steps run (cached, live, or as a dry run), and the fork's own events are recorded
    /// from its fork point on.
    pub fn fork(store: Arc<dyn Store>, fork_id: &str, options: SessionOptions) -> RuntimeResult<Session> {
        let meta = store.find_run(fork_id)?;
        if meta.mode != RunMode::Fork {
            return Err(RuntimeError::Usage(format!("run {} is a {} run, not a fork", meta.id, meta.mode)));
        }
        let source = meta
            .source_run
            .clone()
            .ok_or_else(|| RuntimeError::Usage(format!("fork {} names no source run", meta.id)))?;
        masking::check_key(&store.run(&source)?, options.mask_key.as_ref())?;
        // The fork's rules were fixed when it was created: the source's plus today's.
        let masker =
            masking::masker_with(meta.masking_rules.clone(), &options.mask_rules, options.mask_key.as_ref())?;
        let plan = plan_of(store.as_ref(), &meta)?;
        let log = RecordedLog::load(store.as_ref(), &source)?;
        let state = ForkState::new(plan.at, &log, &plan.swaps);
        let config = SchedulerConfig { strict: false, stall_timeout: options.stall_timeout };
        let scheduler = Scheduler::with_fork(log, config, Some(state));
        store_divergence_when_found(&scheduler, &store, &meta.id);
        let reveal = Reveal::open(
            store.as_ref(),
            &meta.masking_rules,
            options.vault_key.as_ref(),
            options.revealer.as_ref(),
            &meta.id,
            options.clock.now_ms(),
        )?;
        let writer = RunWriter::open(store.clone(), &meta.id, LeaseHolder::unique())?;
        let mut session =
            Session::build(Mode::Fork, store, Some(writer), Some(scheduler), meta, masker, options);
        let inner = Arc::get_mut(&mut session.inner).expect("just built");
        inner.plan = Some(Arc::new(plan));
        inner.reveal = reveal;
        Ok(session)
    }

    /// Creates a fork of `source` at `at` (default: the smallest seq an edit names, or 1) with
    /// `edits`, and starts executing it. Edits that carry content must name stored blobs
    /// (`Content::Blob`); bad edits are usage errors that say why, and create nothing.
    pub fn fork_new(
        store: Arc<dyn Store>,
        source: &str,
        at: Option<u64>,
        edits: Vec<Edit>,
        options: SessionOptions,
    ) -> RuntimeResult<Session> {
        let source_meta = store.find_run(source)?;
        // What an edit says in its own text is stored with the run: masked like any input.
        let (rules, added) = masking::fork_rules(&source_meta.masking_rules, &options.mask_rules);
        let masker = masking::masker_with(rules.clone(), &options.mask_rules, options.mask_key.as_ref())?;
        let edits: Vec<Edit> = edits
            .iter()
            .map(|edit| {
                let (stored, tokens) = masking::masked_edit(edit, &masker);
                if tokens > 0 {
                    eprintln!("retrace: warning: {}", masking::masked_edit_warning(&stored, tokens));
                }
                stored
            })
            .collect();
        let at = match at {
            Some(at) => at,
            None => crate::fork::default_at(store.as_ref(), &source_meta.id, &edits)?,
        };
        crate::fork::check_distinct(&edits)
            .and_then(|()| ForkPlan::new(at, edits.clone()))
            .and_then(|p| p.validate(store.as_ref(), &source_meta.id))
            .map_err(|e| RuntimeError::Usage(e.to_string()))?;
        let id = options.run_id.clone().unwrap_or_else(new_run_id);
        let mut meta = RunMeta::new(id.clone(), RunMode::Fork, options.clock.now_ms());
        meta.source_run = Some(source_meta.id.clone());
        meta.fork_at = Some(at);
        meta.edits = edits.iter().map(ToString::to_string).collect();
        meta.name =
            options.name.clone().or_else(|| source_meta.name.as_ref().map(|n| format!("fork of {n}")));
        meta.command = options.command.clone().or_else(|| source_meta.command.clone());
        meta.chaos_seed = options.chaos_seed;
        if !added.is_empty() && !source_meta.masking_rules.is_empty() {
            eprintln!("{}", masking::fork_rules_warning(&added));
        }
        meta.masking_rules = rules.sealed(options.mask_key.as_ref());
        meta.mask_key_fingerprint = options
            .mask_key
            .as_ref()
            .map(MaskKey::fingerprint)
            .or_else(|| source_meta.mask_key_fingerprint.clone());
        store.create_run(&meta)?;
        Session::fork(store, &id, options)
    }

    /// A session that runs everything live and records nothing (`RETRACE_MODE=off`).
    pub fn off(store: Arc<dyn Store>, options: SessionOptions) -> Session {
        let meta = RunMeta::new(new_run_id(), RunMode::Record, options.clock.now_ms());
        Session::build(Mode::Off, store, None, None, meta, Masker::empty(), options)
    }

    /// Joins the run a launcher (`retrace record|replay -- CMD`) set up, from `RETRACE_MODE`
    /// (`record` default, `replay`, `off`), `RETRACE_RUN`, and `RETRACE_STORE` / `RETRACE_HOME`.
    ///
    /// With `RETRACE_URL` set (as `retrace record|replay|fork` set it), the session is a client of
    /// that daemon ([`Session::connect`]): it opens no store and holds no lease, and every step
    /// goes to the daemon, the run's one sequencer. `RETRACE_RUN` is then the run to join (in
    /// replay, a recorded run gets a new replay); without it, record creates a new run on the
    /// daemon. `RETRACE_MODE=off` never talks to a daemon.
    ///
    /// In record, `RETRACE_RUN` names the run to record into (created when absent). In replay it
    /// names the replay run that the launcher created, which names its source; naming a recorded
    /// run directly starts a new replay of it.
    pub fn from_env() -> RuntimeResult<Session> {
        Session::from_env_with(SessionOptions::default())
    }

    /// [`Session::from_env`] with options for what the environment doesn't say (name, command,
    /// chaos...). `RETRACE_CHAOS_SEED` overrides `options.chaos_seed`.
    pub fn from_env_with(mut options: SessionOptions) -> RuntimeResult<Session> {
        // Set but unreadable is refused, as RETRACE_MODE is, rather than quietly ignored (QA18 S4).
        let given = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        if let Some(seed) = given("RETRACE_CHAOS_SEED") {
            options.chaos_seed = Some(seed.trim().parse().map_err(|_| {
                RuntimeError::Usage(format!(
                    "RETRACE_CHAOS_SEED={seed:?}: want a whole number (the chaos seed)"
                ))
            })?);
        }
        if let Some(text) = given("RETRACE_STALL_TIMEOUT") {
            let secs =
                text.trim().parse::<f64>().ok().filter(|s| !s.is_nan() && *s >= 0.0).ok_or_else(|| {
                    RuntimeError::Usage(format!(
                        "RETRACE_STALL_TIMEOUT={text:?}: want seconds, a number of 0 or more"
                    ))
                })?;
            options.stall_timeout = Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX);
        }
        if std::env::var("RETRACE_STRICT").is_ok_and(|v| v == "1" || v == "true") {
            options.strict = true;
        }
        let mode = std::env::var("RETRACE_MODE").unwrap_or_else(|_| "record".into());
        let run = std::env::var("RETRACE_RUN").ok().filter(|s| !s.is_empty());
        if let Some(url) = std::env::var("RETRACE_URL").ok().filter(|u| !u.is_empty() && mode != "off") {
            let target = match (mode.as_str(), run) {
                ("replay", Some(id)) => DaemonRun::Replay(id),
                ("record", Some(id)) => DaemonRun::Join(id),
                ("fork", Some(id)) => DaemonRun::Fork(id),
                ("record", None) => DaemonRun::New,
                ("replay" | "fork", None) => {
                    return Err(RuntimeError::Usage(format!("RETRACE_MODE={mode} needs RETRACE_RUN")))
                }
                (other, _) => return Err(unknown_mode(other)),
            };
            return Session::connect(&url, target, options);
        }
        let config = StoreConfig::from_env()?;
        let store = retrace_store::open_store(&config)?;
        masking::fill_from_env(&mut options, &config)?;
        // The policy is read only to record (SPEC §7); replay and fork answer from the log.
        if options.autonomy.is_none() && mode == "record" {
            options.autonomy = crate::autonomy::from_cwd()?;
        }
        match mode.as_str() {
            "record" => match run {
                Some(id) => match store.run(&id) {
                    Ok(_) => Session::join(store, &id, options),
                    Err(_) => {
                        options.run_id = Some(id);
                        Session::record(store, options)
                    }
                },
                None => Session::record(store, options),
            },
            "replay" => {
                let id = run.ok_or_else(|| {
                    RuntimeError::Usage("RETRACE_MODE=replay needs RETRACE_RUN (the run to replay)".into())
                })?;
                let meta = store.find_run(&id)?;
                if meta.mode == RunMode::Replay {
                    Session::join(store, &meta.id, options)
                } else {
                    Session::replay(store, &meta.id, options)
                }
            }
            "off" => Ok(Session::off(store, options)),
            "fork" => {
                let id = run.ok_or_else(|| {
                    RuntimeError::Usage(
                        "RETRACE_MODE=fork needs RETRACE_RUN (the fork run to execute)".into(),
                    )
                })?;
                Session::fork(store, &id, options)
            }
            other => Err(unknown_mode(other)),
        }
    }

    /// Joins a run that a launcher or the daemon created: a `running` record run (taking its
    /// lease: one run, one sequencer), a replay run (replaying its source under that id), or a
    /// fork run (executing it).
    pub fn join(store: Arc<dyn Store>, run_id: &str, mut options: SessionOptions) -> RuntimeResult<Session> {
        let meta = store.run(run_id)?;
        match meta.mode {
            RunMode::Record if meta.status == RunStatus::Running => {
                // Joining a recording: its tokens so far were made under its recorded key.
                masking::check_joining_key(&meta, options.mask_key.as_ref())?;
                let masker = masking::masker_with(
                    meta.masking_rules.clone(),
                    &options.mask_rules,
                    options.mask_key.as_ref(),
                )?;
                let writer = RunWriter::open(store.clone(), run_id, LeaseHolder::unique())?;
                Ok(Session::build(Mode::Record, store, Some(writer), None, meta, masker, options))
            }
            RunMode::Record => Err(RuntimeError::Usage(format!(
                "run {run_id} is a record run with status {}; record into a new run id",
                meta.status
            ))),
            RunMode::Replay => {
                let source = meta
                    .source_run
                    .clone()
                    .ok_or_else(|| RuntimeError::Usage(format!("replay run {run_id} names no source run")))?;
                options.run_id = Some(meta.id.clone());
                Session::replay(store, &source, options)
            }
            RunMode::Fork => Session::fork(store, run_id, options),
        }
    }

    /// A session of a daemon's run: every step goes to `remote`. Its store is an empty one that
    /// no step reaches ([`Session::store`] is `None`).
    pub(crate) fn remote(
        mode: Mode,
        run: RunMeta,
        remote: Arc<RemoteRun>,
        options: SessionOptions,
    ) -> Session {
        let store: Arc<dyn Store> = Arc::new(retrace_store::memory::MemoryStore::new());
        let mut session = Session::build(mode, store, None, None, run, Masker::empty(), options);
        let inner = Arc::get_mut(&mut session.inner).expect("just built");
        inner.remote = Some(remote);
        inner.bus = None;
        inner.autonomy = None;
        session
    }

    fn build(
        mode: Mode,
        store: Arc<dyn Store>,
        writer: Option<RunWriter>,
        scheduler: Option<Arc<Scheduler>>,
        run: RunMeta,
        masker: Masker,
        options: SessionOptions,
    ) -> Session {
        // Record and fork seal what masking replaced into the vault, when there is a vault key.
        let originals = match (mode, &options.vault_key) {
            (Mode::Record | Mode::Fork, Some(key)) => {
                Some(crate::vaulting::Originals::new(key.clone(), &masker))
            }
            _ => None,
        };
        let masker = match &originals {
            Some(o) => masker.with_sink(o.sink()),
            None => masker,
        };
        let bus = matches!(mode, Mode::Record | Mode::Off)
            .then(|| Bus::new(options.chaos_seed, options.chaos_max_delay));
        Session {
            inner: Arc::new(Inner {
                mode,
                store,
                writer,
                scheduler,
                bus,
                plan: None,
                originals,
                reveal: None,
                prompts_dir: options.prompts_dir,
                prices: options.prices,
                keys: options.keys,
                masker,
                wait_for_ack: options.wait_for_ack,
                autonomy: if mode == Mode::Record { options.autonomy.clone() } else { None },
                spent: Default::default(),
                clock: options.clock,
                run: Mutex::new(run),
                agents: Mutex::new(HashMap::new()),
                decisions: Mutex::new(Vec::new()),
                holds_tokens: AtomicBool::new(false),
                steps: AtomicUsize::new(0),
                live_calls: AtomicUsize::new(0),
                open_intents: Mutex::new(Default::default()),
                finished: AtomicBool::new(false),
                remote: None,
            }),
        }
    }
}

/// Stores a replay's or fork's divergence the moment it is found, so a program that dies of it
/// still leaves its report behind.
fn store_divergence_when_found(scheduler: &Arc<Scheduler>, store: &Arc<dyn Store>, run_id: &str) {
    let store = store.clone();
    let run_id = run_id.to_owned();
    scheduler.on_divergence(Box::new(move |d| {
        if let Ok(mut run) = store.run(&run_id) {
            run.status = RunStatus::Diverged;
            run.divergence = Some(d.to_json());
            let _ = store.update_run(&run);
        }
    }));
}

/// The validated plan of a fork run, from its stored edits.
fn plan_of(store: &dyn Store, fork: &RunMeta) -> RuntimeResult<ForkPlan> {
    let source = fork.source_run.as_deref().unwrap_or_default();
    let edits = fork
        .edits
        .iter()
        .map(|e| e.parse::<Edit>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| RuntimeError::Usage(format!("fork {}: {e}", fork.id)))?;
    let mut plan = ForkPlan::new(fork.fork_at.unwrap_or(1), edits)
        .and_then(|p| p.validate(store, source))
        .map_err(|e| RuntimeError::Usage(format!("fork {}: {e}", fork.id)))?;
    // A fork of a fork starts from its source's world: the source's edits, and what it
    // inherited from its own source, apply again.
    let source_meta = store.run(source)?;
    if source_meta.mode == RunMode::Fork && source_meta.id != fork.id {
        plan.inherit(&plan_of(store, &source_meta)?);
    }
    Ok(plan)
}

/// A `RETRACE_MODE` that names no mode, with the mode it was probably meant to name
/// (`Replay`, ` off`): the four are written in lowercase, without spaces.
fn unknown_mode(mode: &str) -> RuntimeError {
    let near = mode.trim().to_ascii_lowercase();
    let hint = match near.as_str() {
        "record" | "replay" | "fork" | "off" => {
            format!("; did you mean {near:?}? (a mode is written in lowercase, without spaces)")
        }
        _ => String::new(),
    };
    RuntimeError::Usage(format!("RETRACE_MODE={mode:?}: want record, replay, fork or off{hint}"))
}

#[cfg(test)]
mod tests {
    use super::unknown_mode;

    #[test]
    fn a_mode_in_capitals_or_with_spaces_is_refused_naming_the_mode_it_meant() {
        let said = unknown_mode("Replay").to_string();
        assert!(
            said.contains(
                r#"RETRACE_MODE="Replay": want record, replay, fork or off; did you mean "replay"?"#
            ),
            "{said}"
        );
        assert!(unknown_mode(" off\n").to_string().contains(r#"did you mean "off"?"#));
        assert!(!unknown_mode("bogus").to_string().contains("did you mean"));
    }
}
