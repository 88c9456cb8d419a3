//! `expressfs-table-cost`: the inode table's own work for a tree of directories listed and listed again.
//!
//! ```sh
//! target/release/expressfs-table-cost --dirs 1000 --names 500
//! ```
//!
//! Builds a table of `--dirs` directories under the root, then, for each directory in turn, does what
//! applying its listing does to the table: an upsert per name, then the names made here that the bucket does
//! not show yet (`local_children`). The first pass makes every node; each later pass is the tree listed
//! again once its TTL ran out. Prints the time of each pass. No mount and no bucket: this is the part of a
//! listing's cost that happens under the table's lock.

use std::time::{Duration, Instant};

use clap::Parser;
use expressfs::fs::ROOT_INO;
use expressfs::fs::inode::{InodeTable, Kind, Stat};

#[derive(Parser)]
struct Args {
    /// Directories under the root.
    #[arg(long, default_value_t = 1000)]
    dirs: u64,
    /// Files in each directory.
    #[arg(long, default_value_t = 500)]
    names: u64,
    /// Times the whole tree is listed (the first makes the nodes).
    #[arg(long, default_value_t = 2)]
    passes: u32,
}

fn main() {
    let args = Args::parse();
    let mut table = InodeTable::new("");
    let now = Instant::now();
    let expires = now + Duration::from_secs(3600);
    let dirs: Vec<u64> = (0..args.dirs)
        .map(|d| {
            let name = format!("class{d:05}");
            table.upsert(
                ROOT_INO,
                &name,
                Kind::Directory,
                Stat::directory(),
                expires,
                now,
            )
        })
        .collect();
    let names: Vec<String> = (0..args.names).map(|n| format!("{n:08}.jpg")).collect();
    for pass in 1..=args.passes {
        let start = Instant::now();
        for &dir in &dirs {
            for name in &names {
                table.upsert(dir, name, Kind::File, Stat::new_file(None), expires, now);
            }
            std::hint::black_box(table.local_children(dir));
        }
        println!(
            "pass {pass}: {} directories of {} names in {:.3} s",
            args.dirs,
            args.names,
            start.elapsed().as_secs_f64()
        );
    }
}
