//! openraft's storage conformance suite against the fjall log store and state machine. Each
//! case gets a fresh database in its own temp dir.

use std::sync::Arc;

use lock_core::raft::TypeConfig;
use lock_core::store::{self, LogStore, StateMachineStore};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{AnyError, StorageError, StorageIOError};
use tempfile::TempDir;

struct FjallBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for FjallBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError<u64>> {
        let dir = TempDir::new().map_err(|e| StorageIOError::write(AnyError::new(&e)))?;
        let (log, sm) = store::open(dir.path(), Arc::new(|_, _| {}))
            .map_err(|e| StorageIOError::write(AnyError::new(&e)))?;
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_storage_suite() -> anyhow::Result<()> {
    Suite::test_all(FjallBuilder)?;
    Ok(())
}
