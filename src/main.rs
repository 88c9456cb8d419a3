//! `expressfs`: mount an S3 Express One Zone directory bucket (or a general purpose bucket) with FUSE.

fn main() {
    std::process::exit(expressfs::daemon::main());
}
