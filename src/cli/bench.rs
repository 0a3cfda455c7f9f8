//! `strata bench` (being written).

#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`strata bench` is not implemented yet")
}
