//! Starting the write of a file's dirty pages without an fsync.
//!
//! A file written in large amounts and left to the kernel goes to the disk in one burst once its
//! pages are 30 s old; an `fsync` every few steps instead bounds the burst, but on ext4 (and
//! other journalling file systems) each `fsync` of a file that grew commits the file system's
//! journal, and the raft log's own fsyncs, which every commit waits for, queue behind each of
//! those commits. `sync_file_range` writes the data pages and nothing else: no metadata, no
//! journal commit. It promises no durability; a file that must be durable is still synced
//! once, at its end.

use std::fs::File;
use std::io;

/// Starts writing `len` bytes of `file` from `offset` to disk. With `wait`, first waits for
/// any write of that range already under way and then for this one: a writer that starts one
/// step and waits for the step before it keeps at most two steps queued at the disk. A `len`
/// of 0 means to the end of the file.
#[cfg(target_os = "linux")]
pub(crate) fn write_range(file: &File, offset: u64, len: u64, wait: bool) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let flags = if wait {
        libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER
    } else {
        libc::SYNC_FILE_RANGE_WRITE
    };
    let (Ok(offset), Ok(len)) = (
        libc::off64_t::try_from(offset),
        libc::off64_t::try_from(len),
    ) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "range beyond off64_t",
        ));
    };
    // SAFETY: a plain syscall on a file descriptor the caller owns; no memory is passed.
    let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, flags) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn write_range(_file: &File, _offset: u64, _len: u64, _wait: bool) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "no sync_file_range here",
    ))
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn starts_and_waits_for_a_range_and_refuses_one_beyond_the_offsets() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut file = File::create(dir.path().join("f")).expect("create");
        file.write_all(&[7u8; 1 << 16]).expect("write");
        write_range(&file, 0, 1 << 15, false).expect("start");
        write_range(&file, 0, 1 << 16, true).expect("start and wait");
        let err = write_range(&file, u64::MAX, 1, false).expect_err("beyond off64_t");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
}
