//! `POST /v1/admin/backup {operator}`: the replicated state as one file, streamed.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use hyper::body::{Frame, SizeHint};
use tokio::io::{AsyncRead, ReadBuf};

use super::actions::authorize;
use crate::api::{parse_json, ApiError};
use crate::node::{BackupError, Node};
use crate::raft::SnapshotStream;
use crate::wire::{ErrorCode, OperatorRequest, BACKUP_INDEX_HEADER, BACKUP_TERM_HEADER};

/// Bytes read from the file per body frame.
const CHUNK: usize = 256 << 10;

/// Takes a backup on this node (see `Node::backup`) and streams it. The file holds lease ids
/// and stored responses, so it needs the admin credential like every operator action, and is
/// audited.
pub async fn backup(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: OperatorRequest = parse_json(&body)?;
    authorize(&node, &headers, "backup", &req.operator, None)?;
    let taken = node.backup().await;
    let (outcome, detail) = match &taken {
        Ok((id, _)) => ("done", format!("node {}, log index {}", node.id, id.index)),
        Err(e) => ("failed", format!("node {}: {e}", node.id)),
    };
    node.record_operator_action("backup", &req.operator, None, None, outcome, Some(detail));
    let (id, stream) = taken.map_err(|e| match e {
        BackupError::Unavailable(e) => ApiError::from(e),
        other => ApiError::new(
            ErrorCode::ActionFailed,
            format!("The backup was not taken: {other}."),
        ),
    })?;
    let len = stream.len().await.map_err(|e| {
        ApiError::new(
            ErrorCode::ActionFailed,
            format!("The backup was not taken: reading the snapshot: {e}."),
        )
    })?;
    let mut response = Body::new(FileBody {
        stream,
        buf: vec![0; CHUNK].into_boxed_slice(),
        left: len,
    })
    .into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(BACKUP_TERM_HEADER, HeaderValue::from(id.leader_id.term));
    h.insert(BACKUP_INDEX_HEADER, HeaderValue::from(id.index));
    Ok(response)
}

/// A snapshot file as a response body, read a chunk at a time.
struct FileBody {
    stream: SnapshotStream,
    buf: Box<[u8]>,
    left: u64,
}

impl hyper::body::Body for FileBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        if this.left == 0 {
            return Poll::Ready(None);
        }
        let want = usize::try_from(this.left).map_or(this.buf.len(), |l| l.min(this.buf.len()));
        let mut read = ReadBuf::new(&mut this.buf[..want]);
        ready!(Pin::new(&mut this.stream).poll_read(cx, &mut read))?;
        let n = read.filled().len();
        if n == 0 {
            return Poll::Ready(Some(Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the snapshot file ended early",
            ))));
        }
        this.left -= n as u64;
        Poll::Ready(Some(Ok(Frame::data(Bytes::copy_from_slice(read.filled())))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}
