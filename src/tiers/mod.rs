//! Memory tiers: what lives in VRAM, what in host RAM or the page cache, and what is read from
//! disk on demand (issue 5).
//!
//! The real IQ3_S model is 54.8 GB of experts and dense weights plus a 28.8 GB PLE table, to be run
//! on a 12–24 GB GPU with 32–64 GB of RAM. The pieces, each usable and tested on its own:
//!
//! * [`size`]: `12GiB` / `800MiB` / `1.5G` on the command line.
//! * [`plan`]: the VRAM plan — dense weights, KV cache, state, work buffers, then expert slots.
//! * [`expert_cache`]: which expert sits in which VRAM slot (deterministic LRU, pinning, profile).
//! * [`host_experts`]: every expert's bytes from the mmap (default) or a RAM copy.
//! * [`ple_reader`]: checked, cached row gathers from the PLE table by mmap or positioned reads.
//! * [`layout`]: where each routed expert's gate/up/down slices are in the file (shared by the
//!   planner and the host tier).
//!
//! Nothing here touches the GPU: the planner decides sizes, the slot cache decides placement, the
//! GPU backend allocates and uploads accordingly.

pub mod expert_cache;
pub mod host_experts;
pub mod layout;
pub mod plan;
pub mod ple_reader;
pub mod size;

pub use expert_cache::{
    ExpertCacheError, ExpertKey, ExpertProfile, ExpertSlotCache, SlotAssignment,
};
pub use host_experts::{ExpertSource, HostExperts, HostExpertsError};
pub use plan::{
    BudgetError, DEFAULT_VRAM_RESERVE, MemoryPlan, PlanError, PlanLimits, resolve_vram_budget,
};
pub use ple_reader::{IoMode, PleReadError, PleReaderOptions, PleRowReader, PleTable};
pub use size::{ByteSize, SizeError, format_size, parse_size};

use std::path::PathBuf;

/// How routed experts are served from the host (`--experts`) when they do not all fit the VRAM
/// budget.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ExpertsArg {
    /// `pinned` when the adapter can read host memory and the host has the RAM for every expert
    /// (within --ram-budget), else `mmap`; the load prints which and why.
    #[default]
    Auto,
    /// Every expert in page-locked host memory that the GPU reads in place over the bus, the
    /// hottest also copied into the VRAM left free (promoted as routing shifts): no upload per
    /// miss, no host round trip per layer. Needs RAM for all experts.
    Pinned,
    /// VRAM slots filled on demand from slices of the memory-mapped GGUF: the page cache is the
    /// RAM tier, no second copy.
    Mmap,
    /// Copy every expert into RAM at load (counts against --ram-budget).
    Ram,
    /// Like `ram`, and lock the copy in memory (mlock) so it is never paged out.
    RamLocked,
}

impl ExpertsArg {
    pub fn source(self) -> ExpertSource {
        match self {
            ExpertsArg::Auto | ExpertsArg::Pinned | ExpertsArg::Mmap => ExpertSource::Mmap,
            ExpertsArg::Ram => ExpertSource::Ram { locked: false },
            ExpertsArg::RamLocked => ExpertSource::Ram { locked: true },
        }
    }
}

/// The memory-tier options of `serve`, `run`, `bench` and `inspect --plan`; flatten into a
/// subcommand's `Args` with `#[command(flatten)]`.
#[derive(clap::Args, Debug, Clone)]
pub struct TierArgs {
    /// VRAM the engine may use, e.g. 12GiB, 800MiB, 1.5G (binary), 12GB (decimal). Default: what
    /// the adapter reports free (Vulkan's VK_EXT_memory_budget), less a reserve of 700 MiB;
    /// where the adapter does not report it (DX12, Metal, some drivers), every weight is loaded
    /// into VRAM and the load says so.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub vram_budget: Option<u64>,
    /// Host RAM the engine may use for copies it makes: the PLE row cache first (its row count is
    /// lowered to fit), then the expert copy of `--experts ram` or `pinned` (refused if it does
    /// not fit).
    /// Default: no limit beyond what the system has.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub ram_budget: Option<u64>,
    /// Where routed experts are served from when they do not all fit the VRAM budget.
    #[arg(long, value_enum, default_value_t = ExpertsArg::Auto)]
    pub experts: ExpertsArg,
    /// How PLE table rows are read: from the memory map or with positioned reads.
    #[arg(long, value_enum, default_value_t = IoMode::Mmap)]
    pub ple_io: IoMode,
    /// Rows of the PLE table kept in the row cache (0: no cache).
    #[arg(long, value_name = "ROWS", default_value_t = ple_reader::DEFAULT_CACHE_ROWS)]
    pub ple_row_cache: usize,
    /// Expert usage profile that picks the experts in VRAM (slots or hot copies) at start. A
    /// file that does not exist yet gets the routing seen, written at exit. Without it, the first
    /// experts of every layer are loaded.
    #[arg(long, value_name = "FILE")]
    pub expert_profile: Option<PathBuf>,
    /// Storage type of the attention layers' key/value cache: f32, or f16 for half the memory
    /// (each key and value rounded to the nearest f16; the CPU reference rounds the same way).
    /// Fixed per run: it never follows the memory free.
    #[arg(long, value_enum, default_value_t = crate::model::config::KvType::F32)]
    pub kv: crate::model::config::KvType,
}

impl Default for TierArgs {
    /// The same values as the command line's defaults.
    fn default() -> Self {
        TierArgs {
            vram_budget: None,
            ram_budget: None,
            experts: ExpertsArg::Auto,
            ple_io: IoMode::Mmap,
            ple_row_cache: ple_reader::DEFAULT_CACHE_ROWS,
            expert_profile: None,
            kv: crate::model::config::KvType::F32,
        }
    }
}

impl TierArgs {
    /// Options for [`PleRowReader::open`].
    pub fn ple_reader_options(&self) -> PleReaderOptions {
        PleReaderOptions {
            mode: self.ple_io,
            cache_rows: self.ple_row_cache,
            verify_reads: false,
        }
    }

    /// `--ram-budget` shared between the copies the engine makes: the PLE row cache (of a table of
    /// `n_rows` rows of `row_bytes`) first, its row count lowered until it fits, then the expert
    /// copy gets what is left. Returns the cache rows and the expert copy's budget (`None`: no
    /// budget was given).
    pub fn split_ram_budget(&self, row_bytes: usize, n_rows: u64) -> (usize, Option<u64>) {
        let wanted = (self.ple_row_cache as u64).min(n_rows);
        match self.ram_budget {
            None => (self.ple_row_cache, None),
            Some(budget) => {
                let row = (row_bytes as u64).max(1);
                let rows = wanted.min(budget / row);
                let rows_usize = usize::try_from(rows).unwrap_or(usize::MAX);
                (rows_usize, Some(budget - rows * row))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        tiers: TierArgs,
    }

    #[test]
    fn ram_budget_covers_the_ple_cache_then_the_expert_copy() {
        let mut tiers = TierArgs {
            ple_row_cache: 1000,
            ..TierArgs::default()
        };
        assert_eq!(tiers.split_ram_budget(100, 1 << 20), (1000, None));
        tiers.ram_budget = Some(1_000_000);
        // 1000 rows of 100 bytes fit; the rest goes to the experts.
        assert_eq!(tiers.split_ram_budget(100, 1 << 20), (1000, Some(900_000)));
        // A table of 10 rows needs no more than 10 cached.
        assert_eq!(tiers.split_ram_budget(100, 10), (10, Some(999_000)));
        // Rows of 10 kB: only 100 fit, nothing is left for an expert copy.
        assert_eq!(tiers.split_ram_budget(10_000, 1 << 20), (100, Some(0)));
    }

    #[test]
    fn tier_flags_parse_with_sizes_and_defaults() {
        let cli = Cli::try_parse_from([
            "strata",
            "--vram-budget",
            "12GiB",
            "--ram-budget",
            "32GB",
            "--experts",
            "ram-locked",
            "--ple-io",
            "read",
            "--expert-profile",
            "hot.txt",
        ])
        .expect("parse");
        let t = cli.tiers;
        assert_eq!(t.vram_budget, Some(12 << 30));
        assert_eq!(t.ram_budget, Some(32_000_000_000));
        assert_eq!(t.experts.source(), ExpertSource::Ram { locked: true });
        assert_eq!(t.ple_io, IoMode::Read);
        assert_eq!(t.expert_profile, Some(PathBuf::from("hot.txt")));

        let defaults = Cli::try_parse_from(["strata"]).expect("parse").tiers;
        let expected = TierArgs::default();
        assert_eq!(defaults.vram_budget, expected.vram_budget);
        assert_eq!(defaults.experts, ExpertsArg::Auto);
        assert_eq!(defaults.ple_io, IoMode::Mmap);
        assert_eq!(defaults.ple_row_cache, expected.ple_row_cache);
        assert_eq!(defaults.ple_reader_options(), PleReaderOptions::default());

        let err = Cli::try_parse_from(["strata", "--vram-budget", "12 parsecs"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("parsecs"), "{err}");
    }
}
