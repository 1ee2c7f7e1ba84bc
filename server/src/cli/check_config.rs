//! `floodgate check-config FILE`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

#[derive(Args, Debug)]
pub struct CheckConfigArgs {
    /// The rules file to validate.
    file: PathBuf,
}

pub fn run(args: CheckConfigArgs) -> ExitCode {
    match crate::server::load_rules(&args.file) {
        Ok((rules, _)) => {
            let n = rules.rules().len();
            let limits: usize = rules.rules().iter().map(|r| r.limits.len()).sum();
            println!("{}: OK ({n} resources, {limits} limits)", args.file.display());
            ExitCode::SUCCESS
        }
        Err(errors) => {
            eprintln!("{errors}");
            ExitCode::FAILURE
        }
    }
}
