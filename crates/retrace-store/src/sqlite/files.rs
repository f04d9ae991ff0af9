//! Where blob bytes live besides rows: the blob folder for blobs over
//! [`INLINE_BLOB_MAX`](crate::INLINE_BLOB_MAX) (written atomically and fsynced by
//! [`super::staged`]), and a small cache of recently rebuilt model requests.
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use retrace_core::Digest;

use crate::{StoreError, StoreResult};

/// How many rebuilt requests the cache keeps, and how many bytes at most.
const RECENT_ENTRIES: usize = 8;
const RECENT_BYTES: usize = 64 << 20;

/// The blob folder, whether writes are fsynced, the segment size for packing, and the cache.
#[derive(Debug)]
pub(crate) struct Files {
    pub(crate) dir: PathBuf,
    pub(crate) durable: bool,
    pub(crate) segment_bytes: usize,
    /// Recently rebuilt requests (verified): reading a conversation's requests in order then
    /// costs each only its new messages, since each builds on the one before.
    recent: Mutex<VecDeque<(Digest, Arc<[u8]>)>>,
}

impl Files {
    pub(crate) fn new(dir: PathBuf, durable: bool, segment_bytes: usize) -> Files {
        Files { dir, durable, segment_bytes, recent: Mutex::new(VecDeque::new()) }
    }

    /// The file of a large blob: `ab/cdef…` for digest `sha256:abcdef…`.
    pub(crate) fn relative_path(digest: &Digest) -> String {
        let hex = digest.hex();
        format!("{}/{}", &hex[..2], &hex[2..])
    }

    /// The bytes of the file at `relative`; a missing file, or a folder in its place, is
    /// `Corrupt` (its row says the file exists).
    pub(crate) fn read(&self, digest: &Digest, relative: &str) -> StoreResult<(Vec<u8>, PathBuf)> {
        let path = self.dir.join(relative);
        match std::fs::read(&path) {
            Ok(bytes) => Ok((bytes, path)),
            Err(e) => {
                let missing =
                    matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::IsADirectory);
                let err = StoreError::from_io(e, format!("reading blob {digest} from {}", path.display()));
                if !missing {
                    return Err(err);
                }
                let mut err = StoreError { kind: crate::StoreErrorKind::Corrupt, ..err };
                if let Some(hint) = self.elsewhere() {
                    err.message = format!("{}; {hint}", err.message);
                }
                Err(err)
            }
        }
    }

    /// What to say of a missing blob file when the folder holds no large blob at all: the store
    /// most likely wrote them to another folder (`RETRACE_BLOBS` set when they were recorded,
    /// and not now), rather than lost them.
    fn elsewhere(&self) -> Option<String> {
        let holds_blobs = std::fs::read_dir(&self.dir).is_ok_and(|entries| {
            entries.flatten().any(|e| e.file_type().is_ok_and(|t| t.is_dir()) && e.file_name().len() == 2)
        });
        match holds_blobs {
            true => None,
            false => Some(format!(
                "the blob folder {} holds no large blobs: if they were recorded with RETRACE_BLOBS set to \
                 another folder, set it again",
                self.dir.display()
            )),
        }
    }

    /// A recently rebuilt request.
    pub(crate) fn recent(&self, digest: &Digest) -> Option<Arc<[u8]>> {
        self.recent.lock().iter().find(|(d, _)| d == digest).map(|(_, bytes)| Arc::clone(bytes))
    }

    /// Forgets every rebuilt request (after garbage collection deleted blobs).
    pub(crate) fn forget_all(&self) {
        self.recent.lock().clear();
    }

    /// Remembers a rebuilt (and verified) request.
    pub(crate) fn remember(&self, digest: Digest, bytes: Arc<[u8]>) {
        if bytes.len() > RECENT_BYTES / 2 {
            return;
        }
        let mut recent = self.recent.lock();
        recent.retain(|(d, _)| *d != digest);
        recent.push_back((digest, bytes));
        while recent.len() > RECENT_ENTRIES
            || recent.iter().map(|(_, b)| b.len()).sum::<usize>() > RECENT_BYTES
        {
            recent.pop_front();
        }
    }
}

/// The bytes an unprivileged writer may still use on the disk holding `folder`.
pub(crate) fn free_bytes(folder: &Path) -> Option<u64> {
    let stat = nix::sys::statvfs::statvfs(folder).ok()?;
    Some((stat.blocks_available() as u64).saturating_mul(stat.fragment_size() as u64))
}

/// Syncs a folder, so that the names created in it are durable.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}
