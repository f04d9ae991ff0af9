//! What one write transaction stages besides its rows: its packed blobs' segments (written by
//! [`Packer`] once each, see [`super::pack`]) and the files of its large blobs. Each file is
//! written to a temporary file as its blob is put; [`Staged::finish`] then makes them all
//! durable at once, before the transaction commits: every file's data synced (several at a
//! time, so the waits overlap), renamed into place, and each folder synced once, however many
//! files it received. A blob's file is durable before the commit that references it, as
//! before; a batch of many large blobs just waits for the disk far fewer times.
use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;

use retrace_core::digest_map::DigestMap;
use retrace_core::Digest;
use rusqlite::Connection;
use tempfile::NamedTempFile;

use super::files::{sync_dir, Files};
use super::pack::Packer;
use super::tail::Tail;
use crate::error::ResultExt;
use crate::{StoreError, StoreResult};

/// Files synced at once by [`Staged::finish`].
const SYNC_THREADS: usize = 8;

/// A blob file written but not yet durable: the temporary file, and where it goes.
struct StagedFile {
    temp: NamedTempFile,
    path: PathBuf,
    what: String,
}

/// The large blob files of one transaction.
pub(crate) struct Staged<'a> {
    pub(crate) files: &'a Files,
    staged: Vec<StagedFile>,
    folders: BTreeSet<PathBuf>,
    created_folder: bool,
    /// The transaction's packed blobs.
    packer: Packer,
    /// Blob row ids this transaction knows (`None`: not stored), looked up or inserted.
    pub(crate) known: DigestMap<Option<i64>>,
    /// The blobs this transaction inserted (their files and packed bytes are not in place yet).
    pub(crate) inserted: std::collections::HashSet<Digest>,
    /// The write connection's copy of the blobs not yet indexed, caught up in this
    /// transaction: with the digest tables, it says whether a digest is stored.
    pub(crate) tail: &'a mut Tail,
}

impl<'a> Staged<'a> {
    pub(crate) fn new(files: &'a Files, tail: &'a mut Tail) -> Staged<'a> {
        let packer = Packer::new(files.segment_bytes);
        Staged {
            files,
            staged: Vec::new(),
            folders: BTreeSet::new(),
            created_folder: false,
            packer,
            known: DigestMap::default(),
            inserted: std::collections::HashSet::new(),
            tail,
        }
    }

    /// Where [`Staged::pack`] will put the next blob's bytes.
    pub(crate) fn next_pack_location(&mut self, tx: &Connection) -> StoreResult<i64> {
        self.packer.next_location(tx)
    }

    /// Packs `bytes` into the segments (see [`Packer`]) and returns their location.
    pub(crate) fn pack(&mut self, tx: &Connection, bytes: &[u8]) -> StoreResult<i64> {
        self.packer.append(tx, bytes)
    }

    /// Writes `bytes` to a temporary file beside the blob's file and returns the path of that
    /// file relative to the blob folder; [`Staged::finish`] puts it there.
    pub(crate) fn write(&mut self, digest: &Digest, bytes: &[u8]) -> StoreResult<String> {
        let relative = Files::relative_path(digest);
        let path = self.files.dir.join(&relative);
        let folder = path.parent().unwrap_or(&self.files.dir).to_path_buf();
        let what = format!("writing blob {digest} to {}", path.display());
        if !folder.exists() {
            std::fs::create_dir_all(&folder).ctx(|| what.clone())?;
            self.created_folder = true;
        }
        // Readable as the database is (0644 less the umask), not tempfile's 0600: another user
        // of a shared store who can read its database can read its large blobs too (QA21 D2).
        let mut temp = tempfile::Builder::new()
            .prefix(".tmp-")
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .tempfile_in(&folder)
            .ctx(|| what.clone())?;
        temp.write_all(bytes).ctx(|| what.clone())?;
        self.folders.insert(folder);
        self.staged.push(StagedFile { temp, path, what });
        Ok(relative)
    }

    /// Whether this transaction has staged a file for `path` already.
    pub(crate) fn stages(&self, path: &std::path::Path) -> bool {
        self.staged.iter().any(|f| f.path == path)
    }

    /// Writes the packed segments into `tx`, then makes every staged file durable (when the
    /// store syncs) and puts it in place.
    pub(crate) fn finish(self, tx: &Connection) -> StoreResult<()> {
        self.packer.finish(tx)?;
        let durable = self.files.durable;
        if durable {
            sync_all(&self.staged)?;
        }
        for file in self.staged {
            let StagedFile { temp, path, what } = file;
            temp.persist(&path).map_err(|e| StoreError::from_io(e.error, what))?;
        }
        if durable {
            if self.created_folder {
                sync_dir(&self.files.dir)
                    .ctx(|| format!("syncing the blob folder {}", self.files.dir.display()))?;
            }
            let folders: Vec<PathBuf> = self.folders.into_iter().collect();
            in_parallel(&folders, |folder| {
                sync_dir(folder).ctx(|| format!("syncing the blob folder {}", folder.display()))
            })?;
        }
        Ok(())
    }
}

/// Syncs the data of every staged file, several at a time.
fn sync_all(staged: &[StagedFile]) -> StoreResult<()> {
    in_parallel(staged, |f| f.temp.as_file().sync_data().ctx(|| f.what.clone()))
}

/// Runs `f` on every item, spread over up to [`SYNC_THREADS`] threads (inline for one item);
/// the first error wins.
fn in_parallel<T: Sync>(items: &[T], f: impl Fn(&T) -> StoreResult<()> + Sync) -> StoreResult<()> {
    if items.len() <= 1 {
        return items.iter().try_for_each(&f);
    }
    let per_thread = items.len().div_ceil(SYNC_THREADS);
    std::thread::scope(|scope| {
        let workers: Vec<_> =
            items.chunks(per_thread).map(|chunk| scope.spawn(|| chunk.iter().try_for_each(&f))).collect();
        workers.into_iter().try_for_each(|w| w.join().expect("a sync thread never panics"))
    })
}
