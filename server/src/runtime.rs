//! The Tokio runtime the server and the load generator run on.

/// A multi-threaded runtime with `threads` workers (default: one per core).
pub fn build(threads: Option<usize>) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = threads {
        runtime.worker_threads(n.max(1));
    }
    anyhow::Context::context(runtime.enable_all().build(), "starting the runtime")
}
