//! The `prefetcher` command line.

fn main() {}
