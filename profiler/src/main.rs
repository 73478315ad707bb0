pub mod export;
pub mod profile;

fn main() {}
