mod import;
mod profile;

fn main() {}
