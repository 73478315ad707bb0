//! What to sample or count: event specifications as users write them (perf, Oracle `collect -h`
//! and HP Caliper styles), parsed into one [`EventSpec`] type; the catalog of known counters;
//! this machine's PMUs from sysfs; probing whether an event opens here and explaining why not;
//! and the data behind `profiler list`.

pub mod pmu;

pub use pmu::PmuRegistry;
