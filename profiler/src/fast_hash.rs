//! The hash maps of the profiler's hot paths: foldhash, seeded per map like std's (keys a user
//! crafts to collide gain little), several times faster than SipHash on the pids, paths,
//! addresses, frames and names they hold. SipHash was about 1% of the agent's CPU in the pprof
//! builder, a sixth of reading the side-band under churn, and a tenth of building a report's
//! views.

pub type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
