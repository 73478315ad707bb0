//! A window's profile cut into the series the fleet backends store: one per process and event,
//! each with the labels a backend indexes it by (service name, host, pid, executable, container,
//! Kubernetes pod, systemd unit), taken from the process's cgroup path.
//!
//! A series holds only its own stacks and the frames they use, so exporting thousands of
//! short-lived processes costs what their samples cost, not processes x frames.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use crate::profile::{
    DataLineSample, EventIndex, FrameId, LineLatencyHistogram, Profile, StackSample,
};
use crate::scope::cgroup::{cgroup2_mount, cgroup_id, cgroup_subtree};
use crate::scope::container::{classify_cgroup_path, Workload};
use crate::scope::kubernetes::{pod_uid_in, KubernetesName, KubernetesNames};

/// How a series' `service_name` is chosen. Backends group and bill by service name, so it should
/// name what runs, not which process runs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceName {
    /// The Kubernetes `namespace/container`, else the container, else the systemd service,
    /// else the executable.
    Auto,
    Executable,
    /// The systemd unit (or the executable outside any unit).
    Unit,
    /// The container id (or the executable outside any container).
    Container,
    /// The Kubernetes `namespace/container` (Grafana Alloy's default; the pod's `namespace/pod`
    /// where only the pod is known), or the executable outside Kubernetes.
    Kubernetes,
    /// One name for everything this agent sends.
    Fixed(String),
}

impl ServiceName {
    /// Parses `--service-name`: `auto`, `executable`, `unit`, `container`, `kubernetes`, or
    /// `=NAME` for a fixed name.
    pub fn parse(text: &str) -> Result<ServiceName, String> {
        match text {
            "auto" => Ok(ServiceName::Auto),
            "executable" => Ok(ServiceName::Executable),
            "unit" => Ok(ServiceName::Unit),
            "container" => Ok(ServiceName::Container),
            "kubernetes" => Ok(ServiceName::Kubernetes),
            _ => match text.strip_prefix('=') {
                Some(name) if !name.is_empty() => Ok(ServiceName::Fixed(name.to_string())),
                _ => Err(format!(
                    "'{text}' is not a service-name rule: use auto, executable, unit, container, \
                     kubernetes, or =NAME for one fixed name"
                )),
            },
        }
    }
}

/// How a backend's series are named: the service-name rule, and the node's filesystem
/// (`--node-root`), whose records name Kubernetes pods.
#[derive(Clone, Debug)]
pub struct SeriesNaming {
    pub service_name: ServiceName,
    pub node_root: PathBuf,
}

/// What a process runs as, read from its cgroup path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessOrigin {
    pub container_id: Option<String>,
    pub container_runtime: Option<&'static str>,
    /// The Kubernetes pod's UID, which kubelet puts in the cgroup path (`pod<UID>`).
    pub pod_uid: Option<String>,
    /// The container's pod, namespace and name, from the node's records.
    pub kubernetes: Option<KubernetesName>,
    pub systemd_unit: Option<String>,
}

impl ProcessOrigin {
    /// Reads a cgroup path such as `/kubepods/burstable/pod<UID>/<id>` or
    /// `/system.slice/nginx.service`.
    pub fn of_cgroup_path(path: &str) -> ProcessOrigin {
        let mut origin = ProcessOrigin {
            pod_uid: pod_uid_in(path),
            ..ProcessOrigin::default()
        };
        match classify_cgroup_path(path) {
            Workload::Container { runtime, id } => {
                origin.container_runtime = Some(runtime.name());
                origin.container_id = Some(id);
            }
            Workload::SystemdUnit(unit) => origin.systemd_unit = Some(unit),
            Workload::Cgroup(_) => {}
        }
        origin
    }
}

/// Cgroup ids (what samples carry) to cgroup paths, read from the cgroup v2 tree. Cgroups of
/// processes that exited stay as long as the cgroup does; a miss rereads the tree once per
/// window.
#[derive(Default)]
pub struct CgroupPaths {
    mount: Option<PathBuf>,
    paths: HashMap<u64, String>,
}

impl CgroupPaths {
    pub fn new() -> CgroupPaths {
        CgroupPaths {
            mount: cgroup2_mount().ok(),
            paths: HashMap::new(),
        }
    }

    /// Makes sure every id of `profile` that exists is known.
    pub fn refresh_for(&mut self, profile: &Profile) {
        let missing = profile
            .stacks
            .iter()
            .any(|s| s.cgroup != 0 && !self.paths.contains_key(&s.cgroup));
        if let (true, Some(mount)) = (missing, &self.mount) {
            self.paths = read_cgroup_paths(mount);
        }
    }

    pub fn path(&self, id: u64) -> Option<&str> {
        self.paths.get(&id).map(String::as_str)
    }
}

fn read_cgroup_paths(mount: &Path) -> HashMap<u64, String> {
    cgroup_subtree(mount)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|dir| {
            let relative = dir.strip_prefix(mount).ok()?.to_str()?;
            Some((cgroup_id(&dir).ok()?, format!("/{relative}")))
        })
        .collect()
}

/// One process's samples of one event, with the labels that name it.
pub struct Series {
    /// Label names in the Pyroscope/Prometheus style (`service_name`, `pid`); exporters map
    /// them to their own conventions.
    pub labels: SeriesLabels,
    /// The process's stacks of the event (event index 0), with only the frames they use.
    pub profile: Profile,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeriesLabels {
    pub service_name: String,
    pub host: String,
    pub pid: u32,
    /// The process's command name (its main thread's).
    pub executable: String,
    pub origin: ProcessOrigin,
    /// The event, as the user named it.
    pub event: String,
}

/// Cuts a window's profile into series, one per process and event, in pid then event order;
/// containers get their Kubernetes names from `kubernetes`.
pub fn series_of(
    profile: &Profile,
    rule: &ServiceName,
    cgroups: &CgroupPaths,
    kubernetes: &mut KubernetesNames,
) -> Vec<Series> {
    let mut groups: BTreeMap<(u32, EventIndex), Vec<&StackSample>> = BTreeMap::new();
    // Any event's samples name the process's cgroup, so all its series share labels.
    let mut cgroup_of: HashMap<u32, &str> = HashMap::new();
    for sample in profile.stacks.iter().filter(|s| s.count > 0) {
        groups
            .entry((sample.pid, sample.event))
            .or_default()
            .push(sample);
        if let Some(path) = cgroups.path(sample.cgroup) {
            cgroup_of.entry(sample.pid).or_insert(path);
        }
    }
    let mut data_lines: HashMap<(u32, EventIndex), Vec<&DataLineSample>> = HashMap::new();
    for line in &profile.data_lines {
        data_lines
            .entry((line.pid, line.event))
            .or_default()
            .push(line);
    }
    groups
        .into_iter()
        .map(|((pid, event), samples)| {
            let origin = cgroup_of
                .get(&pid)
                .map(|path| ProcessOrigin {
                    kubernetes: kubernetes.of_cgroup_path(path),
                    ..ProcessOrigin::of_cgroup_path(path)
                })
                .unwrap_or_default();
            let executable = executable_of(profile, pid);
            let labels = SeriesLabels {
                service_name: service_name(rule, &executable, &origin),
                host: profile.meta.hostname.clone(),
                pid,
                executable,
                origin,
                event: profile.events[event as usize].name.clone(),
            };
            Series {
                labels,
                profile: process_profile(
                    profile,
                    (pid, event),
                    &samples,
                    data_lines.get(&(pid, event)).map_or(&[], Vec::as_slice),
                ),
            }
        })
        .collect()
}

/// The process's name: its main thread's, else any of its threads', else its pid (backends
/// refuse a series whose name is empty).
fn executable_of(profile: &Profile, pid: u32) -> String {
    let threads = profile
        .threads
        .iter()
        .filter(|t| t.pid == pid && !t.comm.is_empty());
    threads
        .clone()
        .find(|t| t.tid == pid)
        .or_else(|| threads.clone().next())
        .map(|t| t.comm.clone())
        .unwrap_or_else(|| format!("pid {pid}"))
}

fn service_name(rule: &ServiceName, executable: &str, origin: &ProcessOrigin) -> String {
    let service = origin
        .systemd_unit
        .as_deref()
        .filter(|unit| unit.ends_with(".service"));
    // `namespace/container` where the container's name is known, else `namespace/pod`.
    let kubernetes = origin.kubernetes.as_ref().map(|name| {
        let last = name.container.as_deref().unwrap_or(&name.pod);
        format!("{}/{last}", name.namespace)
    });
    let chosen = match rule {
        ServiceName::Fixed(name) => Some(name.as_str()),
        ServiceName::Executable => None,
        ServiceName::Unit => origin.systemd_unit.as_deref(),
        ServiceName::Container => origin.container_id.as_deref(),
        ServiceName::Kubernetes => kubernetes.as_deref(),
        ServiceName::Auto => kubernetes
            .as_deref()
            .or(origin.container_id.as_deref())
            .or(service),
    };
    chosen
        .filter(|name| !name.is_empty())
        .unwrap_or(executable)
        .to_string()
}

/// The samples of one process and event as a profile of their own: frames renumbered to those
/// the samples use, the event at index 0, the losses and estimates of the event, and its data
/// addresses with what they belong to.
fn process_profile(
    profile: &Profile,
    (pid, event): (u32, EventIndex),
    samples: &[&StackSample],
    data_lines: &[&DataLineSample],
) -> Profile {
    let mut frame_ids: HashMap<FrameId, FrameId> = HashMap::new();
    let mut frames = Vec::new();
    let mut renumber = |id: FrameId| {
        *frame_ids.entry(id).or_insert_with(|| {
            frames.push(profile.frames[id as usize].clone());
            (frames.len() - 1) as FrameId
        })
    };
    let stacks = samples
        .iter()
        .map(|sample| StackSample {
            event: 0,
            frames: sample.frames.iter().map(|&id| renumber(id)).collect(),
            ..(*sample).clone()
        })
        .collect();
    let data_lines = data_lines
        .iter()
        .map(|d| DataLineSample {
            event: 0,
            frame: renumber(d.frame),
            ..(*d).clone()
        })
        .collect();
    let line_latency = profile
        .line_latency
        .iter()
        .filter(|h| h.pid == pid && h.event == event)
        .map(|h| LineLatencyHistogram {
            event: 0,
            ..h.clone()
        })
        .collect();
    let per_event = |values: &[u64]| values.get(event as usize).copied().into_iter().collect();
    let mut losses = profile.losses.clone();
    losses.samples_fired = per_event(&profile.losses.samples_fired);
    losses.period_sums = per_event(&profile.losses.period_sums);
    losses.event_counts = per_event(&profile.losses.event_counts);
    Profile {
        meta: profile.meta.clone(),
        events: vec![profile.events[event as usize].clone()],
        threads: profile
            .threads
            .iter()
            .filter(|t| t.pid == pid)
            .cloned()
            .collect(),
        frames,
        stacks,
        losses,
        data_lines,
        line_latency,
        memory_maps: (profile.memory_maps.iter())
            .filter(|m| m.pid == pid)
            .cloned()
            .collect(),
        data_symbols: (profile.data_symbols.iter())
            .filter(|s| s.pid == pid)
            .cloned()
            .collect(),
        ..Profile::default()
    }
}

/// Kubernetes names from nowhere: for tests of what does not run in a pod.
#[cfg(test)]
pub(crate) fn no_kubernetes() -> KubernetesNames {
    KubernetesNames::new(Path::new("/nonexistent"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::test_profile;

    #[test]
    fn kubelet_paths_name_the_pod_and_container() {
        let id = "3f1c2a9b8e7d".repeat(6);
        let id = &id[..64];
        let cgroupfs = format!("/kubepods/burstable/pod5b1e0c7a-2f4d-4a8e-9c3b-1d2e3f4a5b6c/{id}");
        let origin = ProcessOrigin::of_cgroup_path(&cgroupfs);
        assert_eq!(
            origin.pod_uid.as_deref(),
            Some("5b1e0c7a-2f4d-4a8e-9c3b-1d2e3f4a5b6c")
        );
        assert_eq!(origin.container_id.as_deref(), Some(id));
        assert_eq!(origin.container_runtime, Some("kubernetes"));

        let systemd = format!(
            "/kubepods.slice/kubepods-besteffort.slice/\
             kubepods-besteffort-pod5b1e0c7a_2f4d_4a8e_9c3b_1d2e3f4a5b6c.slice/\
             cri-containerd-{id}.scope"
        );
        let origin = ProcessOrigin::of_cgroup_path(&systemd);
        assert_eq!(
            origin.pod_uid.as_deref(),
            Some("5b1e0c7a-2f4d-4a8e-9c3b-1d2e3f4a5b6c")
        );
        assert_eq!(origin.container_runtime, Some("containerd"));

        let unit = ProcessOrigin::of_cgroup_path("/system.slice/nginx.service");
        assert_eq!(unit.systemd_unit.as_deref(), Some("nginx.service"));
        assert_eq!(unit.pod_uid, None);
        // A cgroup that only looks like a pod is not one.
        assert_eq!(ProcessOrigin::of_cgroup_path("/batch/ipod-x").pod_uid, None);
    }

    #[test]
    fn a_process_without_a_name_is_named_by_its_pid() {
        let mut profile = test_profile::profile();
        for thread in &mut profile.threads {
            thread.comm.clear();
        }
        let series = series_of(
            &profile,
            &ServiceName::Auto,
            &CgroupPaths::default(),
            &mut no_kubernetes(),
        );
        assert_eq!(series[0].labels.executable, "pid 100");
        assert_eq!(series[0].labels.service_name, "pid 100");
    }

    #[test]
    fn service_names_follow_the_rule() {
        let unit = ProcessOrigin::of_cgroup_path("/system.slice/nginx.service");
        let user = ProcessOrigin::of_cgroup_path("/user.slice/user-0.slice/session-3.scope");
        let auto = ServiceName::parse("auto").unwrap();
        assert_eq!(service_name(&auto, "nginx", &unit), "nginx.service");
        // A login session is not a service: the executable names it better.
        assert_eq!(service_name(&auto, "python3", &user), "python3");
        assert_eq!(
            service_name(&ServiceName::parse("unit").unwrap(), "python3", &user),
            "session-3.scope"
        );
        assert_eq!(
            service_name(&ServiceName::parse("executable").unwrap(), "nginx", &unit),
            "nginx"
        );
        assert_eq!(
            service_name(&ServiceName::parse("=checkout").unwrap(), "nginx", &unit),
            "checkout"
        );
        assert!(ServiceName::parse("=").is_err());
        assert!(ServiceName::parse("pod")
            .unwrap_err()
            .contains("auto, executable, unit, container, kubernetes"));

        // In a pod: Kubernetes names first, the container's or else the pod's.
        let id = "3f".repeat(32);
        let mut pod = ProcessOrigin::of_cgroup_path(&format!(
            "/kubepods/burstable/pod5b1e0c7a-2f4d-4a8e-9c3b-1d2e3f4a5b6c/{id}"
        ));
        let kubernetes = ServiceName::parse("kubernetes").unwrap();
        assert_eq!(service_name(&auto, "java", &pod), id, "no records: the id");
        assert_eq!(service_name(&kubernetes, "java", &pod), "java");
        pod.kubernetes = Some(KubernetesName {
            namespace: "prod".into(),
            pod: "shop-7d9f".into(),
            container: Some("web".into()),
        });
        assert_eq!(service_name(&auto, "java", &pod), "prod/web");
        assert_eq!(service_name(&kubernetes, "java", &pod), "prod/web");
        assert_eq!(service_name(&ServiceName::Container, "java", &pod), id);
        pod.kubernetes.as_mut().unwrap().container = None;
        assert_eq!(service_name(&kubernetes, "java", &pod), "prod/shop-7d9f");
        assert_eq!(service_name(&kubernetes, "nginx", &unit), "nginx");
    }

    #[test]
    fn a_series_holds_its_events_data_addresses_and_what_they_belong_to() {
        let profile = test_profile::profile_with_data();
        let series = series_of(
            &profile,
            &ServiceName::Auto,
            &CgroupPaths::default(),
            &mut no_kubernetes(),
        );
        let faults = series
            .iter()
            .find(|s| s.labels.event == "page-faults")
            .unwrap();
        let lines: Vec<(u64, String)> = faults
            .profile
            .data_lines
            .iter()
            .map(|d| {
                assert_eq!(d.event, 0);
                let frame = &faults.profile.frames[d.frame as usize];
                (d.line, frame.display_name())
            })
            .collect();
        assert_eq!(
            lines,
            [
                (test_profile::HEAP_LINE, "compute".to_string()),
                (test_profile::GLOBAL_LINE, "libblob.so+0x4a10".to_string()),
            ]
        );
        assert_eq!(faults.profile.line_latency.len(), 1);
        assert_eq!(faults.profile.line_latency[0].event, 0);
        assert_eq!(faults.profile.memory_maps.len(), 1);
        assert_eq!(faults.profile.data_symbols.len(), 1);
        let cpu = series
            .iter()
            .find(|s| s.labels.event == "cpu-clock")
            .unwrap();
        assert!(cpu.profile.data_lines.is_empty() && cpu.profile.line_latency.is_empty());
    }

    #[test]
    fn a_series_holds_one_process_and_event_with_only_its_frames() {
        let profile = test_profile::profile();
        let series = series_of(
            &profile,
            &ServiceName::Auto,
            &CgroupPaths::default(),
            &mut no_kubernetes(),
        );
        let keys: Vec<(u32, &str)> = series
            .iter()
            .map(|s| (s.labels.pid, s.labels.event.as_str()))
            .collect();
        let mut expected: Vec<(u32, &str)> = profile
            .stacks
            .iter()
            .filter(|s| s.count > 0)
            .map(|s| (s.pid, profile.events[s.event as usize].name.as_str()))
            .collect();
        expected.sort_by_key(|&(pid, event)| {
            (pid, profile.events.iter().position(|e| e.name == event))
        });
        expected.dedup();
        assert_eq!(keys, expected);
        for one in &series {
            assert_eq!(one.profile.events.len(), 1);
            assert!(one.profile.stacks.iter().all(|s| s.pid == one.labels.pid));
            // Every frame is used, and each stack names the same functions as in the window.
            let used: std::collections::HashSet<FrameId> = one
                .profile
                .stacks
                .iter()
                .flat_map(|s| s.frames.iter().copied())
                .collect();
            assert_eq!(used.len(), one.profile.frames.len());
            let total: u64 = one.profile.stacks.iter().map(|s| s.count).sum();
            let window_total: u64 = profile
                .stacks
                .iter()
                .filter(|s| {
                    s.pid == one.labels.pid
                        && profile.events[s.event as usize].name == one.labels.event
                })
                .map(|s| s.count)
                .sum();
            assert_eq!(total, window_total);
            assert!(!one.labels.executable.is_empty());
        }
    }
}
