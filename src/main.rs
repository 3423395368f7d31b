#![forbid(unsafe_code)]
use clap::Parser;
use keel::cli::{self, Cli};
use keel_core::config::Settings;

/// mimalloc instead of the system allocator: every request allocates (headers, JSON,
/// routing), and glibc's malloc took about a third of the HTTP workers' time under load
/// (docs/DECISIONS.md, record 79).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let settings = match Settings::load() {
        Ok(settings) => settings,
        Err(err) => {
            eprintln!("keel: {err}");
            return std::process::ExitCode::from(2);
        }
    };
    let result = actix_web::rt::System::new().block_on(cli::run(cli, settings));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("keel: {err:#}");
            match err.downcast_ref::<keel::admin::AdminError>() {
                // A refusal is 1, a usage or configuration error 2.
                Some(admin) => std::process::ExitCode::from(admin.exit_code()),
                None => std::process::ExitCode::FAILURE,
            }
        }
    }
}
