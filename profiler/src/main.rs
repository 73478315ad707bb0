mod profile;

fn main() {}
