use clap::Parser;

// mimalloc: the decision path allocates small, short-lived buffers per call;
// glibc's malloc spent about a sixth of the server's time on them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Gives the calling thread's free memory back to the system: mimalloc
/// returns the pages it holds empty and collects what exited threads left.
#[allow(unsafe_code)]
fn release_memory() {
    // SAFETY: mi_collect takes no pointer and may be called on any thread
    // at any time; it only walks the calling thread's own heap.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

fn main() -> std::process::ExitCode {
    floodgate_server::memory::set_release(release_memory);
    floodgate::cli::Cli::parse().run()
}
