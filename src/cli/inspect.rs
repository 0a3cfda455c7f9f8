//! `strata inspect` (being written).

#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`strata inspect` is not implemented yet")
}
