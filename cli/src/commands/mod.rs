//! One module per command; each takes the gateway and its arguments and prints its result.

mod audit;
mod decide;
mod delegations;
mod grants;
mod listed;
mod pending;
mod policy;
mod runs;
mod show;
mod watch;

use crate::args::{Cli, Command};
use crate::client::Gateway;
use crate::config::Config;
use crate::error::CliError;

pub(crate) async fn run(cli: Cli) -> Result<(), CliError> {
    let gateway = Gateway::new(&Config::resolve(&cli.global)?)?;
    let json = cli.global.json;
    match cli.command {
        Command::Runs(command) => runs::run(&gateway, command, json).await,
        Command::Pending(args) => pending::run(&gateway, args, json).await,
        Command::Show { run } => show::run(&gateway, &run, json).await,
        Command::Approve(call) => decide::approve(&gateway, call, json).await,
        Command::Reject { call, reason } => decide::reject(&gateway, call, reason, json).await,
        Command::Edit(args) => decide::edit(&gateway, args, json).await,
        Command::Watch(args) => watch::run(&gateway, args, json).await,
        Command::Grant(args) => grants::grant(&gateway, args, json).await,
        Command::Grants(args) => grants::list(&gateway, args, json).await,
        Command::Revoke {
            grant,
            reason,
            revoked_by,
        } => grants::revoke(&gateway, &grant, reason, revoked_by, json).await,
        Command::Delegate(args) => delegations::delegate(&gateway, args, json).await,
        Command::Delegations(args) => delegations::list(&gateway, args, json).await,
        Command::Undelegate {
            delegation,
            reason,
            by,
        } => delegations::end(&gateway, &delegation, reason, by, json).await,
        Command::Policy(command) => policy::run(&gateway, command, json).await,
        Command::Audit { run, verify } => audit::run(&gateway, &run, verify, json).await,
    }
}
