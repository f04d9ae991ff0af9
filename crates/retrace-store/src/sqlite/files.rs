//! Where blob bytes live besides rows: the blob folder for blobs over
//! [`INLINE_BLOB_MAX`](crate::INLINE_BLOB_MAX) (written atomically and fsynced), and a small
//! cache of recently rebuilt model requests.
use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use retrace_core::Digest;

use crate::error::ResultExt;
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

    /// Writes `bytes` to the blob's file atomically (temp file, fsync, rename, fsync of the
    /// folder) and returns its path relative to the blob folder.
    pub(crate) fn write(&self, digest: &Digest, bytes: &[u8]) -> StoreResult<String> {
        let relative = Files::relative_path(digest);
        let path = self.dir.join(&relative);
        let folder = path.parent().unwrap_or(&self.dir);
        let what = || format!("writing blob {digest} to {}", path.display());
        let created = !folder.exists();
        std::fs::create_dir_all(folder).ctx(what)?;
        if created && self.durable {
            sync_dir(&self.dir).ctx(what)?;
        }
        let mut temp = tempfile::Builder::new().prefix(".tmp-").tempfile_in(folder).ctx(what)?;
        temp.write_all(bytes).ctx(what)?;
        if self.durable {
            temp.as_file().sync_data().ctx(what)?;
        }
        temp.persist(&path).map_err(|e| StoreError::from_io(e.error, what()))?;
        if self.durable {
            sync_dir(folder).ctx(what)?;
        }
        Ok(relative)
    }

    /// The bytes of the file at `relative`; a missing file is `Corrupt` (its row says it exists).
    pub(crate) fn read(&self, digest: &Digest, relative: &str) -> StoreResult<(Vec<u8>, PathBuf)> {
        let path = self.dir.join(relative);
        match std::fs::read(&path) {
            Ok(bytes) => Ok((bytes, path)),
            Err(e) => {
                let missing = e.kind() == std::io::ErrorKind::NotFound;
                let err = StoreError::from_io(e, format!("reading blob {digest} from {}", path.display()));
                Err(if missing { StoreError { kind: crate::StoreErrorKind::Corrupt, ..err } } else { err })
            }
        }
    }

    /// A recently rebuilt request.
    pub(crate) fn recent(&self, digest: &Digest) -> Option<Arc<[u8]>> {
        self.recent.lock().iter().find(|(d, _)| d == digest).map(|(_, bytes)| Arc::clone(bytes))
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

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}
