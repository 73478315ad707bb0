pub mod export;
mod profile;

fn main() {}
