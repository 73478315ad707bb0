//! Containers and systemd units named by cgroup paths: which workload a sampled process belongs
//! to (from /proc/PID/cgroup), and which cgroup `--container ID` means. Container runtimes name
//! a container's cgroup after its 64-hex-digit id: docker (`docker-ID.scope`, `/docker/ID`),
//! containerd under Kubernetes (`cri-containerd-ID.scope`), CRI-O (`crio-ID.scope`), podman
//! (`libpod-ID.scope`, `/libpod_parent/libpod-ID`), and the Kubernetes cgroupfs driver
//! (`/kubepods/QOS/podUID/ID`).

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use super::cgroup::{cgroup_subtree, process_cgroups, ProcCgroup};
use super::ScopeError;

/// Hex digits of a container id.
const CONTAINER_ID_LEN: usize = 64;
/// Hex digits `docker ps` shows, and the short form used in reports.
const SHORT_ID_LEN: usize = 12;
/// Fewest digits `--container` accepts: shorter prefixes match containers by accident.
const MIN_QUERY_LEN: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Runtime {
    Docker,
    Containerd,
    CriO,
    Podman,
    /// A Kubernetes container under the cgroupfs driver, whose path does not name the runtime.
    Kubernetes,
}

impl Runtime {
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Docker => "docker",
            Runtime::Containerd => "containerd",
            Runtime::CriO => "cri-o",
            Runtime::Podman => "podman",
            Runtime::Kubernetes => "kubernetes",
        }
    }
}

/// What a cgroup path says a process runs as.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Workload {
    Container {
        runtime: Runtime,
        id: String,
    },
    /// The innermost systemd service or scope (or slice, when there is no service or scope).
    SystemdUnit(String),
    /// Any other cgroup, by its path.
    Cgroup(String),
}

impl fmt::Display for Workload {
    /// Short form for reports: `docker:3f1c2a9b8e7d`, `nginx.service`, `/batch/job7`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Workload::Container { runtime, id } => {
                write!(
                    f,
                    "{}:{}",
                    runtime.name(),
                    id.get(..SHORT_ID_LEN).unwrap_or(id)
                )
            }
            Workload::SystemdUnit(unit) => f.write_str(unit),
            Workload::Cgroup(path) => f.write_str(path),
        }
    }
}

/// Cgroup names `PREFIX<id>` or `PREFIX<id>.scope` that runtimes give a container. Conmon
/// monitors (`libpod-conmon-<id>`, `crio-conmon-<id>`) fail the id check: they are units.
const RUNTIME_PREFIXES: [(&str, Runtime); 4] = [
    ("docker-", Runtime::Docker),
    ("cri-containerd-", Runtime::Containerd),
    ("crio-", Runtime::CriO),
    ("libpod-", Runtime::Podman),
];

/// Classifies a cgroup v2 (or v1) path like `/system.slice/docker-<id>.scope`.
pub fn classify_cgroup_path(path: &str) -> Workload {
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    // The innermost container wins: a sub-cgroup of a container still belongs to it.
    for (depth, component) in components.iter().enumerate().rev() {
        if let Some((runtime, id)) = container_in(component, &components[..depth]) {
            return Workload::Container {
                runtime,
                id: id.to_string(),
            };
        }
    }
    let unit = |suffixes: &[&str]| {
        components
            .iter()
            .rev()
            .find(|c| suffixes.iter().any(|suffix| c.ends_with(suffix)))
    };
    match unit(&[".service", ".scope"]).or_else(|| unit(&[".slice"])) {
        Some(unit) => Workload::SystemdUnit(unit.to_string()),
        None if path.is_empty() => Workload::Cgroup("/".to_string()),
        None => Workload::Cgroup(path.to_string()),
    }
}

/// The container a cgroup directory name stands for, given the names of its ancestors.
fn container_in<'a>(component: &'a str, ancestors: &[&str]) -> Option<(Runtime, &'a str)> {
    let stem = component.strip_suffix(".scope").unwrap_or(component);
    let prefixed = RUNTIME_PREFIXES.iter().find_map(|&(prefix, runtime)| {
        stem.strip_prefix(prefix)
            .filter(|id| is_container_id(id))
            .map(|id| (runtime, id))
    });
    if prefixed.is_some() || !is_container_id(component) {
        return prefixed;
    }
    // A bare id: the runtime is told by where it lives.
    let runtime = ancestors
        .iter()
        .rev()
        .find_map(|&ancestor| match ancestor {
            "docker" => Some(Runtime::Docker),
            "libpod_parent" => Some(Runtime::Podman),
            _ if ancestor.starts_with("kubepods") => Some(Runtime::Kubernetes),
            _ => None,
        })?;
    Some((runtime, component))
}

fn is_container_id(text: &str) -> bool {
    text.len() == CONTAINER_ID_LEN && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The workload of a process from its cgroups: a container found in any hierarchy first (on
/// hybrid v1/v2 systems runtimes may only name v1 cgroups), then a systemd unit, else the v2
/// cgroup path.
pub fn classify_process(cgroups: &[ProcCgroup]) -> Workload {
    let v2_first = cgroups
        .iter()
        .filter(|c| c.is_v2())
        .chain(cgroups.iter().filter(|c| !c.is_v2()));
    let rank = |workload: &Workload| match workload {
        Workload::Container { .. } => 0,
        Workload::SystemdUnit(_) => 1,
        Workload::Cgroup(_) => 2,
    };
    v2_first
        .map(|cgroup| classify_cgroup_path(&cgroup.path))
        .min_by_key(rank)
        .unwrap_or_else(|| Workload::Cgroup("/".to_string()))
}

/// The workload of a running process.
pub fn workload_of_pid(pid: u32) -> io::Result<Workload> {
    Ok(classify_process(&process_cgroups(pid)?))
}

/// The cgroup directory under `root` (the cgroup2 mount) of the container whose id is or
/// starts with `query`: the outermost directory of that container, so that its subtree holds
/// all of the container's processes.
pub fn find_container_cgroup(root: &Path, query: &str) -> Result<PathBuf, ScopeError> {
    let query_id = query.to_ascii_lowercase();
    if query_id.len() < MIN_QUERY_LEN
        || query_id.len() > CONTAINER_ID_LEN
        || !query_id.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Err(ScopeError::BadContainerId {
            query: query.to_string(),
        });
    }
    let dirs = cgroup_subtree(root).map_err(|source| ScopeError::Io {
        path: root.into(),
        source,
    })?;
    // Parents come before children, so the first directory seen for an id is its outermost.
    let mut matches: BTreeMap<String, PathBuf> = BTreeMap::new();
    for dir in dirs {
        let Ok(relative) = dir.strip_prefix(root) else {
            continue;
        };
        let Some(relative) = relative.to_str() else {
            continue;
        };
        if let Workload::Container { id, .. } = classify_cgroup_path(relative) {
            if id.starts_with(&query_id) {
                matches.entry(id).or_insert(dir);
            }
        }
    }
    let mut found = matches.into_iter();
    match (found.next(), found.next()) {
        (Some((_, dir)), None) => Ok(dir),
        (None, _) => Err(ScopeError::NoContainer {
            query: query.to_string(),
            root: root.into(),
        }),
        (Some(first), Some(second)) => {
            let ids = [first, second]
                .into_iter()
                .chain(found)
                .map(|(id, _)| id[..SHORT_ID_LEN].to_string())
                .collect();
            Err(ScopeError::AmbiguousContainer {
                query: query.to_string(),
                ids,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scope::cgroup::{cgroup2_mount, cgroup_id, cgroup_subtree_ids, parse_proc_cgroup};
    use crate::scope::temp_tree;
    use std::fs;
    use std::process::{Child, Command};
    use std::time::Duration;

    const ID: &str = "3f1c2a9b8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b";
    const OTHER: &str = "3f1c77c0ffee6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b";

    fn container(runtime: Runtime) -> Workload {
        Workload::Container {
            runtime,
            id: ID.to_string(),
        }
    }

    #[test]
    fn classifies_each_runtimes_cgroup_layout() {
        let cases = [
            // docker, systemd cgroup driver (v2) and cgroupfs driver (v1 / v2).
            (
                format!("/system.slice/docker-{ID}.scope"),
                container(Runtime::Docker),
            ),
            (format!("/docker/{ID}"), container(Runtime::Docker)),
            // Kubernetes with containerd, systemd driver.
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod\
                     7a1b2c3d_4e5f_6789_abcd_ef0123456789.slice/cri-containerd-{ID}.scope"
                ),
                container(Runtime::Containerd),
            ),
            // Kubernetes, cgroupfs driver: the runtime is not in the path.
            (
                format!("/kubepods/besteffort/pod7a1b2c3d-4e5f-6789-abcd-ef0123456789/{ID}"),
                container(Runtime::Kubernetes),
            ),
            // CRI-O, systemd and cgroupfs drivers.
            (
                format!(
                    "/kubepods.slice/kubepods-pod7a1b2c3d_4e5f_6789_abcd_ef0123456789.slice/\
                     crio-{ID}.scope"
                ),
                container(Runtime::CriO),
            ),
            (
                format!("/kubepods/pod7a1b2c3d-4e5f-6789-abcd-ef0123456789/crio-{ID}"),
                container(Runtime::CriO),
            ),
            // podman: root with systemd, rootless (its sub-cgroup), cgroupfs.
            (
                format!("/machine.slice/libpod-{ID}.scope"),
                container(Runtime::Podman),
            ),
            (
                format!(
                    "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/\
                     container"
                ),
                container(Runtime::Podman),
            ),
            (
                format!("/libpod_parent/libpod-{ID}"),
                container(Runtime::Podman),
            ),
            // Monitors and ordinary services are units, not containers.
            (
                format!("/machine.slice/libpod-conmon-{ID}.scope"),
                Workload::SystemdUnit(format!("libpod-conmon-{ID}.scope")),
            ),
            (
                format!("/system.slice/crio-conmon-{ID}.scope"),
                Workload::SystemdUnit(format!("crio-conmon-{ID}.scope")),
            ),
            (
                "/system.slice/nginx.service".into(),
                Workload::SystemdUnit("nginx.service".into()),
            ),
            (
                "/user.slice/user-1000.slice/session-2.scope".into(),
                Workload::SystemdUnit("session-2.scope".into()),
            ),
            (
                "/system.slice/postgresql@15-main.service/worker".into(),
                Workload::SystemdUnit("postgresql@15-main.service".into()),
            ),
            (
                "/user.slice/user-1000.slice".into(),
                Workload::SystemdUnit("user-1000.slice".into()),
            ),
            ("/".into(), Workload::Cgroup("/".into())),
            ("/batch/job7".into(), Workload::Cgroup("/batch/job7".into())),
            // A 64-hex name with no known runtime around it, and a too-short "id".
            (
                format!("/custom/{ID}"),
                Workload::Cgroup(format!("/custom/{ID}")),
            ),
            (
                "/system.slice/docker-3f1c2a9b.scope".into(),
                Workload::SystemdUnit("docker-3f1c2a9b.scope".into()),
            ),
        ];
        for (path, expected) in cases {
            assert_eq!(classify_cgroup_path(&path), expected, "{path}");
        }
    }

    #[test]
    fn displays_short_container_ids_and_unit_names() {
        assert_eq!(
            container(Runtime::Docker).to_string(),
            "docker:3f1c2a9b8e7d"
        );
        assert_eq!(container(Runtime::CriO).to_string(), "cri-o:3f1c2a9b8e7d");
        assert_eq!(
            Workload::SystemdUnit("nginx.service".into()).to_string(),
            "nginx.service"
        );
        assert_eq!(
            Workload::Cgroup("/batch/job7".into()).to_string(),
            "/batch/job7"
        );
    }

    #[test]
    fn classifies_processes_from_proc_pid_cgroup() {
        // Hybrid v1/v2 host running docker with the cgroupfs driver: only v1 names the container.
        let hybrid = format!(
            "12:memory:/docker/{ID}\n4:cpu,cpuacct:/docker/{ID}\n1:name=systemd:/docker/{ID}\n0::/\n"
        );
        assert_eq!(
            classify_process(&parse_proc_cgroup(&hybrid)),
            container(Runtime::Docker)
        );
        let unified = "0::/system.slice/containerd.service\n";
        assert_eq!(
            classify_process(&parse_proc_cgroup(unified)),
            Workload::SystemdUnit("containerd.service".into())
        );
        // This VM's layout: an unnamed v1 memory group; the v2 path is the one BPF ids follow.
        let plain = "4:memory:/process_api/56cd8fde99ead23bd094d9e69b4c9ab7\n0::/\n";
        assert_eq!(
            classify_process(&parse_proc_cgroup(plain)),
            Workload::Cgroup("/".into())
        );
        assert_eq!(classify_process(&[]), Workload::Cgroup("/".into()));
    }

    #[test]
    fn finds_containers_by_unique_id_prefix() {
        let root = temp_tree("containers");
        let docker = root.join(format!("system.slice/docker-{ID}.scope"));
        let podman = root.join(format!("user.slice/libpod-{OTHER}.scope"));
        fs::create_dir_all(docker.join("init")).unwrap();
        fs::create_dir_all(podman.join("container")).unwrap();
        fs::create_dir_all(root.join(format!("user.slice/libpod-conmon-{OTHER}.scope"))).unwrap();

        assert_eq!(find_container_cgroup(&root, ID).unwrap(), docker);
        assert_eq!(find_container_cgroup(&root, "3F1C2A").unwrap(), docker);
        assert_eq!(find_container_cgroup(&root, "3f1c77").unwrap(), podman);

        let ambiguous = find_container_cgroup(&root, "3f1c")
            .unwrap_err()
            .to_string();
        assert!(
            ambiguous.contains("matches 2 containers (3f1c2a9b8e7d, 3f1c77c0ffee)"),
            "{ambiguous}"
        );
        let missing = find_container_cgroup(&root, "abcd")
            .unwrap_err()
            .to_string();
        assert_eq!(
            missing,
            format!(
                "no container matching 'abcd' under {} (is it running? docker ps shows ids)",
                root.display()
            )
        );
        for bad in ["3f1", "web-frontend", &format!("{ID}0")] {
            let err = find_container_cgroup(&root, bad).unwrap_err();
            assert!(
                matches!(err, ScopeError::BadContainerId { .. }),
                "{bad}: {err}"
            );
        }
        fs::remove_dir_all(root).unwrap();
    }

    /// A cgroup made in the real cgroup v2 hierarchy, with a process in it; removed on drop.
    struct LiveCgroup {
        parent: PathBuf,
        container: PathBuf,
        process: Child,
    }

    impl LiveCgroup {
        fn new(mount: &Path) -> LiveCgroup {
            let parent = mount.join(format!("profiler-test-{}", std::process::id()));
            let container = parent.join(format!("docker-{ID}.scope"));
            fs::create_dir_all(&container).unwrap_or_else(|e| {
                panic!(
                    "cannot create {} (tests run as root): {e}",
                    container.display()
                )
            });
            let process = Command::new("sleep").arg("60").spawn().unwrap();
            let live = LiveCgroup {
                parent,
                container,
                process,
            };
            fs::write(
                live.container.join("cgroup.procs"),
                live.process.id().to_string(),
            )
            .unwrap();
            live
        }
    }

    impl Drop for LiveCgroup {
        fn drop(&mut self) {
            let _ = self.process.kill();
            let _ = self.process.wait();
            // The kernel frees a cgroup shortly after its last process is reaped.
            for dir in [&self.container, &self.parent] {
                for _ in 0..100 {
                    if fs::remove_dir(dir).is_ok() || !dir.exists() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }

    #[test]
    fn a_process_moved_into_a_real_cgroup_is_found_there() {
        let mount = cgroup2_mount().expect("this test needs a cgroup v2 hierarchy");
        let live = LiveCgroup::new(&mount);
        let pid = live.process.id();

        let cgroups = process_cgroups(pid).unwrap();
        let v2 = cgroups
            .iter()
            .find(|c| c.is_v2())
            .expect("no v2 line in /proc/PID/cgroup");
        let relative = live.container.strip_prefix(&mount).unwrap();
        assert_eq!(v2.path, format!("/{}", relative.display()));
        assert_eq!(workload_of_pid(pid).unwrap(), container(Runtime::Docker));
        assert_eq!(
            find_container_cgroup(&mount, &ID[..8]).unwrap(),
            live.container
        );
        let resolved =
            crate::scope::cgroup::resolve_cgroup_dir(Path::new(&v2.path), &mount).unwrap();
        assert_eq!(resolved, live.container.canonicalize().unwrap());

        // The id is the directory's inode number, as stat(1) reports it.
        let inode = |dir: &Path| -> u64 {
            let out = Command::new("stat")
                .args(["--format=%i"])
                .arg(dir)
                .output()
                .unwrap();
            String::from_utf8(out.stdout)
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        };
        assert_eq!(cgroup_id(&live.container).unwrap(), inode(&live.container));
        assert_eq!(
            cgroup_subtree_ids(&live.parent).unwrap(),
            [inode(&live.parent), inode(&live.container)]
        );
    }
}
