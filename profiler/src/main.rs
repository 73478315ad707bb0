mod capture;
mod profile;

fn main() {}
