//! The runtime's error type: divergences, store failures, bad steps and recorded step failures.
use retrace_core::canonical::CanonError;
use retrace_core::Divergence;
use retrace_store::StoreError;

/// What can go wrong in a step or a session.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// Replay found the program asking for something other than what the log holds.
    #[error("{0}")]
    Divergence(Box<Divergence>),
    /// The store failed; in record this fails the step (recording fails closed).
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// A request or output can't be canonical JSON (NaN, infinities, ...).
    #[error("step {step} of agent {agent:?}: {source}")]
    NotCanonical {
        /// The agent.
        agent: String,
        /// The step label.
        step: String,
        /// What was wrong.
        source: CanonError,
    },
    /// The step's own function failed (live), or failed when it was recorded (replay).
    #[error("step {step} of agent {agent:?} failed: {message}")]
    StepFailed {
        /// The agent.
        agent: String,
        /// The step label.
        step: String,
        /// The error message, as recorded.
        message: String,
    },
    /// A recorded output could not be decoded into the type the program asked for.
    #[error("step {step} of agent {agent:?}: recorded output does not decode: {message}")]
    Decode {
        /// The agent.
        agent: String,
        /// The step label.
        step: String,
        /// The decoder's message.
        message: String,
    },
    /// A fork reached a changed or new side effect that has no dry-run: it was not executed.
    #[error("dry run: side effect {tool} was not executed in this fork (args {args}); give the tool a dry_run to continue")]
    DryRun {
        /// The tool.
        tool: String,
        /// Its arguments.
        args: serde_json::Value,
    },
    /// The autonomy policy (or a person, through `retrace approve`) refused a side effect.
    #[error("{0}")]
    NotPermitted(Box<Refusal>),
    /// A side effect is held for a person's approval (`retrace approve ID --reason TEXT`); ask
    /// again with the same request once it is approved.
    #[error("approval required ({id}): side effect {tool} of agent {agent:?} is held by the autonomy policy ({standing}); release it with `retrace approve {id} --reason TEXT`, then call it again")]
    ApprovalRequired {
        /// The approval's id.
        id: String,
        /// The agent.
        agent: String,
        /// The side effect's tool.
        tool: String,
        /// The agent's rung and the bar, in words.
        standing: String,
    },
    /// The daemon a remote session talks to (`RETRACE_URL`) could not be reached, or refused a
    /// request for a reason other than a divergence.
    #[error("retrace daemon at {url}: {code}: {message}")]
    Daemon {
        /// The daemon's URL.
        url: String,
        /// The daemon's error code (`unreachable` when it could not be reached).
        code: String,
        /// What went wrong.
        message: String,
    },
    /// The session was used wrongly (finished twice, unknown run, bad environment...).
    #[error("{0}")]
    Usage(String),
    /// A prompt template holds a placeholder the program gave no value for.
    #[error("prompt template {template} ({path}): {missing}")]
    TemplateVar {
        /// The template, `name@version`.
        template: String,
        /// Its file.
        path: String,
        /// The placeholder, its line and the names given.
        missing: Box<crate::template::MissingVar>,
    },
}

impl From<Divergence> for RuntimeError {
    fn from(d: Divergence) -> Self {
        RuntimeError::Divergence(Box::new(d))
    }
}

impl RuntimeError {
    /// The divergence, if this is one.
    pub fn divergence(&self) -> Option<&Divergence> {
        match self {
            RuntimeError::Divergence(d) => Some(d),
            _ => None,
        }
    }
}

/// A side effect the autonomy policy or a person refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The agent.
    pub agent: String,
    /// The side effect's tool.
    pub tool: String,
    /// The agent's rung when it asked (`unproven`, `probation`).
    pub rung: String,
    /// The bar the policy sets, in words.
    pub bar: String,
    /// Why the agent stands where it does.
    pub why: String,
    /// `policy`, or the person who refused it.
    pub by: String,
    /// The person's reason, if one refused it.
    pub reason: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Refusal { agent, tool, rung, bar, why, by, reason } = self;
        if by == "policy" || by.is_empty() {
            write!(
                f,
                "side effect {tool} of agent {agent:?} refused by the autonomy policy: the agent is on rung {rung} \
                 ({why}) and the bar is {bar}; earn it with clean `retrace gate` replays, or set [autonomy] \
                 below = \"hold\" so a person can release such calls with `retrace approve ID --reason TEXT`"
            )
        } else {
            write!(
                f,
                "side effect {tool} of agent {agent:?} refused by {by} through `retrace approve`: {reason} \
                 (rung {rung}: {why})"
            )
        }
    }
}

/// Result alias for the runtime.
pub type RuntimeResult<T> = Result<T, RuntimeError>;
