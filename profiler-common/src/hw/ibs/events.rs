//! IBS-derived events in the spirit of AMD CodeXL: per-sample counters accumulated from decoded
//! fetch and op samples ([`IbsFetchCounters`], [`IbsOpCounters`]), the list of events with the
//! register bits each derives from and whether the running CPU reports it ([`IbsFetchEvent`],
//! [`IbsOpEvent`]), and the ratios CodeXL shows.
//!
//! Counts are numbers of IBS samples (or sums of cycles over samples): they are never to be added
//! to or divided by event-based sample counts. Events whose register bits no current CPU or
//! kernel provides are listed with no source and count nothing; they are never approximated.
//!
//! Counters are `#[repr(C)]` u64 fields, so they can also serve as eBPF map values; with the
//! `user` feature they serialize, for profile files.

use super::{
    CacheState, FetchOutcome, IbsCaps, IbsDataSource, IbsErrata, IbsFetch, IbsMemoryAccess, IbsOp,
    PageSize, TlbOutcome,
};

/// Whether the running CPU and kernel report an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Availability {
    Reported,
    /// Not reported, and why.
    NotReported(&'static str),
}

/// Declares a counters struct and the event enum naming its fields, plus the events that have no
/// counter because no register reports them.
macro_rules! derived_events {
    (
        $(#[$counters_doc:meta])* counters $Counters:ident;
        $(#[$event_doc:meta])* events $Event:ident;
        counted { $($(#[$doc:meta])* $Variant:ident => $field:ident, $name:literal;)* }
        not_reported { $($(#[$missing_doc:meta])* $Missing:ident, $missing_name:literal;)* }
    ) => {
        $(#[$counters_doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        #[cfg_attr(feature = "user", derive(serde::Serialize, serde::Deserialize))]
        pub struct $Counters {
            $($(#[$doc])* pub $field: u64,)*
        }

        $(#[$event_doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $Event {
            $($(#[$doc])* $Variant,)*
            $($(#[$missing_doc])* $Missing,)*
        }

        impl $Event {
            /// Every event, in report order.
            pub const ALL: &'static [$Event] = &[$($Event::$Variant,)* $($Event::$Missing,)*];

            /// The event's name in reports.
            pub const fn name(self) -> &'static str {
                match self {
                    $($Event::$Variant => $name,)*
                    $($Event::$Missing => $missing_name,)*
                }
            }
        }

        impl $Counters {
            /// The count of `event`; `None` for an event no register reports.
            pub const fn get(&self, event: $Event) -> Option<u64> {
                match event {
                    $($Event::$Variant => Some(self.$field),)*
                    $($Event::$Missing => None,)*
                }
            }

            /// Adds another set of counters (another CPU, another generation of a map).
            #[inline(always)]
            pub fn merge(&mut self, other: &$Counters) {
                $(tally(&mut self.$field, other.$field);)*
            }
        }
    };
}

/// Saturating, so a counter can never wrap around to a small, plausible-looking value.
#[inline(always)]
fn tally(counter: &mut u64, amount: u64) {
    *counter = counter.saturating_add(amount);
}

derived_events! {
    /// Counts derived from IBS fetch samples.
    counters IbsFetchCounters;
    /// The IBS fetch events.
    events IbsFetchEvent;
    counted {
        AllSamples => all_samples, "IBS all fetch samples";
        /// Fetches killed before being attempted.
        Killed => killed, "IBS fetch killed";
        /// Completed + aborted.
        Attempted => attempted, "IBS fetch attempted";
        Completed => completed, "IBS fetch completed";
        Aborted => aborted, "IBS fetch aborted";
        L1ItlbHit => l1_itlb_hit, "IBS L1 ITLB hit";
        ItlbL1MissL2Hit => itlb_l1_miss_l2_hit, "IBS L1 ITLB miss, L2 ITLB hit";
        ItlbL1L2Miss => itlb_l1_l2_miss, "IBS L1 and L2 ITLB miss";
        IcMiss => ic_miss, "IBS instruction cache miss";
        IcHit => ic_hit, "IBS instruction cache hit";
        Page4K => page_4k, "IBS 4K page translation";
        Page2M => page_2m, "IBS 2M page translation";
        Page1G => page_1g, "IBS 1G page translation";
        /// Sum of fetch latency cycles.
        LatencyTotal => latency_total, "IBS fetch latency";
        /// L2 cache misses of completed fetches.
        L2Miss => l2_miss, "IBS fetch L2 cache miss";
        /// Sum of ITLB refill latency cycles.
        ItlbRefillLatencyTotal => itlb_refill_latency_total, "IBS ITLB refill latency";
    }
    not_reported {}
}

derived_events! {
    /// Counts derived from IBS op samples.
    counters IbsOpCounters;
    /// The IBS op events.
    events IbsOpEvent;
    counted {
        AllSamples => all_samples, "IBS all op samples";
        /// Sum of tag-to-retire cycles.
        TagToRetireTotal => tag_to_retire_total, "IBS tag to retire cycles";
        /// Sum of completion-to-retire cycles.
        CompletionToRetireTotal => completion_to_retire_total, "IBS completion to retire cycles";
        Branch => branches, "IBS branch";
        MispredictedBranch => mispredicted_branches, "IBS mispredicted branch";
        TakenBranch => taken_branches, "IBS taken branch";
        MispredictedTakenBranch => mispredicted_taken_branches, "IBS mispredicted taken branch";
        Return => returns, "IBS return";
        MispredictedReturn => mispredicted_returns, "IBS mispredicted return";
        AllLoadStore => load_store, "IBS all load/store ops";
        Load => loads, "IBS load ops";
        Store => stores, "IBS store ops";
        L1DtlbHit => l1_dtlb_hit, "IBS L1 DTLB hit";
        DtlbL1MissL2Hit => dtlb_l1_miss_l2_hit, "IBS L1 DTLB miss, L2 DTLB hit";
        DtlbL1L2Miss => dtlb_l1_l2_miss, "IBS L1 and L2 DTLB miss";
        DcMiss => dc_miss, "IBS data cache miss";
        DcHit => dc_hit, "IBS data cache hit";
        Misaligned => misaligned, "IBS misaligned access";
        UcAccess => uc_access, "IBS UC memory access";
        WcAccess => wc_access, "IBS WC memory access";
        Locked => locked, "IBS locked op";
        L1Dtlb4K => l1_dtlb_4k, "IBS L1 DTLB 4K page";
        L1Dtlb2M => l1_dtlb_2m, "IBS L1 DTLB 2M page";
        L1Dtlb1G => l1_dtlb_1g, "IBS L1 DTLB 1G page";
        L2Dtlb4K => l2_dtlb_4k, "IBS L2 DTLB 4K page";
        L2Dtlb2M => l2_dtlb_2m, "IBS L2 DTLB 2M page";
        L2Dtlb1G => l2_dtlb_1g, "IBS L2 DTLB 1G page";
        /// Loads that missed the data cache: the samples behind the miss latency total.
        DcMissLoads => dc_miss_loads, "IBS data cache miss loads";
        /// Sum of data-cache miss latency cycles of loads that missed.
        DcMissLatencyTotal => dc_miss_latency_total, "IBS data cache miss load latency";
        LoadResync => load_resync, "IBS load resync";
        NbLocal => nb_local, "IBS northbridge local";
        NbRemote => nb_remote, "IBS northbridge remote";
        NbLocalL3 => nb_local_l3, "IBS northbridge local L3 (or another core's L1/L2 in the CCX)";
        NbLocalCache => nb_local_cache, "IBS northbridge local other core's cache";
        NbRemoteCache => nb_remote_cache, "IBS northbridge remote cache";
        NbLocalDram => nb_local_dram, "IBS northbridge local DRAM";
        NbRemoteDram => nb_remote_dram, "IBS northbridge remote DRAM";
        NbLocalIo => nb_local_io, "IBS northbridge local MMIO/config/PCI/APIC";
        NbRemoteIo => nb_remote_io, "IBS northbridge remote MMIO/config/PCI/APIC";
        NbLongLatencyDimm => nb_long_latency_dimm, "IBS northbridge long-latency DIMM";
        NbExtensionMemory => nb_extension_memory, "IBS northbridge extension memory (CXL)";
        NbPeerAgentMemory => nb_peer_agent_memory, "IBS northbridge peer agent memory";
        CacheModifiedState => cache_modified_state, "IBS cache hit in modified state";
        CacheOwnedState => cache_owned_state, "IBS cache hit in owned state";
        /// Sum of miss latency cycles of loads served on the local node.
        NbLocalLatencyTotal => nb_local_latency_total, "IBS local cache latency";
        /// Sum of miss latency cycles of loads served by another node.
        NbRemoteLatencyTotal => nb_remote_latency_total, "IBS remote cache latency";
    }
    not_reported {
        /// Family 10h-15h IBS_OP_DATA bit 32; not in current IBS_OP_DATA.
        Resync, "IBS resync";
        /// Older families' IBS_OP_DATA3 bit 9; reserved now.
        BankConflictLoad, "IBS bank conflict on load";
        /// Older families' IBS_OP_DATA3 bit 10; reserved now.
        BankConflictStore, "IBS bank conflict on store";
        /// Older families' IBS_OP_DATA3 bit 11; reserved now.
        StoreToLoadForwarded, "IBS store-to-load forwarded";
        /// Older families' IBS_OP_DATA3 bit 12; reserved now.
        StoreToLoadCancelled, "IBS store-to-load cancelled";
        /// Older families' IBS_OP_DATA3 bit 16; that bit now means "DC miss, no MAB allocated".
        MabHit, "IBS MAB hit";
    }
}

const NO_FETCH_SAMPLING: Availability = Availability::NotReported(
    "this CPU has no IBS fetch sampling (CPUID 8000_001B EAX bit 1 clear)",
);
const NO_OP_SAMPLING: Availability =
    Availability::NotReported("this CPU has no IBS op sampling (CPUID 8000_001B EAX bit 2 clear)");
const RESERVED_DATA3_BIT: Availability = Availability::NotReported(
    "its IBS_OP_DATA3 bit exists only on families 10h-16h; current CPUs reserve it",
);
const BEFORE_ZEN4: Availability =
    Availability::NotReported("this data source exists from Zen 4 on (IBS caps bit 11)");

impl IbsFetchEvent {
    /// The register bits the event derives from.
    pub const fn source(self) -> Option<&'static str> {
        Some(match self {
            IbsFetchEvent::AllSamples => "every fetch sample",
            IbsFetchEvent::Killed => "IBS_FETCH_CTL bits 50, 51, 52, 55, 56, 58 all clear",
            IbsFetchEvent::Attempted => "IBS_FETCH_CTL any of bits 50, 51, 52, 55, 56, 58",
            IbsFetchEvent::Completed => "IBS_FETCH_CTL[50] completed",
            IbsFetchEvent::Aborted => "attempted and IBS_FETCH_CTL[50] clear",
            IbsFetchEvent::L1ItlbHit => "IBS_FETCH_CTL[55] clear with [52] physical address valid",
            IbsFetchEvent::ItlbL1MissL2Hit => "IBS_FETCH_CTL[55] set, [56] clear",
            IbsFetchEvent::ItlbL1L2Miss => "IBS_FETCH_CTL[55] and [56] set",
            IbsFetchEvent::IcMiss => "IBS_FETCH_CTL[51] IC miss",
            IbsFetchEvent::IcHit => "IBS_FETCH_CTL[50] set, [51] clear",
            IbsFetchEvent::Page4K | IbsFetchEvent::Page2M | IbsFetchEvent::Page1G => {
                "IBS_FETCH_CTL[54:53] page size with [52] physical address valid"
            }
            IbsFetchEvent::LatencyTotal => "IBS_FETCH_CTL[47:32] fetch latency",
            IbsFetchEvent::L2Miss => "IBS_FETCH_CTL[58] with [50] completed",
            IbsFetchEvent::ItlbRefillLatencyTotal => "IC_IBS_EXTD_CTL[15:0]",
        })
    }

    /// Whether a CPU with these capabilities and errata reports the event.
    pub const fn availability(self, caps: IbsCaps, errata: IbsErrata) -> Availability {
        if !caps.fetch_sampling() {
            return NO_FETCH_SAMPLING;
        }
        match self {
            IbsFetchEvent::IcMiss | IbsFetchEvent::IcHit if errata.fetch_ic_miss => {
                Availability::NotReported(
                    "the IC-miss bit is unreliable on this CPU (erratum 1238)",
                )
            }
            IbsFetchEvent::ItlbRefillLatencyTotal if !caps.fetch_ctl_ext() => {
                Availability::NotReported("this CPU has no IC_IBS_EXTD_CTL (IBS caps bit 9)")
            }
            _ => Availability::Reported,
        }
    }
}

impl IbsOpEvent {
    /// The register bits the event derives from; `None` when no current register reports it.
    pub const fn source(self) -> Option<&'static str> {
        Some(match self {
            IbsOpEvent::AllSamples => "every op sample",
            IbsOpEvent::TagToRetireTotal => "IBS_OP_DATA[31:16]",
            IbsOpEvent::CompletionToRetireTotal => "IBS_OP_DATA[15:0]",
            IbsOpEvent::Branch => "IBS_OP_DATA[37]",
            IbsOpEvent::MispredictedBranch => "IBS_OP_DATA[37] and [36]",
            IbsOpEvent::TakenBranch => "IBS_OP_DATA[37] and [35]",
            IbsOpEvent::MispredictedTakenBranch => "IBS_OP_DATA[37], [36] and [35]",
            IbsOpEvent::Return => "IBS_OP_DATA[37] and [34]",
            IbsOpEvent::MispredictedReturn => "IBS_OP_DATA[37], [36] and [34]",
            IbsOpEvent::AllLoadStore => "IBS_OP_DATA3[0] or [1]",
            IbsOpEvent::Load => "IBS_OP_DATA3[0]",
            IbsOpEvent::Store => "IBS_OP_DATA3[1]",
            IbsOpEvent::L1DtlbHit => "IBS_OP_DATA3[2] clear with [17] linear address valid",
            IbsOpEvent::DtlbL1MissL2Hit => "IBS_OP_DATA3[2] set, [3] clear, [17] set",
            IbsOpEvent::DtlbL1L2Miss => "IBS_OP_DATA3[2], [3] and [17] set",
            IbsOpEvent::DcMiss => "IBS_OP_DATA3[7] on a load/store",
            IbsOpEvent::DcHit => "IBS_OP_DATA3[7] clear on a load/store",
            IbsOpEvent::Misaligned => "IBS_OP_DATA3[8]",
            IbsOpEvent::UcAccess => "IBS_OP_DATA3[14]",
            IbsOpEvent::WcAccess => "IBS_OP_DATA3[13]",
            IbsOpEvent::Locked => "IBS_OP_DATA3[15]",
            IbsOpEvent::L1Dtlb4K | IbsOpEvent::L1Dtlb2M | IbsOpEvent::L1Dtlb1G => {
                "IBS_OP_DATA3[5:4] on an L1 DTLB hit (Zen 5: page size [5:4])"
            }
            IbsOpEvent::L2Dtlb4K | IbsOpEvent::L2Dtlb2M | IbsOpEvent::L2Dtlb1G => {
                "IBS_OP_DATA3[6] and [19] on an L2 DTLB hit (Zen 5: page size [5:4])"
            }
            IbsOpEvent::DcMissLoads => "IBS_OP_DATA3[0] and [7]",
            IbsOpEvent::DcMissLatencyTotal => "IBS_OP_DATA3[47:32] of loads with [7] set",
            IbsOpEvent::LoadResync => "IBS_OP_DATA4[0]",
            IbsOpEvent::NbLocal | IbsOpEvent::NbLocalLatencyTotal => {
                "IBS_OP_DATA2 source with [4] clear, on loads that missed the data cache"
            }
            IbsOpEvent::NbRemote | IbsOpEvent::NbRemoteLatencyTotal => {
                "IBS_OP_DATA2 source with [4] set, on loads that missed the data cache"
            }
            IbsOpEvent::NbLocalL3 => "IBS_OP_DATA2 source 1 (Zen 4)",
            IbsOpEvent::NbLocalCache => "IBS_OP_DATA2 source 2",
            IbsOpEvent::NbRemoteCache => "IBS_OP_DATA2 source 4 (before Zen 4) or 5 (Zen 4)",
            IbsOpEvent::NbLocalDram => "IBS_OP_DATA2 source 3 with [4] clear",
            IbsOpEvent::NbRemoteDram => "IBS_OP_DATA2 source 3 with [4] set",
            IbsOpEvent::NbLocalIo => "IBS_OP_DATA2 source 7 with [4] clear",
            IbsOpEvent::NbRemoteIo => "IBS_OP_DATA2 source 7 with [4] set",
            IbsOpEvent::NbLongLatencyDimm => "IBS_OP_DATA2 source 6 (Zen 4)",
            IbsOpEvent::NbExtensionMemory => "IBS_OP_DATA2 source 8 (Zen 4)",
            IbsOpEvent::NbPeerAgentMemory => "IBS_OP_DATA2 source 12 (Zen 4)",
            IbsOpEvent::CacheModifiedState => "IBS_OP_DATA2[5] clear with a cache source",
            IbsOpEvent::CacheOwnedState => "IBS_OP_DATA2[5] set with a cache source",
            IbsOpEvent::Resync
            | IbsOpEvent::BankConflictLoad
            | IbsOpEvent::BankConflictStore
            | IbsOpEvent::StoreToLoadForwarded
            | IbsOpEvent::StoreToLoadCancelled
            | IbsOpEvent::MabHit => return None,
        })
    }

    /// Whether a CPU with these capabilities and errata reports the event.
    pub const fn availability(self, caps: IbsCaps, errata: IbsErrata) -> Availability {
        if !caps.op_sampling() {
            return NO_OP_SAMPLING;
        }
        match self {
            IbsOpEvent::Resync => {
                Availability::NotReported("IBS_OP_DATA bit 32 exists only on families 10h-16h; current CPUs reserve it")
            }
            IbsOpEvent::BankConflictLoad
            | IbsOpEvent::BankConflictStore
            | IbsOpEvent::StoreToLoadForwarded
            | IbsOpEvent::StoreToLoadCancelled => RESERVED_DATA3_BIT,
            IbsOpEvent::MabHit => Availability::NotReported(
                "IBS_OP_DATA3 bit 16 means 'DC miss with no MAB allocated' on current CPUs, not a MAB hit",
            ),
            IbsOpEvent::LoadResync if !caps.op_data4() => {
                Availability::NotReported("this CPU has no IBS_OP_DATA4 (IBS caps bit 10)")
            }
            IbsOpEvent::NbLocalL3 if !caps.zen4() => Availability::NotReported(
                "before Zen 4, data source 2 does not separate the L3 from other cores' caches: see local cache",
            ),
            IbsOpEvent::NbLongLatencyDimm | IbsOpEvent::NbExtensionMemory | IbsOpEvent::NbPeerAgentMemory
                if !caps.zen4() =>
            {
                BEFORE_ZEN4
            }
            IbsOpEvent::CacheModifiedState | IbsOpEvent::CacheOwnedState if errata.cache_hit_state => {
                Availability::NotReported(
                    "the cache hit state bit is unreliable on this CPU (family 19h models 00h-0Fh, 20h-5Fh)",
                )
            }
            _ => Availability::Reported,
        }
    }
}

impl IbsFetchCounters {
    /// Counts one decoded fetch sample.
    #[inline(always)]
    pub fn add(&mut self, fetch: &IbsFetch) {
        tally(&mut self.all_samples, 1);
        let attempted = fetch.outcome != FetchOutcome::Killed;
        let completed = fetch.outcome == FetchOutcome::Completed;
        tally(&mut self.killed, !attempted as u64);
        tally(&mut self.attempted, attempted as u64);
        tally(&mut self.completed, completed as u64);
        tally(
            &mut self.aborted,
            (fetch.outcome == FetchOutcome::Aborted) as u64,
        );
        match fetch.itlb {
            Some(TlbOutcome::L1Hit) => tally(&mut self.l1_itlb_hit, 1),
            Some(TlbOutcome::L1MissL2Hit) => tally(&mut self.itlb_l1_miss_l2_hit, 1),
            Some(TlbOutcome::L1L2Miss) => tally(&mut self.itlb_l1_l2_miss, 1),
            None => {}
        }
        if let Some(ic_miss) = fetch.ic_miss {
            tally(&mut self.ic_miss, ic_miss as u64);
            tally(&mut self.ic_hit, (completed && !ic_miss) as u64);
        }
        match fetch.page_size {
            Some(PageSize::Size4K) => tally(&mut self.page_4k, 1),
            Some(PageSize::Size2M) => tally(&mut self.page_2m, 1),
            Some(PageSize::Size1G) => tally(&mut self.page_1g, 1),
            // Erratum 1347's 16K pages have no CodeXL event.
            Some(PageSize::Size16K) | None => {}
        }
        tally(&mut self.latency_total, fetch.latency as u64);
        tally(&mut self.l2_miss, (fetch.l2_miss == Some(true)) as u64);
        if let Some(latency) = fetch.itlb_refill_latency {
            tally(&mut self.itlb_refill_latency_total, latency as u64);
        }
    }
}

impl IbsOpCounters {
    /// Counts one decoded op sample.
    #[inline(always)]
    pub fn add(&mut self, op: &IbsOp) {
        tally(&mut self.all_samples, 1);
        tally(&mut self.tag_to_retire_total, op.tag_to_retire as u64);
        tally(
            &mut self.completion_to_retire_total,
            op.completion_to_retire as u64,
        );
        if let Some(branch) = op.branch {
            tally(&mut self.branches, 1);
            tally(&mut self.mispredicted_branches, branch.mispredicted as u64);
            tally(&mut self.taken_branches, branch.taken as u64);
            tally(
                &mut self.mispredicted_taken_branches,
                (branch.taken && branch.mispredicted) as u64,
            );
            tally(&mut self.returns, branch.is_return as u64);
            tally(
                &mut self.mispredicted_returns,
                (branch.is_return && branch.mispredicted) as u64,
            );
        }
        tally(&mut self.load_resync, (op.load_resync == Some(true)) as u64);
        if let Some(memory) = &op.memory {
            self.add_memory(memory);
        }
    }

    #[inline(always)]
    fn add_memory(&mut self, memory: &IbsMemoryAccess) {
        tally(&mut self.load_store, 1);
        tally(&mut self.loads, memory.load as u64);
        tally(&mut self.stores, memory.store as u64);
        match (memory.dtlb, memory.page_size) {
            (Some(TlbOutcome::L1Hit), size) => {
                tally(&mut self.l1_dtlb_hit, 1);
                match size {
                    Some(PageSize::Size4K) => tally(&mut self.l1_dtlb_4k, 1),
                    Some(PageSize::Size2M) => tally(&mut self.l1_dtlb_2m, 1),
                    Some(PageSize::Size1G) => tally(&mut self.l1_dtlb_1g, 1),
                    Some(PageSize::Size16K) | None => {}
                }
            }
            (Some(TlbOutcome::L1MissL2Hit), size) => {
                tally(&mut self.dtlb_l1_miss_l2_hit, 1);
                match size {
                    Some(PageSize::Size4K) => tally(&mut self.l2_dtlb_4k, 1),
                    Some(PageSize::Size2M) => tally(&mut self.l2_dtlb_2m, 1),
                    Some(PageSize::Size1G) => tally(&mut self.l2_dtlb_1g, 1),
                    Some(PageSize::Size16K) | None => {}
                }
            }
            (Some(TlbOutcome::L1L2Miss), _) => tally(&mut self.dtlb_l1_l2_miss, 1),
            (None, _) => {}
        }
        tally(&mut self.dc_miss, memory.dc_miss as u64);
        tally(&mut self.dc_hit, !memory.dc_miss as u64);
        tally(&mut self.misaligned, memory.misaligned as u64);
        tally(&mut self.uc_access, memory.uncacheable as u64);
        tally(&mut self.wc_access, memory.write_combining as u64);
        tally(&mut self.locked, memory.locked as u64);
        let latency = match memory.dc_miss_latency {
            Some(latency) => latency as u64,
            None => return,
        };
        tally(&mut self.dc_miss_loads, 1);
        tally(&mut self.dc_miss_latency_total, latency);
        // Northbridge events: loads that missed the data cache and carry a data source.
        let source = match memory.source {
            Some(source) => source,
            None => return,
        };
        let remote = memory.remote_node;
        if remote {
            tally(&mut self.nb_remote, 1);
            tally(&mut self.nb_remote_latency_total, latency);
        } else {
            tally(&mut self.nb_local, 1);
            tally(&mut self.nb_local_latency_total, latency);
        }
        match source {
            IbsDataSource::LocalCcx => tally(&mut self.nb_local_l3, 1),
            IbsDataSource::LocalCache | IbsDataSource::NearCcx => {
                tally(&mut self.nb_local_cache, 1)
            }
            IbsDataSource::RemoteCache | IbsDataSource::FarCcx => {
                tally(&mut self.nb_remote_cache, 1)
            }
            IbsDataSource::Dram if remote => tally(&mut self.nb_remote_dram, 1),
            IbsDataSource::Dram => tally(&mut self.nb_local_dram, 1),
            IbsDataSource::Io if remote => tally(&mut self.nb_remote_io, 1),
            IbsDataSource::Io => tally(&mut self.nb_local_io, 1),
            IbsDataSource::LongLatencyDimm => tally(&mut self.nb_long_latency_dimm, 1),
            IbsDataSource::ExtensionMemory => tally(&mut self.nb_extension_memory, 1),
            IbsDataSource::PeerAgentMemory => tally(&mut self.nb_peer_agent_memory, 1),
            IbsDataSource::Reserved(_) => {}
        }
        match memory.cache_state {
            Some(CacheState::Modified) => tally(&mut self.cache_modified_state, 1),
            Some(CacheState::Owned) => tally(&mut self.cache_owned_state, 1),
            None => {}
        }
    }
}

/// `numerator / denominator`, `None` when nothing was sampled to divide by.
#[cfg(not(target_arch = "bpf"))]
fn ratio(numerator: u64, denominator: u64) -> Option<f64> {
    if denominator == 0 {
        None
    } else {
        Some(numerator as f64 / denominator as f64)
    }
}

// CodeXL's ratios, for reports; floating point stays out of the eBPF build.
#[cfg(not(target_arch = "bpf"))]
impl IbsFetchCounters {
    /// Fetch latency cycles per attempted fetch.
    pub fn average_fetch_latency(&self) -> Option<f64> {
        ratio(self.latency_total, self.attempted)
    }

    /// Aborted fetches per attempted fetch.
    pub fn fetch_abort_rate(&self) -> Option<f64> {
        ratio(self.aborted, self.attempted)
    }

    /// Instruction cache misses per attempted fetch.
    pub fn ic_miss_rate(&self) -> Option<f64> {
        ratio(self.ic_miss, self.attempted)
    }

    /// L1 ITLB misses per attempted fetch.
    pub fn l1_itlb_miss_rate(&self) -> Option<f64> {
        ratio(
            self.itlb_l1_miss_l2_hit
                .saturating_add(self.itlb_l1_l2_miss),
            self.attempted,
        )
    }

    /// L1 and L2 ITLB misses per attempted fetch.
    pub fn l2_itlb_miss_rate(&self) -> Option<f64> {
        ratio(self.itlb_l1_l2_miss, self.attempted)
    }

    /// ITLB refill cycles per L1 ITLB miss.
    pub fn average_itlb_refill_latency(&self) -> Option<f64> {
        ratio(
            self.itlb_refill_latency_total,
            self.itlb_l1_miss_l2_hit
                .saturating_add(self.itlb_l1_l2_miss),
        )
    }
}

#[cfg(not(target_arch = "bpf"))]
impl IbsOpCounters {
    /// Tag-to-retire cycles per op.
    pub fn average_tag_to_retire(&self) -> Option<f64> {
        ratio(self.tag_to_retire_total, self.all_samples)
    }

    /// Completion-to-retire cycles per op.
    pub fn average_completion_to_retire(&self) -> Option<f64> {
        ratio(self.completion_to_retire_total, self.all_samples)
    }

    /// Mispredicted branches per branch.
    pub fn branch_mispredict_rate(&self) -> Option<f64> {
        ratio(self.mispredicted_branches, self.branches)
    }

    /// Taken branches per branch.
    pub fn branch_taken_rate(&self) -> Option<f64> {
        ratio(self.taken_branches, self.branches)
    }

    /// Mispredicted returns per return.
    pub fn return_mispredict_rate(&self) -> Option<f64> {
        ratio(self.mispredicted_returns, self.returns)
    }

    /// Data cache misses per load/store.
    pub fn dc_miss_rate(&self) -> Option<f64> {
        ratio(self.dc_miss, self.load_store)
    }

    /// Miss latency cycles per load that missed the data cache.
    pub fn average_dc_miss_latency(&self) -> Option<f64> {
        ratio(self.dc_miss_latency_total, self.dc_miss_loads)
    }

    /// L1 DTLB misses per load/store.
    pub fn l1_dtlb_miss_rate(&self) -> Option<f64> {
        ratio(
            self.dtlb_l1_miss_l2_hit
                .saturating_add(self.dtlb_l1_l2_miss),
            self.load_store,
        )
    }

    /// L1 and L2 DTLB misses per load/store.
    pub fn l2_dtlb_miss_rate(&self) -> Option<f64> {
        ratio(self.dtlb_l1_l2_miss, self.load_store)
    }

    /// Misaligned accesses per load/store.
    pub fn misaligned_rate(&self) -> Option<f64> {
        ratio(self.misaligned, self.load_store)
    }

    /// Miss latency cycles per load served on the local node.
    pub fn average_local_latency(&self) -> Option<f64> {
        ratio(self.nb_local_latency_total, self.nb_local)
    }

    /// Miss latency cycles per load served by another node.
    pub fn average_remote_latency(&self) -> Option<f64> {
        ratio(self.nb_remote_latency_total, self.nb_remote)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use crate::hw::ibs::{
        FetchCtl, FetchExtCtl, IbsFetchSample, IbsOpSample, OpData, OpData2, OpData3, OpData4,
    };
    use std::vec::Vec;

    const ZEN4_CAPS: u32 = 0b111 | (1 << 9) | (1 << 10) | (1 << 11);

    fn fetch(ctl: u64, ext: u64) -> IbsFetch {
        IbsFetchSample {
            caps: IbsCaps(ZEN4_CAPS),
            ctl: FetchCtl(ctl),
            lin_addr: 0x1000,
            phys_addr: 0x2000,
            ext_ctl: Some(FetchExtCtl(ext)),
        }
        .decode(IbsErrata::default())
    }

    const COMPLETED: u64 = 1 << 50;
    const IC_MISS: u64 = 1 << 51;
    const PHYS: u64 = 1 << 52;
    const L1_TLB_MISS: u64 = 1 << 55;
    const L2_TLB_MISS: u64 = 1 << 56;
    const FETCH_L2_MISS: u64 = 1 << 58;

    fn latency(cycles: u64) -> u64 {
        cycles << 32
    }

    #[test]
    fn fetch_counters_on_a_synthetic_set() {
        let samples = [
            // Killed: no event bit; its latency still counts toward the total, as in CodeXL.
            fetch(latency(3), 0),
            // Completed, IC hit, L1 ITLB hit on a 4K page.
            fetch(COMPLETED | PHYS | latency(10), 0),
            // Completed IC miss that missed L2, L1 ITLB miss L2 hit, 2M page.
            fetch(
                COMPLETED | IC_MISS | PHYS | L1_TLB_MISS | FETCH_L2_MISS | (1 << 53) | latency(120),
                30,
            ),
            // Aborted after missing both ITLBs (L2-miss bit ignored without completion).
            fetch(
                IC_MISS | L1_TLB_MISS | L2_TLB_MISS | FETCH_L2_MISS | latency(67),
                50,
            ),
        ];
        let mut counters = IbsFetchCounters::default();
        for sample in &samples {
            counters.add(sample);
        }
        assert_eq!(
            counters,
            IbsFetchCounters {
                all_samples: 4,
                killed: 1,
                attempted: 3,
                completed: 2,
                aborted: 1,
                l1_itlb_hit: 1,
                itlb_l1_miss_l2_hit: 1,
                itlb_l1_l2_miss: 1,
                ic_miss: 2,
                ic_hit: 1,
                page_4k: 1,
                page_2m: 1,
                page_1g: 0,
                latency_total: 200,
                l2_miss: 1,
                itlb_refill_latency_total: 80,
            }
        );
        assert_eq!(counters.attempted, counters.completed + counters.aborted);
        assert_eq!(counters.average_fetch_latency(), Some(200.0 / 3.0));
        assert_eq!(counters.fetch_abort_rate(), Some(1.0 / 3.0));
        assert_eq!(counters.ic_miss_rate(), Some(2.0 / 3.0));
        assert_eq!(counters.l1_itlb_miss_rate(), Some(2.0 / 3.0));
        assert_eq!(counters.l2_itlb_miss_rate(), Some(1.0 / 3.0));
        assert_eq!(counters.average_itlb_refill_latency(), Some(40.0));
        assert_eq!(IbsFetchCounters::default().average_fetch_latency(), None);

        let mut merged = counters;
        merged.merge(&counters);
        assert_eq!(merged.all_samples, 8);
        assert_eq!(merged.latency_total, 400);
        assert_eq!(merged.get(IbsFetchEvent::ItlbRefillLatencyTotal), Some(160));
    }

    fn op(data: u64, data2: u64, data3: u64, data4: u64) -> IbsOp {
        IbsOpSample {
            caps: IbsCaps(ZEN4_CAPS),
            data: OpData(data),
            data2: OpData2(data2),
            data3: OpData3(data3),
            data4: Some(OpData4(data4)),
            ..IbsOpSample::default()
        }
        .decode(IbsErrata::default())
    }

    const BRANCH: u64 = 1 << 37;
    const MISPREDICTED: u64 = 1 << 36;
    const TAKEN: u64 = 1 << 35;
    const RETURN: u64 = 1 << 34;
    const LOAD: u64 = 1;
    const STORE: u64 = 2;
    const L1_DTLB_MISS: u64 = 1 << 2;
    const L2_DTLB_MISS: u64 = 1 << 3;
    const DC_MISS: u64 = 1 << 7;
    const LIN: u64 = 1 << 17;
    const L2_MISS: u64 = 1 << 20;
    const REMOTE: u64 = 1 << 4;
    const OWNED: u64 = 1 << 5;

    fn retire(tag: u64, completion: u64) -> u64 {
        (tag << 16) | completion
    }

    fn miss_latency(cycles: u64) -> u64 {
        cycles << 32
    }

    #[test]
    fn op_counters_on_a_synthetic_set() {
        let samples = [
            // Taken, correctly predicted branch.
            op(BRANCH | TAKEN | retire(10, 2), 0, 0, 0),
            // Mispredicted taken return.
            op(
                BRANCH | TAKEN | RETURN | MISPREDICTED | retire(30, 4),
                0,
                0,
                0,
            ),
            // Load hitting the DC and the L1 DTLB (4K), misaligned, with a load resync.
            op(retire(5, 1), 0, LOAD | LIN | (1 << 8), 1),
            // Load missing DC, served by another CCX's Modified line (Zen 4 source 2), 2M L1 DTLB hit.
            op(
                retire(200, 3),
                2,
                LOAD | LIN | DC_MISS | L2_MISS | (1 << 4) | miss_latency(150),
                0,
            ),
            // Load missing DC, served by remote DRAM, L1 DTLB miss L2 hit on a 1G page.
            op(
                retire(400, 5),
                3 | REMOTE,
                LOAD | LIN | DC_MISS | L2_MISS | L1_DTLB_MISS | (1 << 19) | miss_latency(350),
                0,
            ),
            // Locked store missing DC and both DTLBs, UC; stores carry no latency or source.
            op(
                retire(50, 5),
                2 | OWNED,
                STORE
                    | LIN
                    | DC_MISS
                    | L1_DTLB_MISS
                    | L2_DTLB_MISS
                    | (1 << 14)
                    | (1 << 15)
                    | miss_latency(999),
                0,
            ),
            // Load missing DC served by the local L3 in an Owned line, WC.
            op(
                retire(100, 0),
                1 | OWNED,
                LOAD | DC_MISS | L2_MISS | (1 << 13) | miss_latency(50),
                0,
            ),
        ];
        let mut counters = IbsOpCounters::default();
        for sample in &samples {
            counters.add(sample);
        }
        assert_eq!(
            counters,
            IbsOpCounters {
                all_samples: 7,
                tag_to_retire_total: 795,
                completion_to_retire_total: 20,
                branches: 2,
                mispredicted_branches: 1,
                taken_branches: 2,
                mispredicted_taken_branches: 1,
                returns: 1,
                mispredicted_returns: 1,
                load_store: 5,
                loads: 4,
                stores: 1,
                l1_dtlb_hit: 2,
                dtlb_l1_miss_l2_hit: 1,
                dtlb_l1_l2_miss: 1,
                dc_miss: 4,
                dc_hit: 1,
                misaligned: 1,
                uc_access: 1,
                wc_access: 1,
                locked: 1,
                l1_dtlb_4k: 1,
                l1_dtlb_2m: 1,
                l1_dtlb_1g: 0,
                l2_dtlb_4k: 0,
                l2_dtlb_2m: 0,
                l2_dtlb_1g: 1,
                dc_miss_loads: 3,
                dc_miss_latency_total: 550,
                load_resync: 1,
                nb_local: 2,
                nb_remote: 1,
                nb_local_l3: 1,
                nb_local_cache: 1,
                nb_remote_cache: 0,
                nb_local_dram: 0,
                nb_remote_dram: 1,
                nb_local_io: 0,
                nb_remote_io: 0,
                nb_long_latency_dimm: 0,
                nb_extension_memory: 0,
                nb_peer_agent_memory: 0,
                cache_modified_state: 1,
                cache_owned_state: 1,
                nb_local_latency_total: 200,
                nb_remote_latency_total: 350,
            }
        );
        assert_eq!(counters.branch_mispredict_rate(), Some(0.5));
        assert_eq!(counters.branch_taken_rate(), Some(1.0));
        assert_eq!(counters.return_mispredict_rate(), Some(1.0));
        assert_eq!(counters.dc_miss_rate(), Some(0.8));
        assert_eq!(counters.average_dc_miss_latency(), Some(550.0 / 3.0));
        assert_eq!(counters.average_tag_to_retire(), Some(795.0 / 7.0));
        assert_eq!(counters.average_completion_to_retire(), Some(20.0 / 7.0));
        assert_eq!(counters.l1_dtlb_miss_rate(), Some(0.4));
        assert_eq!(counters.l2_dtlb_miss_rate(), Some(0.2));
        assert_eq!(counters.misaligned_rate(), Some(0.2));
        assert_eq!(counters.average_local_latency(), Some(100.0));
        assert_eq!(counters.average_remote_latency(), Some(350.0));
        assert_eq!(IbsOpCounters::default().average_dc_miss_latency(), None);
        assert_eq!(IbsOpCounters::default().branch_mispredict_rate(), None);
    }

    #[test]
    fn events_without_a_register_count_nothing_and_say_why() {
        let counters = IbsOpCounters {
            all_samples: 5,
            ..IbsOpCounters::default()
        };
        let all_caps = IbsCaps(u32::MAX);
        for &event in IbsOpEvent::ALL {
            assert_eq!(
                event.source().is_some(),
                counters.get(event).is_some(),
                "{event:?}"
            );
            if event.source().is_none() {
                assert!(
                    matches!(
                        event.availability(all_caps, IbsErrata::default()),
                        Availability::NotReported(_)
                    ),
                    "{event:?} must never be reported"
                );
            }
        }
        let missing: Vec<_> = IbsOpEvent::ALL
            .iter()
            .filter(|e| e.source().is_none())
            .map(|e| e.name())
            .collect();
        assert_eq!(
            missing,
            [
                "IBS resync",
                "IBS bank conflict on load",
                "IBS bank conflict on store",
                "IBS store-to-load forwarded",
                "IBS store-to-load cancelled",
                "IBS MAB hit"
            ]
        );
        for &event in IbsFetchEvent::ALL {
            assert!(
                event.source().is_some() && IbsFetchCounters::default().get(event).is_some(),
                "{event:?}"
            );
        }
        assert_eq!(counters.get(IbsOpEvent::AllSamples), Some(5));
        assert_eq!(counters.get(IbsOpEvent::MabHit), None);
    }

    #[test]
    fn availability_follows_caps_and_errata() {
        let reported = |a: Availability| a == Availability::Reported;
        let zen2 = IbsCaps(0b111 | (1 << 5));
        let zen4 = IbsCaps(ZEN4_CAPS);
        let none = IbsErrata::default();
        assert!(!reported(IbsOpEvent::LoadResync.availability(zen2, none)));
        assert!(reported(IbsOpEvent::LoadResync.availability(zen4, none)));
        assert!(!reported(IbsOpEvent::NbLocalL3.availability(zen2, none)));
        assert!(reported(IbsOpEvent::NbLocalL3.availability(zen4, none)));
        assert!(!reported(
            IbsOpEvent::NbExtensionMemory.availability(zen2, none)
        ));
        assert!(reported(IbsOpEvent::NbLocalCache.availability(zen2, none)));
        assert!(!reported(
            IbsOpEvent::CacheOwnedState.availability(zen4, IbsErrata::for_cpu(0x19, 0x21))
        ));
        assert!(!reported(
            IbsFetchEvent::ItlbRefillLatencyTotal.availability(zen2, none)
        ));
        assert!(reported(
            IbsFetchEvent::ItlbRefillLatencyTotal.availability(zen4, none)
        ));
        assert!(!reported(
            IbsFetchEvent::IcMiss.availability(zen4, IbsErrata::for_cpu(0x19, 0x01))
        ));
        assert!(reported(IbsFetchEvent::IcMiss.availability(zen4, none)));
        // Without the sampler, nothing is reported.
        assert!(IbsOpEvent::ALL
            .iter()
            .all(|e| !reported(e.availability(IbsCaps(0b011), none))));
        assert!(IbsFetchEvent::ALL
            .iter()
            .all(|e| !reported(e.availability(IbsCaps(0b101), none))));
    }

    #[test]
    fn erratum_fields_are_not_counted() {
        let sample = IbsFetchSample {
            caps: IbsCaps(ZEN4_CAPS),
            ctl: FetchCtl(COMPLETED | IC_MISS | PHYS),
            ..IbsFetchSample::default()
        };
        let mut counters = IbsFetchCounters::default();
        counters.add(&sample.decode(IbsErrata::for_cpu(0x19, 0x01)));
        assert_eq!(
            (counters.ic_miss, counters.ic_hit, counters.completed),
            (0, 0, 1)
        );
    }
}
