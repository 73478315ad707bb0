mod events;
mod profile;

fn main() {}
