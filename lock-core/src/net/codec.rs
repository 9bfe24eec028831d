//! The peer wire format: how raft RPCs, forwarded commands and their replies are encoded
//! between nodes.
//!
//! Every peer body starts with a one-byte format version, so a node that meets a body from a
//! newer or older format refuses it with a clear error instead of misreading it. After the
//! version comes MessagePack with named fields (field names cost a few bytes, but a field
//! added with a serde default still decodes on a node that does not know it yet).
//!
//! Snapshot chunks are framed apart: their bytes follow a small MessagePack header raw, so a
//! chunk costs its own size on the wire (serde would write a byte array as a list of numbers,
//! up to four times larger in JSON).

use openraft::raft::InstallSnapshotRequest;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::raft::{NodeInfo, TypeConfig};

/// Version of the peer wire format; the first byte of every peer body.
pub const FORMAT_VERSION: u8 = 1;

/// The `Content-Type` of peer bodies.
pub const CONTENT_TYPE: &str = "application/x-fencegate-peer";

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    #[error("empty peer message")]
    Empty,
    #[error("peer message format {got}, this node speaks {FORMAT_VERSION}")]
    Version { got: u8 },
    #[error("cannot encode peer message: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
    #[error("cannot decode peer message: {0}")]
    Decode(#[from] rmp_serde::decode::Error),
    #[error("truncated snapshot chunk frame")]
    Truncated,
}

/// Encodes `value` as a versioned peer body.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![FORMAT_VERSION];
    rmp_serde::encode::write_named(&mut out, value)?;
    Ok(out)
}

/// Decodes a versioned peer body.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    Ok(rmp_serde::from_slice(body(bytes)?)?)
}

fn body(bytes: &[u8]) -> Result<&[u8], CodecError> {
    match bytes.split_first() {
        None => Err(CodecError::Empty),
        Some((&FORMAT_VERSION, rest)) => Ok(rest),
        Some((&got, _)) => Err(CodecError::Version { got }),
    }
}

/// Everything of a snapshot chunk but its bytes.
#[derive(Serialize, Deserialize)]
struct ChunkHeader {
    vote: openraft::Vote<u64>,
    meta: openraft::SnapshotMeta<u64, NodeInfo>,
    offset: u64,
    done: bool,
}

/// Frames a snapshot chunk: version, header length (u32 big-endian), header, raw bytes.
pub fn encode_snapshot_chunk(
    req: &InstallSnapshotRequest<TypeConfig>,
) -> Result<Vec<u8>, CodecError> {
    let header = rmp_serde::to_vec_named(&ChunkHeader {
        vote: req.vote,
        meta: req.meta.clone(),
        offset: req.offset,
        done: req.done,
    })?;
    let header_len = u32::try_from(header.len()).map_err(|_| CodecError::Truncated)?;
    let mut out = Vec::with_capacity(1 + 4 + header.len() + req.data.len());
    out.push(FORMAT_VERSION);
    out.extend_from_slice(&header_len.to_be_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(&req.data);
    Ok(out)
}

/// Reads a frame written by [`encode_snapshot_chunk`].
pub fn decode_snapshot_chunk(
    bytes: &[u8],
) -> Result<InstallSnapshotRequest<TypeConfig>, CodecError> {
    let rest = body(bytes)?;
    let (len, rest) = rest.split_first_chunk::<4>().ok_or(CodecError::Truncated)?;
    let len = usize::try_from(u32::from_be_bytes(*len)).map_err(|_| CodecError::Truncated)?;
    if rest.len() < len {
        return Err(CodecError::Truncated);
    }
    let (header, data) = rest.split_at(len);
    let header: ChunkHeader = rmp_serde::from_slice(header)?;
    Ok(InstallSnapshotRequest {
        vote: header.vote,
        meta: header.meta,
        offset: header.offset,
        data: data.to_vec(),
        done: header.done,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, LogId, SnapshotMeta, StoredMembership, Vote};

    fn chunk(data: Vec<u8>) -> InstallSnapshotRequest<TypeConfig> {
        InstallSnapshotRequest {
            vote: Vote::new_committed(3, 1),
            meta: SnapshotMeta {
                last_log_id: Some(LogId::new(CommittedLeaderId::new(3, 1), 40_000)),
                last_membership: StoredMembership::default(),
                snapshot_id: "3-40000-2".to_string(),
            },
            offset: 1 << 20,
            data,
            done: true,
        }
    }

    #[test]
    fn snapshot_chunk_round_trips_and_costs_its_own_size() {
        let data: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
        let req = chunk(data.clone());
        let frame = encode_snapshot_chunk(&req).expect("encode");
        assert!(
            frame.len() < data.len() + 200,
            "frame is {} bytes",
            frame.len()
        );
        let back = decode_snapshot_chunk(&frame).expect("decode");
        assert_eq!(back.data, data);
        assert_eq!(back.offset, req.offset);
        assert_eq!(back.meta, req.meta);
        assert_eq!(back.vote, req.vote);
        assert!(back.done);
    }

    #[test]
    fn other_versions_and_truncated_frames_are_refused() {
        let mut frame = encode_snapshot_chunk(&chunk(vec![1, 2, 3])).expect("encode");
        assert!(matches!(
            decode_snapshot_chunk(&frame[..3]),
            Err(CodecError::Truncated)
        ));
        frame[0] = FORMAT_VERSION + 1;
        assert!(matches!(
            decode_snapshot_chunk(&frame),
            Err(CodecError::Version { .. })
        ));
        assert!(matches!(decode::<u64>(&[]), Err(CodecError::Empty)));
    }

    #[test]
    fn messages_round_trip() {
        let vote = Vote::<u64>::new(7, 2);
        let back: Vote<u64> = decode(&encode(&vote).expect("encode")).expect("decode");
        assert_eq!(back, vote);
    }
}

/// Bad input from the network never panics a decoder: random bytes, truncated and bit-flipped
/// frames either decode or fail with an error.
#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest, VoteResponse};

    use super::*;
    use crate::machine::{Batch, Command};

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::testkit::fuzz_cases(2_000)))]

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode::<Command>(&bytes);
            let _ = decode::<Vec<Command>>(&bytes);
            let _ = decode_snapshot_chunk(&bytes);
            // Every message the peer port decodes, and what it answers with.
            let _ = decode::<AppendEntriesRequest<TypeConfig>>(&bytes);
            let _ = decode::<AppendEntriesResponse<u64>>(&bytes);
            let _ = decode::<VoteRequest<u64>>(&bytes);
            let _ = decode::<VoteResponse<u64>>(&bytes);
            let _ = decode::<Batch>(&bytes);
        }

        /// A real append with a batch of commands, damaged: it decodes to something or fails
        /// with an error.
        #[test]
        fn damaged_appends_never_panic(cut in 0usize..256, flip in 0usize..4096, bit in 0u8..8) {
            let batch = Batch::new(5, 7, vec![
                Command::Tick { max_items: 7 },
                Command::Release { resource: "kv:a".into(), lease_id: crate::wire::LeaseId(9) },
            ]);
            let entry = openraft::Entry::<TypeConfig> {
                log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(3, 1), 42),
                payload: openraft::EntryPayload::Normal(batch),
            };
            let append = AppendEntriesRequest::<TypeConfig> {
                vote: openraft::Vote::new_committed(3, 1),
                prev_log_id: None,
                entries: vec![entry],
                leader_commit: None,
            };
            let mut frame = encode(&append).expect("encode");
            let at = flip % frame.len().max(1);
            if let Some(b) = frame.get_mut(at) {
                *b ^= 1 << bit;
            }
            frame.truncate(frame.len().saturating_sub(cut % 32));
            let _ = decode::<AppendEntriesRequest<TypeConfig>>(&frame);
        }

        #[test]
        fn damaged_frames_never_panic(cut in 0usize..64, flip in 0usize..64, bit in 0u8..8) {
            let cmd = Command::Tick { max_items: 7 };
            let mut frame = encode(&cmd).expect("encode");
            let at = flip % frame.len().max(1);
            if let Some(b) = frame.get_mut(at) {
                *b ^= 1 << bit;
            }
            frame.truncate(frame.len().saturating_sub(cut % 8));
            let _ = decode::<Command>(&frame);
        }
    }
}
