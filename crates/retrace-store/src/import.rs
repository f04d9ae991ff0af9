//! Reading a `retrace-trace/1` file into a store, verifying every line before storing its run.
//!
//! [`import_reader`] works in two phases:
//! 1. **Read and verify** (`import/read.rs`): line by line, the header's format and counts,
//!    every event's seq, hash and chain link, every blob's digest (a manifest is rebuilt into its
//!    request first), that every referenced blob is present and nothing follows the last blob.
//!    Worker threads parse lines and hash them ahead of these checks (`import/prepare.rs`);
//!    the checks and their errors stay in file order on the calling thread. Once the events
//!    have verified, a thread stores each plain blob line that verifies while the rest is
//!    read (`import/early.rs`), and the line's bytes are dropped once it is stored. The lines
//!    left for phase 2 (model requests; every line when nothing is stored early) are kept in
//!    memory up to half of [`ImportOptions::chunk_bytes`] and spilled to a temporary file past
//!    it (`import/held.rs`), so what an import holds is bounded by its chunk, not by its file
//!    ([`ImportStats`]); a manifest line naming a line held no more reads it back, verified.
//! 2. **Store** (`import/commit.rs`): if the run already exists it must hold the same events
//!    (then the import is a no-op); otherwise the run is created and its events and blobs are
//!    committed in chunks, carrying the blobs stored early with where they are and without
//!    their bytes ([`BlobPut::stored`](crate::BlobPut)), the rest read back. No run and no
//!    event is stored unless the whole file verified; a file that fails after some blob lines
//!    may leave those blobs stored, referenced by nothing, for `retrace gc` to sweep. The run is
//!    created `running`, with no head and the [`UNFINISHED_LABEL`], and gets the file's header
//!    once its last event is stored: a store that fails part way (a full disk) leaves a run that
//!    says it is unfinished, and importing the same file again stores the rest.
//!
//! Every error names the line (and the file, when the caller gives its name) and maps to the
//! CLI's exit codes through [`ImportError::exit_code`]. With [`ImportOptions::forced`]
//! (`retrace import --force`) verification failures and truncation are reported and the rest is
//! stored, for `retrace verify` to examine.
mod commit;
pub use commit::UNFINISHED_LABEL;
mod early;
mod header;
pub(crate) use header::impossible as impossible_record;
mod held;
mod identity;
mod prepare;
mod read;
mod text_line;

use std::fmt;
use std::io::{self, BufRead};

use retrace_core::Digest;

use crate::gc::Retained;
use crate::{Store, StoreError, StoreErrorKind};

/// How to import.
pub struct ImportOptions<'a> {
    /// The file's name, for error messages (`trace.jsonl:12: ...`).
    pub file_name: Option<String>,
    /// Events per stored transaction, at most.
    pub chunk_events: usize,
    /// Bytes a stored transaction is given to write, about: one ends after the event that takes
    /// it past this many, counting the blobs it stores (a model request held in the file as a
    /// manifest counts as the whole request it is rebuilt into, since the store is handed that).
    /// It bounds the memory the blob lines are held in too, at about one and a half times this
    /// ([`ImportStats::peak_held_bytes`]), whatever the size of the file.
    pub chunk_bytes: u64,
    /// Called with the number of bytes read so far.
    pub progress: Option<&'a mut dyn FnMut(u64)>,
    /// `--force`: when set, a file that fails verification is stored anyway and each failure
    /// is passed here instead of ending the import. Events are stored as they are (a bad hash
    /// or chain link included), a blob whose bytes don't match its digest is left out, and a
    /// truncated file's complete lines are kept. What the store can't hold is still refused:
    /// a line that is not JSON, an unknown format, seqs out of order.
    pub forced: Option<&'a mut dyn FnMut(&ImportError)>,
    /// When set, filled in with what the import held in memory ([`ImportStats`]) once it has
    /// stored the run or found it present.
    pub stats: Option<&'a mut ImportStats>,
}

/// What an import's blob bytes cost: the memory it held them in, what it spilled to its
/// temporary file and read back. What tests and benchmarks check memory against, instead of
/// the resident set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImportStats {
    /// The most bytes of blob lines held in memory at once while the file was read (counted
    /// after each line): lines waiting to be stored early (up to three quarters of
    /// [`ImportOptions::chunk_bytes`] and a blob per transaction in flight), lines kept for
    /// phase 2 within their allowance (half of it) and bytes cached as they were read back (a
    /// quarter).
    pub peak_held_bytes: u64,
    /// Bytes of blob lines written to the import's temporary file: lines kept for phase 2
    /// past their allowance (model requests, or every line of a run the store holds already).
    pub spilled_bytes: u64,
    /// Bytes read back from the store or the temporary file and verified again, for a manifest
    /// that names them or to be stored.
    pub read_back_bytes: u64,
    /// The most bytes of blobs one stored transaction carried (blobs stored early are carried
    /// without their bytes).
    pub peak_batch_bytes: u64,
}

impl Default for ImportOptions<'_> {
    fn default() -> Self {
        ImportOptions {
            file_name: None,
            chunk_events: 4096,
            chunk_bytes: 32 << 20,
            progress: None,
            forced: None,
            stats: None,
        }
    }
}

impl fmt::Debug for ImportOptions<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImportOptions")
            .field("file_name", &self.file_name)
            .field("chunk_events", &self.chunk_events)
            .field("chunk_bytes", &self.chunk_bytes)
            .field("progress", &self.progress.is_some())
            .field("forced", &self.forced.is_some())
            .field("stats", &self.stats.is_some())
            .finish()
    }
}

/// What an import did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImportOutcome {
    /// The run was stored.
    Imported {
        /// The run's id.
        run_id: String,
        /// Events stored.
        events: u64,
        /// Blob lines read.
        blobs: u64,
    },
    /// The store already holds this run with the same events: nothing was written but, when
    /// the file's retention tier is stronger than the stored run's, the tier.
    AlreadyPresent {
        /// The run's id.
        run_id: String,
        /// The tier raised to the file's, if it was.
        raised: Option<Retained>,
    },
}

impl ImportOutcome {
    /// The run's id.
    pub fn run_id(&self) -> &str {
        match self {
            ImportOutcome::Imported { run_id, .. } | ImportOutcome::AlreadyPresent { run_id, .. } => run_id,
        }
    }
}

/// A place in the file: its name (when known) and a 1-based line number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    /// The file's name, if the caller gave it.
    pub file: Option<String>,
    /// 1-based line number.
    pub line: u64,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.file {
            Some(file) => write!(f, "{file}:{}", self.line),
            None => write!(f, "line {}", self.line),
        }
    }
}

/// The kind of an [`ImportError`], for matching and exit codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImportErrorKind {
    /// A line is not what the format says (not JSON, wrong shape, extra lines): exit 2.
    Malformed,
    /// The file ends before the lines its header announces: exit 2.
    Truncated,
    /// A format this build can't read, such as `retrace-trace/2`: exit 2.
    UnknownFormat,
    /// A hash, digest, chain link or seq does not verify: exit 1.
    Verification,
    /// The store holds this run (or a fork's source) with different events: exit 1.
    Conflict,
    /// The file could not be read: exit 2.
    Io,
    /// The store failed while storing: exit 1 when it reports corrupt data or a conflict, else 2.
    Store,
}

/// Why an import failed.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// A line is not what the format says.
    #[error("{at}: {message}")]
    Malformed {
        /// Where.
        at: Location,
        /// What is wrong.
        message: String,
    },
    /// The file ends early.
    #[error("{at}: truncated: {message}")]
    Truncated {
        /// Where the file ends.
        at: Location,
        /// What was expected.
        message: String,
    },
    /// An unknown major format.
    #[error("{at}: unsupported trace format {found:?}: this build reads retrace-trace/1")]
    UnknownFormat {
        /// The header line.
        at: Location,
        /// The format tag found.
        found: String,
    },
    /// Content that doesn't verify.
    #[error("{at}: {message}")]
    Verification {
        /// Where.
        at: Location,
        /// The event, when the problem is about one.
        seq: Option<u64>,
        /// The blob, when the problem is about one.
        digest: Option<Digest>,
        /// What is wrong.
        message: String,
    },
    /// Event lines out of order, repeated or missing: content that doesn't verify, which even a
    /// forced import refuses (it could not store the run's seqs densely).
    #[error("{at}: {message}")]
    Order {
        /// Where.
        at: Location,
        /// The seq found.
        seq: u64,
        /// What is wrong.
        message: String,
    },
    /// The store holds different events under the same run id.
    #[error(
        "run {run_id} is already in the store with different events: \
         first difference at seq {seq} ({detail})"
    )]
    Conflict {
        /// The run in the store that differs (the imported run, or a fork's source).
        run_id: String,
        /// The first seq that differs.
        seq: u64,
        /// How it differs.
        detail: String,
    },
    /// A fork and its source disagree on the events the fork inherits: the file's fork was made
    /// from another recording of its source than the store holds, or a fork stored here was
    /// made from another recording of the file's run.
    #[error("{}", inherited_message(fork, source_run, *seq, detail, *fork_in_file))]
    Inherited {
        /// The fork.
        fork: String,
        /// The run it inherits from.
        source_run: String,
        /// The first seq that differs.
        seq: u64,
        /// How it differs.
        detail: String,
        /// Whether the fork is the file's run (else the file's run is the source, and the
        /// fork is stored here).
        fork_in_file: bool,
    },
    /// The store holds the same events under the same run id, but the run's outcome or origin
    /// differs (status, decisions, exit status, command, fork source or edits).
    #[error("run {run_id} is already in the store with the same events but a different {field}: {stored} in the store, {file} in the file")]
    HeaderConflict {
        /// The run.
        run_id: String,
        /// The header field that differs.
        field: &'static str,
        /// Its value in the store (JSON).
        stored: String,
        /// Its value in the file (JSON).
        file: String,
    },
    /// Reading failed.
    #[error("{at}: cannot read the trace")]
    Io {
        /// Where.
        at: Location,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Storing failed.
    #[error("storing run {run_id}")]
    Store {
        /// The run.
        run_id: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
}

impl ImportError {
    /// The kind, for matching.
    pub fn kind(&self) -> ImportErrorKind {
        match self {
            ImportError::Malformed { .. } => ImportErrorKind::Malformed,
            ImportError::Truncated { .. } => ImportErrorKind::Truncated,
            ImportError::UnknownFormat { .. } => ImportErrorKind::UnknownFormat,
            ImportError::Verification { .. } | ImportError::Order { .. } => ImportErrorKind::Verification,
            ImportError::Conflict { .. }
            | ImportError::HeaderConflict { .. }
            | ImportError::Inherited { .. } => ImportErrorKind::Conflict,
            ImportError::Io { .. } => ImportErrorKind::Io,
            ImportError::Store { .. } => ImportErrorKind::Store,
        }
    }

    /// The CLI exit code: 1 for content that fails verification or conflicts, 2 for bad input.
    pub fn exit_code(&self) -> u8 {
        match self {
            ImportError::Verification { .. }
            | ImportError::Order { .. }
            | ImportError::Conflict { .. }
            | ImportError::Inherited { .. }
            | ImportError::HeaderConflict { .. } => 1,
            ImportError::Store { source, .. }
                if matches!(source.kind, StoreErrorKind::Corrupt | StoreErrorKind::Conflict) =>
            {
                1
            }
            _ => 2,
        }
    }
}

/// What [`ImportError::Inherited`] says: which run is in the file and which in the store.
fn inherited_message(fork: &str, source: &str, seq: u64, detail: &str, fork_in_file: bool) -> String {
    match fork_in_file {
        true => format!(
            "the fork {fork} in the file inherits its first events from run {source}, which this store \
             holds with different events: first difference at seq {seq} ({detail})"
        ),
        false => format!(
            "run {source} in the file differs from the events the fork {fork}, stored here, inherits \
             from it: first difference at seq {seq} ({detail})"
        ),
    }
}

/// Reads a trace from `reader`, verifies all of it, then stores it in `store`.
pub fn import_reader(
    store: &dyn Store,
    reader: impl BufRead,
    mut opts: ImportOptions<'_>,
) -> Result<ImportOutcome, ImportError> {
    let trace = read::read_trace(reader, &mut opts, store)?;
    let mut stats = ImportStats::default();
    let outcome = commit::store_trace(store, trace, opts.chunk_events.max(1), opts.chunk_bytes, &mut stats);
    if let Some(out) = opts.stats {
        *out = stats;
    }
    outcome
}
