//! `fencegate demo-store`: the bundled demo store on its own, until Ctrl-C or SIGTERM.

use std::path::Path;

use anyhow::Context;
use fencegate_proxy::demo_store::DemoStore;

use crate::signal::shutdown_signal;

pub async fn run(listen: &str, journal: Option<&Path>) -> anyhow::Result<()> {
    let store = match journal {
        Some(path) => DemoStore::open(path).context("open the demo store's journal")?,
        None => DemoStore::in_memory(),
    };
    let listener = lock_core::api::listen::bind(listen)
        .await
        .with_context(|| format!("bind {listen}"))?;
    println!("demo store on http://{}", listener.local_addr()?);
    store.serve(listener, shutdown_signal()).await?;
    Ok(())
}
