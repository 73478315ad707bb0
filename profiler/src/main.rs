mod capture;
mod profile;
mod scope;

fn main() {}
