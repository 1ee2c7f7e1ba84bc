use clap::Parser;

fn main() -> std::process::ExitCode {
    floodgate::cli::Cli::parse().run()
}
