use clap::Parser;

// mimalloc: the decision path allocates small, short-lived buffers per call;
// glibc's malloc spent about a sixth of the server's time on them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    floodgate::cli::Cli::parse().run()
}
