//! `fencegate demo-store`: the bundled demo store on its own, until Ctrl-C or SIGTERM.

use anyhow::Context;

use crate::signal::shutdown_signal;

pub async fn run(listen: &str) -> anyhow::Result<()> {
    let listener = lock_core::api::listen::bind(listen)
        .await
        .with_context(|| format!("bind {listen}"))?;
    println!("demo store on http://{}", listener.local_addr()?);
    fencegate_proxy::demo_store::serve(listener, shutdown_signal()).await?;
    Ok(())
}
