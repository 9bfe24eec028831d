//! The audit log: one JSON line per lock call and operator action, written to
//! `<data_dir>/audit/audit.log` with size-based rotation (`audit.log.1` … `audit.log.N`), and
//! kept in memory (the newest lines, as written) for the admin UI's audit tail. A node that
//! starts again reads that tail back from its files first.
//!
//! A line is encoded once, straight from borrowed fields, and the encoded line is what the
//! tail keeps: an audited lock call costs one allocation here, not one per field. The tail
//! decodes only the lines it returns (and those a filter has to look at).
//!
//! Durability: every line is one `write` to the file as soon as the call is answered, so a
//! process crash loses nothing already written; operator actions are also fsynced before their
//! answer, so an acknowledged action is on disk even across a power loss. Lock-call lines ride
//! on the OS's write-back instead: an fsync per lock call would double the cost of every
//! commit.
//!
//! Write-back is paced: every [`WRITEBACK_STEP`] bytes the writer asks the kernel to start
//! writing the lines so far (`sync_file_range`, without waiting for it). Left to itself, the
//! kernel writes dirty pages once they are 30 s old, all at once: at the seed workload that was
//! ~30 MiB of audit lines every 30 s, and the raft log's fsyncs, which every commit waits for,
//! queued behind it for 100–400 ms.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::wire::{AuditEntry, AuditLine};

/// Lines kept in memory for the audit tail.
const RECENT: usize = 10_000;
/// Room for a typical line (~200 bytes), so encoding one rarely grows its buffer.
const LINE_CAPACITY: usize = 256;
/// Bytes of lines after which their write-back is started (a few times a second at the seed
/// workload; small enough that a commit's fsync never queues behind much of it).
const WRITEBACK_STEP: u64 = 256 << 10;
const FILE_NAME: &str = "audit.log";

/// What the audit tail filters on; every given field must match exactly.
#[derive(Clone, Debug, Default)]
pub struct AuditFilter {
    pub resource: Option<String>,
    pub outcome: Option<String>,
    pub caller: Option<String>,
    pub holder: Option<String>,
}

impl AuditFilter {
    fn matches(&self, e: &AuditEntry) -> bool {
        let eq = |want: &Option<String>, got: &Option<String>| {
            want.as_ref()
                .is_none_or(|w| got.as_deref() == Some(w.as_str()))
        };
        eq(&self.resource, &e.resource)
            && self.outcome.as_ref().is_none_or(|o| *o == e.outcome)
            && eq(&self.caller, &e.caller)
            && eq(&self.holder, &e.holder)
    }

    /// Text every matching encoded line contains (`"resource":"kv:a"` for a resource filter),
    /// so the tail decodes only lines that may match.
    fn needles(&self) -> Vec<String> {
        [
            ("resource", &self.resource),
            ("outcome", &self.outcome),
            ("caller", &self.caller),
            ("holder", &self.holder),
        ]
        .into_iter()
        .filter_map(|(field, want)| {
            let want = serde_json::to_string(want.as_ref()?).ok()?;
            Some(format!("\"{field}\":{want}"))
        })
        .collect()
    }
}

pub struct AuditLog {
    writer: Mutex<Option<Writer>>,
    /// The newest encoded lines, each with its newline.
    recent: Mutex<VecDeque<String>>,
}

struct Writer {
    dir: PathBuf,
    file: File,
    size: u64,
    /// Where the lines whose write-back has not been started begin.
    written_back: u64,
    max_bytes: u64,
    keep: usize,
    /// Lines lost since the last error logged, and when that was: a disk that refuses every
    /// write is reported once a minute, not once per call.
    failed: u64,
    failure_logged: Option<std::time::Instant>,
}

impl AuditLog {
    /// Opens (appending) the audit log in `dir`, rotating at `max_bytes` and keeping `keep`
    /// rotated files besides the current one.
    pub fn open(dir: &Path, max_bytes: u64, keep: usize) -> std::io::Result<AuditLog> {
        fs::create_dir_all(dir)?;
        let file = open_append(&dir.join(FILE_NAME))?;
        let size = file.metadata()?.len();
        let recent = newest_lines(dir, keep);
        Ok(AuditLog {
            writer: Mutex::new(Some(Writer {
                dir: dir.to_path_buf(),
                file,
                size,
                written_back: size,
                max_bytes: max_bytes.max(1),
                keep,
                failed: 0,
                failure_logged: None,
            })),
            recent: Mutex::new(recent),
        })
    }

    /// Writes one line; `sync` also fsyncs it (operator actions). A failed write is logged
    /// and the line is still shown in the tail: an audit problem must not fail lock calls.
    pub fn record(&self, entry: &AuditLine<'_>, sync: bool) {
        tracing::info!(
            target: "fencegate::audit",
            op = entry.op,
            resource = entry.resource,
            lease = entry.lease_digest,
            token = entry.token,
            caller = entry.caller,
            holder = entry.holder,
            outcome = entry.outcome,
            detail = entry.detail,
        );
        let mut line = Vec::with_capacity(LINE_CAPACITY);
        if let Err(e) = serde_json::to_writer(&mut line, entry) {
            tracing::error!(error = %e, "audit line not serialisable");
            return;
        }
        line.push(b'\n');
        {
            let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(w) = w.as_mut() {
                match w.write(&line, sync) {
                    Err(e) => {
                        w.failed += 1;
                        let quiet = w
                            .failure_logged
                            .is_some_and(|at| at.elapsed() < std::time::Duration::from_secs(60));
                        if !quiet {
                            tracing::error!(error = %e, lines_lost = w.failed, "audit log write failed (reported at most once a minute)");
                            w.failure_logged = Some(std::time::Instant::now());
                        }
                    }
                    Ok(()) if w.failure_logged.is_some() => {
                        tracing::warn!(lines_lost = w.failed, "audit log writes work again");
                        w.failed = 0;
                        w.failure_logged = None;
                    }
                    Ok(()) => {}
                }
            }
        }
        // JSON is UTF-8, so this neither fails nor copies.
        let Ok(line) = String::from_utf8(line) else {
            return;
        };
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if recent.len() == RECENT {
            recent.pop_front();
        }
        recent.push_back(line);
    }

    /// The newest `limit` lines matching `filter`, oldest first.
    pub fn tail(&self, filter: &AuditFilter, limit: usize) -> Vec<AuditEntry> {
        let needles = filter.needles();
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<AuditEntry> = recent
            .iter()
            .rev()
            .filter(|line| needles.iter().all(|n| line.contains(n.as_str())))
            .filter_map(|line| serde_json::from_str::<AuditEntry>(line).ok())
            .filter(|e| filter.matches(e))
            .take(limit)
            .collect();
        out.reverse();
        out
    }
}

impl Writer {
    fn write(&mut self, line: &[u8], sync: bool) -> std::io::Result<()> {
        if self.size > 0 && self.size + line.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        if let Err(e) = self.file.write_all(line) {
            // A line cut short (a full disk) would run into the next one written: cut it off,
            // so the file stays one whole JSON object per line.
            let _ = self.file.set_len(self.size);
            return Err(e);
        }
        self.size += line.len() as u64;
        if sync {
            self.file.sync_data()?;
            self.written_back = self.size;
        } else if self.size - self.written_back >= WRITEBACK_STEP {
            start_writeback(&self.file, self.written_back, self.size - self.written_back);
            self.written_back = self.size;
        }
        Ok(())
    }

    /// `audit.log.{k-1}` → `audit.log.k` down to `audit.log` → `audit.log.1`; the oldest
    /// beyond `keep` is deleted.
    fn rotate(&mut self) -> std::io::Result<()> {
        let path = |i: usize| file_path(&self.dir, i);
        self.file.sync_data()?;
        if self.keep == 0 {
            fs::remove_file(path(0))?;
        } else {
            let _ = fs::remove_file(path(self.keep));
            for i in (0..self.keep).rev() {
                if path(i).exists() {
                    fs::rename(path(i), path(i + 1))?;
                }
            }
        }
        self.file = open_append(&path(0))?;
        self.size = 0;
        self.written_back = 0;
        Ok(())
    }
}

/// The newest lines already on disk (at most [`RECENT`], each read from the last
/// [`TAIL_READ`] bytes of a file), newest file first: a restarted node's audit tail shows what
/// it recorded before. A torn last line (a crash mid-write) and lines that are not JSON are left
/// out; a file that cannot be read is skipped.
fn newest_lines(dir: &Path, keep: usize) -> VecDeque<String> {
    let mut lines = VecDeque::new();
    for i in 0..=keep {
        let Ok(text) = read_tail(&file_path(dir, i)) else {
            continue;
        };
        let newest_first = text
            .split_inclusive('\n')
            .rev()
            .filter(|l| l.ends_with('\n') && l.starts_with('{'))
            .take(RECENT - lines.len());
        for line in newest_first {
            lines.push_front(line.to_string());
        }
        if lines.len() == RECENT {
            break;
        }
    }
    lines
}

/// `audit.log` (`i` = 0), or the rotated `audit.log.i`.
fn file_path(dir: &Path, i: usize) -> PathBuf {
    if i == 0 {
        dir.join(FILE_NAME)
    } else {
        dir.join(format!("{FILE_NAME}.{i}"))
    }
}

/// Bytes read from the end of each audit file for the tail at start.
const TAIL_READ: u64 = 4 << 20;

/// The last [`TAIL_READ`] bytes of `path`, from the first line that starts in them.
fn read_tail(path: &Path) -> std::io::Result<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let from = len.saturating_sub(TAIL_READ);
    file.seek(SeekFrom::Start(from))?;
    let mut bytes = Vec::with_capacity((len - from) as usize);
    file.read_to_end(&mut bytes)?;
    let start = if from == 0 {
        0
    } else {
        bytes
            .iter()
            .position(|b| *b == b'\n')
            .map_or(bytes.len(), |at| at + 1)
    };
    Ok(String::from_utf8_lossy(&bytes[start..]).into_owned())
}

/// Starts writing `len` bytes of `file` from `offset` to disk and returns without waiting.
/// Only a pacing hint: a failure changes nothing the log promises, so it is only logged.
#[cfg(target_os = "linux")]
fn start_writeback(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain syscall on a file descriptor this writer owns; no memory is passed.
    let rc = unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        )
    };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "audit write-back hint failed");
    }
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &File, _offset: u64, _len: u64) {}

/// Opens an audit file for appending, created readable by the node's user only: it names
/// every resource, holder and caller (files from before keep their mode).
fn open_append(path: &Path) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(i: u64, resource: &str, outcome: &str) -> AuditEntry {
        AuditEntry {
            time_ms: i,
            node_id: 1,
            op: "acquire".into(),
            resource: Some(resource.into()),
            lease_digest: Some(format!("{i:016x}")),
            token: Some(i),
            caller: Some("worker".into()),
            holder: Some(format!("holder-{}", i % 3)),
            outcome: outcome.into(),
            detail: None,
        }
    }

    fn lines(path: &Path) -> Vec<AuditEntry> {
        fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("each line is one JSON entry"))
            .collect()
    }

    /// Rotation keeps at most `keep` old files, every file stays under the size bound (one
    /// line may start a file), and reopening appends instead of truncating.
    #[test]
    fn rotates_by_size_keeps_n_files_and_reopens_appending() {
        let dir = tempfile::tempdir().expect("tempdir");
        let one = one_line_len(100);
        let log = AuditLog::open(dir.path(), one * 3, 2).expect("open");
        for i in 100..110 {
            log.record(&entry(i, "kv:a", "granted").line(), false);
        }
        let current = lines(&dir.path().join("audit.log"));
        let r1 = lines(&dir.path().join("audit.log.1"));
        let r2 = lines(&dir.path().join("audit.log.2"));
        assert!(!dir.path().join("audit.log.3").exists(), "only 2 kept");
        assert_eq!(current.len(), 1);
        assert_eq!((r1.len(), r2.len()), (3, 3));
        assert_eq!(current[0].time_ms, 109);
        assert_eq!(r1[0].time_ms, 106);
        assert_eq!(r2[0].time_ms, 103);
        #[cfg(unix)]
        for name in ["audit.log", "audit.log.1", "audit.log.2"] {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(dir.path().join(name))
                .expect("stat")
                .permissions();
            assert_eq!(mode.mode() & 0o777, 0o600, "{name} is readable by others");
        }
        drop(log);

        let log = AuditLog::open(dir.path(), one * 3, 2).expect("reopen");
        log.record(&entry(110, "kv:b", "lock_held").line(), true);
        let current = lines(&dir.path().join("audit.log"));
        assert_eq!(
            current.iter().map(|e| e.time_ms).collect::<Vec<_>>(),
            [109, 110]
        );
    }

    /// A reopened log's tail holds the lines written before, across a rotation, in order,
    /// without a torn last line, and at most `RECENT` of them.
    #[test]
    fn a_reopened_log_shows_the_lines_written_before() {
        let dir = tempfile::tempdir().expect("tempdir");
        let one = one_line_len(100);
        let log = AuditLog::open(dir.path(), one * 4, 2).expect("open");
        for i in 100..106 {
            log.record(&entry(i, "kv:a", "granted").line(), false);
        }
        drop(log);
        // A crash in the middle of a line.
        let mut torn = OpenOptions::new()
            .append(true)
            .open(dir.path().join("audit.log"))
            .expect("open");
        torn.write_all(b"{\"time_ms\":1").expect("write");
        drop(torn);
        let log = AuditLog::open(dir.path(), one * 4, 2).expect("reopen");
        let times = |log: &AuditLog| -> Vec<u64> {
            log.tail(&AuditFilter::default(), 100)
                .iter()
                .map(|e| e.time_ms)
                .collect()
        };
        assert_eq!(times(&log), (100..106).collect::<Vec<_>>());
        drop(log);

        let dir = tempfile::tempdir().expect("tempdir");
        let log = AuditLog::open(dir.path(), 1 << 30, 1).expect("open");
        for i in 0..(RECENT as u64 + 5) {
            log.record(&entry(i, "kv:a", "granted").line(), false);
        }
        drop(log);
        let log = AuditLog::open(dir.path(), 1 << 30, 1).expect("reopen");
        let kept = log.recent.lock().expect("recent").len();
        assert_eq!(kept, RECENT);
        assert_eq!(times(&log).first(), Some(&(RECENT as u64 + 5 - 100)));
    }

    /// Write-back is started every step of unsynced bytes, never later, and an fsynced line
    /// starts the count again.
    #[test]
    fn write_back_is_started_every_step() {
        let dir = tempfile::tempdir().expect("tempdir");
        let line = vec![b'x'; 1000];
        let log = AuditLog::open(dir.path(), 1 << 30, 1).expect("open");
        let pending = || {
            let w = log.writer.lock().expect("writer");
            let w = w.as_ref().expect("open writer");
            w.size - w.written_back
        };
        let mut most = 0;
        for _ in 0..1_000 {
            log.writer
                .lock()
                .expect("writer")
                .as_mut()
                .expect("open writer")
                .write(&line, false)
                .expect("write");
            most = most.max(pending());
        }
        assert!(most < WRITEBACK_STEP, "{most} bytes waited for write-back");
        assert!(
            pending() > 0,
            "1,000,000 bytes are not a whole number of steps"
        );
        log.record(&entry(1, "kv:a", "granted").line(), true);
        assert_eq!(pending(), 0, "an fsynced line leaves nothing pending");
        assert_eq!(
            fs::metadata(dir.path().join("audit.log"))
                .expect("file")
                .len(),
            1_000_000 + one_line_len(1)
        );
    }

    fn one_line_len(i: u64) -> u64 {
        serde_json::to_vec(&entry(i, "kv:a", "granted"))
            .expect("json")
            .len() as u64
            + 1
    }

    /// Filters compare whole field values, also when they hold characters JSON escapes, and
    /// a value that only appears inside another field does not match.
    #[test]
    fn tail_filters_match_whole_values_with_escaped_characters() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = AuditLog::open(dir.path(), 1 << 20, 1).expect("open");
        let mut odd = entry(1, "kv:a", "granted");
        odd.caller = Some("ana \"the\" admin\\".into());
        log.record(&odd.line(), false);
        let mut nested = entry(2, "kv:b", "granted");
        nested.caller = Some("\"resource\":\"kv:a\"".into());
        log.record(&nested.line(), false);
        let mut prefix = entry(3, "kv:a:more", "granted");
        prefix.caller = Some("ana \"the\" admin\\ and more".into());
        log.record(&prefix.line(), false);

        let by = |resource: Option<&str>, caller: Option<&str>| {
            let f = AuditFilter {
                resource: resource.map(str::to_string),
                caller: caller.map(str::to_string),
                ..Default::default()
            };
            log.tail(&f, 10)
                .into_iter()
                .map(|e| e.time_ms)
                .collect::<Vec<_>>()
        };
        assert_eq!(by(None, Some("ana \"the\" admin\\")), [1]);
        assert_eq!(by(Some("kv:a"), None), [1]);
        assert_eq!(by(Some("kv:a:more"), None), [3]);
        assert_eq!(by(None, Some("\"resource\":\"kv:a\"")), [2]);
        assert_eq!(log.tail(&AuditFilter::default(), 10)[0], odd);
    }

    #[test]
    fn tail_filters_and_returns_the_newest_oldest_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = AuditLog::open(dir.path(), 1 << 20, 1).expect("open");
        for i in 0..10 {
            let res = if i % 2 == 0 { "kv:even" } else { "kv:odd" };
            log.record(
                &entry(i, res, if i < 5 { "granted" } else { "lock_held" }).line(),
                false,
            );
        }
        let f = AuditFilter {
            resource: Some("kv:even".into()),
            ..Default::default()
        };
        let got: Vec<u64> = log.tail(&f, 3).iter().map(|e| e.time_ms).collect();
        assert_eq!(got, [4, 6, 8]);
        let f = AuditFilter {
            outcome: Some("lock_held".into()),
            caller: Some("worker".into()),
            ..Default::default()
        };
        assert_eq!(log.tail(&f, 100).len(), 5);
        let f = AuditFilter {
            holder: Some("holder-1".into()),
            ..Default::default()
        };
        let got: Vec<u64> = log.tail(&f, 100).iter().map(|e| e.time_ms).collect();
        assert_eq!(got, [1, 4, 7]);
        let f = AuditFilter {
            caller: Some("nobody".into()),
            ..Default::default()
        };
        assert!(log.tail(&f, 100).is_empty());
    }
}
