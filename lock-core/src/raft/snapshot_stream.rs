//! The bytes of a snapshot as openraft moves them: a file on disk, never a buffer in memory.
//!
//! A snapshot of the seed state is tens of megabytes (hundreds with a full retry window); a
//! leader sends it chunk by chunk from a file and a follower writes the chunks into a file,
//! so neither holds it in memory and there is no size ceiling.

use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};

/// A snapshot file opened for reading (to send it) or writing (while it is received).
pub struct SnapshotStream {
    file: tokio::fs::File,
    /// A file that exists only for this stream (one being received, or one prepared for a
    /// single transfer). It is removed when the stream is dropped, unless [`keep`](Self::keep)
    /// took it: an abandoned transfer leaves nothing behind.
    temporary: Option<PathBuf>,
}

impl SnapshotStream {
    /// A stream over a file that outlives it (the node's current snapshot).
    pub fn durable(file: std::fs::File) -> Self {
        SnapshotStream {
            file: tokio::fs::File::from_std(file),
            temporary: None,
        }
    }

    /// A stream over the file at `path`, which is removed with the stream.
    pub fn temporary(file: std::fs::File, path: PathBuf) -> Self {
        SnapshotStream {
            file: tokio::fs::File::from_std(file),
            temporary: Some(path),
        }
    }

    /// The file's length in bytes.
    pub async fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata().await?.len())
    }

    /// The path of the temporary file, which from now on is the caller's to keep or remove.
    /// `None` for a durable file.
    pub fn keep(&mut self) -> Option<PathBuf> {
        self.temporary.take()
    }
}

impl Drop for SnapshotStream {
    fn drop(&mut self) {
        if let Some(path) = self.temporary.take() {
            // Best effort: a leftover is also removed when the node next opens its storage.
            let _ = std::fs::remove_file(path);
        }
    }
}

impl AsyncRead for SnapshotStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_read(cx, buf)
    }
}

impl AsyncWrite for SnapshotStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.file).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_shutdown(cx)
    }
}

impl AsyncSeek for SnapshotStream {
    fn start_seek(mut self: Pin<&mut Self>, position: io::SeekFrom) -> io::Result<()> {
        Pin::new(&mut self.file).start_seek(position)
    }

    fn poll_complete(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        Pin::new(&mut self.file).poll_complete(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn a_temporary_file_goes_with_its_stream_unless_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("receiving-1.tmp");
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        let mut stream = SnapshotStream::temporary(file, path.clone());
        stream.write_all(b"chunk one, ").await.unwrap();
        stream.write_all(b"chunk two").await.unwrap();
        stream.shutdown().await.unwrap();
        stream.seek(io::SeekFrom::Start(6)).await.unwrap();
        let mut back = String::new();
        stream.read_to_string(&mut back).await.unwrap();
        assert_eq!(back, "one, chunk two");
        drop(stream);
        assert!(!path.exists(), "an abandoned transfer leaves no file");

        let file = std::fs::File::create(&path).unwrap();
        let mut stream = SnapshotStream::temporary(file, path.clone());
        assert_eq!(stream.keep(), Some(path.clone()));
        drop(stream);
        assert!(path.exists(), "a kept file stays");
    }
}
