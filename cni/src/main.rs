//! The `sdn-node-cni` executable: wires [`sdn_node_cni::run`] to the process.

use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let outcome = sdn_node_cni::run(&|name| std::env::var_os(name), &mut std::io::stdin().lock());
    // Not println!: it panics when the runtime has closed stdout, and a failed write can only
    // be reported through the exit status anyway.
    let mut out = std::io::stdout().lock();
    let written = out.write_all(outcome.stdout.as_bytes()).and_then(|()| out.flush());
    match (outcome.exit_code, written) {
        (0, Ok(())) => ExitCode::SUCCESS,
        _ => ExitCode::FAILURE,
    }
}
