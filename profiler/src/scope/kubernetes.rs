//! Kubernetes names of a container (its pod, the pod's namespace, the container's name), which
//! fleet users filter and group by, read from the node's own records and matched by the
//! container id and pod UID that the cgroup path gives (see [`super::container`]). Never from
//! the API server: the agent needs no credentials and keeps naming pods while the control plane
//! is away. Where each name comes from, first found first:
//!
//! 1. the container runtime's state of the container: containerd's task bundle
//!    (`run/containerd/io.containerd.runtime.v2.task/k8s.io/ID/config.json`, whose annotations
//!    the CRI plugin writes as `io.kubernetes.cri.sandbox-namespace`, `-sandbox-name`,
//!    `-container-name`), CRI-O's (`run/containers/storage/overlay-containers/ID/userdata/
//!    config.json`, annotations `io.kubernetes.pod.namespace`, `.pod.name`, `.container.name`)
//!    and Docker's under cri-dockerd (`var/lib/docker/containers/ID/config.v2.json`, the same
//!    names as labels);
//! 2. kubelet's log links, `var/log/containers/POD_NAMESPACE_CONTAINER-ID.log`;
//! 3. kubelet's pod log directories, `var/log/pods/NAMESPACE_POD_UID/CONTAINER/`, by the pod's
//!    UID: the pod, and the container when the pod has only one.
//!
//! All are read under the node's root (`--node-root`: `/`, or where a DaemonSet mounts the
//! host), as regular files only, bounded, without following a final link; a name that is not
//! a Kubernetes name (empty, too long, or with characters names cannot hold) is not used.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::container::{classify_cgroup_path, Workload};
use crate::input::{open_regular, read_text_bounded, FinalLink};

/// Largest runtime state file read: real ones are tens of KiB.
const MAX_STATE_FILE: u64 = 4 << 20;
/// Kubernetes names are DNS subdomains at most.
const MAX_NAME_LEN: usize = 253;
/// Most entries of one kubelet log directory read per window.
const MAX_LOG_ENTRIES: usize = 1 << 16;
/// Containers whose names are remembered; past it the memory starts over.
const MAX_REMEMBERED: usize = 4096;

/// The runtimes' state files of a container, by id: the directory, then the file under the
/// container's own directory, then where in the file's JSON the name map is.
const RUNTIME_STATES: [(&str, &str, &str); 5] = [
    (
        "run/containerd/io.containerd.runtime.v2.task/k8s.io",
        "config.json",
        "/annotations",
    ),
    (
        "run/containerd/io.containerd.runtime.v1.linux/k8s.io",
        "config.json",
        "/annotations",
    ),
    (
        "run/containers/storage/overlay-containers",
        "userdata/config.json",
        "/annotations",
    ),
    (
        "var/lib/containers/storage/overlay-containers",
        "userdata/config.json",
        "/annotations",
    ),
    (
        "var/lib/docker/containers",
        "config.v2.json",
        "/Config/Labels",
    ),
];

/// The keys of each name: containerd's CRI plugin's, then CRI-O's and cri-dockerd's.
const NAMESPACE_KEYS: [&str; 2] = [
    "io.kubernetes.cri.sandbox-namespace",
    "io.kubernetes.pod.namespace",
];
const POD_KEYS: [&str; 2] = ["io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name"];
const CONTAINER_KEYS: [&str; 2] = [
    "io.kubernetes.cri.container-name",
    "io.kubernetes.container.name",
];

/// kubelet's log links (`POD_NAMESPACE_CONTAINER-ID.log`) and pod log directories
/// (`NAMESPACE_POD_UID`).
const LOG_LINKS: &str = "var/log/containers";
const POD_LOGS: &str = "var/log/pods";

/// A container's place in Kubernetes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KubernetesName {
    pub namespace: String,
    pub pod: String,
    /// The container's name in its pod; `None` for the pod's sandbox, or where only the pod is
    /// known.
    pub container: Option<String>,
}

impl fmt::Display for KubernetesName {
    /// `namespace/pod/container`, as `kubectl -n NAMESPACE logs POD -c CONTAINER` names it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.pod)?;
        match &self.container {
            Some(container) => write!(f, "/{container}"),
            None => Ok(()),
        }
    }
}

/// Finds and remembers the Kubernetes names of containers on this node.
pub struct KubernetesNames {
    node_root: PathBuf,
    /// By container id, once found: a container's names never change.
    known: HashMap<String, KubernetesName>,
    /// Containers looked for in vain this window: looked for again next window (their records
    /// may come after their first sample).
    missed: HashSet<String>,
    /// kubelet's directories as listed this window (read at the first need).
    log_links: Option<Vec<String>>,
    pod_logs: Option<Vec<String>>,
}

impl KubernetesNames {
    /// Names read from the records under `node_root`, the node's filesystem.
    pub fn new(node_root: &Path) -> KubernetesNames {
        KubernetesNames {
            node_root: node_root.to_path_buf(),
            known: HashMap::new(),
            missed: HashSet::new(),
            log_links: None,
            pod_logs: None,
        }
    }

    /// Starts a window: containers not found are looked for again, in records read again.
    pub fn start_window(&mut self) {
        self.missed.clear();
        self.log_links = None;
        self.pod_logs = None;
    }

    /// The names of the container `id` (64 hex digits), in the pod of UID `pod_uid` where the
    /// cgroup path says which.
    pub fn name(&mut self, id: &str, pod_uid: Option<&str>) -> Option<KubernetesName> {
        if let Some(name) = self.known.get(id) {
            return Some(name.clone());
        }
        if self.missed.contains(id) || !is_hex_id(id) {
            return None;
        }
        let found = self
            .in_runtime_state(id)
            .or_else(|| self.in_log_links(id))
            .or_else(|| pod_uid.and_then(|uid| self.in_pod_logs(uid)));
        match &found {
            Some(name) => {
                if self.known.len() >= MAX_REMEMBERED {
                    self.known.clear();
                }
                self.known.insert(id.to_string(), name.clone());
            }
            None => {
                self.missed.insert(id.to_string());
            }
        }
        found
    }

    /// The names of the container a cgroup path (`/kubepods/burstable/podUID/ID`) is of.
    pub fn of_cgroup_path(&mut self, path: &str) -> Option<KubernetesName> {
        match classify_cgroup_path(path) {
            Workload::Container { id, .. } => self.name(&id, pod_uid_in(path).as_deref()),
            _ => None,
        }
    }

    fn in_runtime_state(&self, id: &str) -> Option<KubernetesName> {
        RUNTIME_STATES.iter().find_map(|(dir, file, names_at)| {
            let path = self.node_root.join(dir).join(id).join(file);
            let file = open_regular(&path, FinalLink::Refuse).ok()?;
            let text = read_text_bounded(file, MAX_STATE_FILE).ok()?;
            let state: Value = serde_json::from_str(&text).ok()?;
            names_in(state.pointer(names_at)?)
        })
    }

    fn in_log_links(&mut self, id: &str) -> Option<KubernetesName> {
        let root = &self.node_root;
        let links = self
            .log_links
            .get_or_insert_with(|| directory_names(&root.join(LOG_LINKS)));
        links.iter().find_map(|link| {
            let (name, link_id) = link.strip_suffix(".log")?.rsplit_once('-')?;
            if link_id != id {
                return None;
            }
            let [pod, namespace, container] = three_parts(name)?;
            Some(KubernetesName {
                namespace: namespace.to_string(),
                pod: pod.to_string(),
                container: Some(container.to_string()),
            })
        })
    }

    fn in_pod_logs(&mut self, pod_uid: &str) -> Option<KubernetesName> {
        let root = &self.node_root;
        let pods = self
            .pod_logs
            .get_or_insert_with(|| directory_names(&root.join(POD_LOGS)));
        let (directory, namespace, pod) = pods.iter().find_map(|directory| {
            let [namespace, pod, uid] = three_parts_any(directory)?;
            (uid == pod_uid && is_name(namespace) && is_name(pod))
                .then_some((directory, namespace, pod))
        })?;
        let containers = directory_names(&self.node_root.join(POD_LOGS).join(directory));
        let container = match containers.as_slice() {
            [only] if is_name(only) => Some(only.clone()),
            _ => None,
        };
        Some(KubernetesName {
            namespace: namespace.to_string(),
            pod: pod.to_string(),
            container,
        })
    }
}

/// The pod UID in a kubelet cgroup path: `pod<UID>` (cgroupfs driver) or
/// `kubepods-<qos>-pod<UID with _ for ->.slice` (systemd driver).
pub fn pod_uid_in(path: &str) -> Option<String> {
    path.split('/').rev().find_map(|component| {
        let stem = component.strip_suffix(".slice").unwrap_or(component);
        let (before, uid) = stem.rsplit_once("pod")?;
        let kubelet = before.is_empty() || before.starts_with("kubepods");
        let uid = uid.replace('_', "-");
        let well_formed =
            uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
        (kubelet && well_formed).then_some(uid)
    })
}

/// The names in a runtime's annotation or label map, where it has the pod's namespace and name.
fn names_in(map: &Value) -> Option<KubernetesName> {
    let first = |keys: &[&str]| {
        keys.iter()
            .find_map(|key| map.get(key)?.as_str().filter(|name| is_name(name)))
            .map(str::to_string)
    };
    Some(KubernetesName {
        namespace: first(&NAMESPACE_KEYS)?,
        pod: first(&POD_KEYS)?,
        container: first(&CONTAINER_KEYS),
    })
}

/// `A_B_C` where each part is a Kubernetes name (none can hold `_`).
fn three_parts(text: &str) -> Option<[&str; 3]> {
    three_parts_any(text).filter(|parts| parts.iter().all(|part| is_name(part)))
}

fn three_parts_any(text: &str) -> Option<[&str; 3]> {
    let mut parts = text.split('_');
    let found = [parts.next()?, parts.next()?, parts.next()?];
    parts.next().is_none().then_some(found)
}

/// Whether `text` can be a namespace, pod or container name: RFC 1123 labels and subdomains
/// (lower-case letters, digits, `-` and `.`), leniently in case.
fn is_name(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= MAX_NAME_LEN
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
}

fn is_hex_id(id: &str) -> bool {
    !id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The names in a directory, at most [`MAX_LOG_ENTRIES`]; none where it cannot be read.
fn directory_names(directory: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(directory) else {
        return Vec::new();
    };
    entries
        .take(MAX_LOG_ENTRIES)
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "5b1e0c7a-2f4d-4a8e-9c3b-1d2e3f4a5b6c";

    fn id(digit: char) -> String {
        std::iter::repeat_n(digit, 64).collect()
    }

    /// Where runtime `which` of [`RUNTIME_STATES`] keeps container `id`'s state.
    fn runtime_state(root: &Path, which: usize, id: &str) -> PathBuf {
        let (directory, file, _) = RUNTIME_STATES[which];
        root.join(directory).join(id).join(file)
    }

    fn write(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    fn name(namespace: &str, pod: &str, container: Option<&str>) -> KubernetesName {
        KubernetesName {
            namespace: namespace.into(),
            pod: pod.into(),
            container: container.map(Into::into),
        }
    }

    #[test]
    fn each_runtimes_state_names_its_containers() {
        let node = tempfile::tempdir().unwrap();
        let root = node.path();
        let containerd = format!(
            r#"{{"ociVersion":"1.1.0","annotations":{{
                "io.kubernetes.cri.container-type":"container",
                "io.kubernetes.cri.container-name":"web",
                "io.kubernetes.cri.sandbox-name":"shop-7d9f",
                "io.kubernetes.cri.sandbox-namespace":"prod",
                "io.kubernetes.cri.sandbox-uid":"{UID}"}}}}"#
        );
        write(&runtime_state(root, 0, &id('a')), &containerd);
        // The pod's sandbox (pause) container has no container name.
        write(
            &runtime_state(root, 0, &id('b')),
            r#"{"annotations":{"io.kubernetes.cri.container-type":"sandbox",
                "io.kubernetes.cri.sandbox-name":"shop-7d9f",
                "io.kubernetes.cri.sandbox-namespace":"prod"}}"#,
        );
        write(
            &runtime_state(root, 2, &id('c')),
            r#"{"annotations":{"io.kubernetes.pod.namespace":"kube-system",
                "io.kubernetes.pod.name":"coredns-5d78c9869d-x2x4q",
                "io.kubernetes.container.name":"coredns"}}"#,
        );
        write(
            &runtime_state(root, 4, &id('d')),
            r#"{"Config":{"Labels":{"io.kubernetes.pod.namespace":"batch",
                "io.kubernetes.pod.name":"nightly-28372","io.kubernetes.container.name":"job"}}}"#,
        );
        let mut names = KubernetesNames::new(root);
        assert_eq!(
            names.name(&id('a'), Some(UID)),
            Some(name("prod", "shop-7d9f", Some("web")))
        );
        assert_eq!(
            names.name(&id('b'), None),
            Some(name("prod", "shop-7d9f", None))
        );
        assert_eq!(
            names.name(&id('c'), None),
            Some(name(
                "kube-system",
                "coredns-5d78c9869d-x2x4q",
                Some("coredns")
            ))
        );
        assert_eq!(
            names.name(&id('d'), None),
            Some(name("batch", "nightly-28372", Some("job")))
        );
        assert_eq!(names.name(&id('e'), None), None);
        assert_eq!(
            name("prod", "shop-7d9f", Some("web")).to_string(),
            "prod/shop-7d9f/web"
        );
    }

    #[test]
    fn kubelets_log_layout_names_containers_and_pods() {
        let node = tempfile::tempdir().unwrap();
        let root = node.path();
        let pod_dir = root.join(POD_LOGS).join(format!("prod_shop-7d9f_{UID}"));
        write(&pod_dir.join("web/0.log"), "");
        fs::create_dir_all(root.join(LOG_LINKS)).unwrap();
        std::os::unix::fs::symlink(
            pod_dir.join("web/0.log"),
            root.join(LOG_LINKS)
                .join(format!("shop-7d9f_prod_web-{}.log", id('a'))),
        )
        .unwrap();
        let mut names = KubernetesNames::new(root);
        // By the container id in the link's name.
        assert_eq!(
            names.name(&id('a'), None),
            Some(name("prod", "shop-7d9f", Some("web")))
        );
        // By the pod's UID, with the pod's one container.
        assert_eq!(
            names.name(&id('b'), Some(UID)),
            Some(name("prod", "shop-7d9f", Some("web")))
        );
        // With two containers, the pod only.
        write(&pod_dir.join("sidecar/0.log"), "");
        let mut names = KubernetesNames::new(root);
        assert_eq!(
            names.name(&id('b'), Some(UID)),
            Some(name("prod", "shop-7d9f", None))
        );
        assert_eq!(names.name(&id('c'), Some("0000")), None);
    }

    #[test]
    fn a_container_found_later_is_named_at_the_next_window() {
        let node = tempfile::tempdir().unwrap();
        let root = node.path();
        let mut names = KubernetesNames::new(root);
        assert_eq!(names.name(&id('a'), None), None);
        let state = runtime_state(root, 0, &id('a'));
        write(
            &state,
            r#"{"annotations":{"io.kubernetes.cri.sandbox-name":"p",
                "io.kubernetes.cri.sandbox-namespace":"n"}}"#,
        );
        assert_eq!(names.name(&id('a'), None), None, "missed this window");
        names.start_window();
        assert_eq!(names.name(&id('a'), None), Some(name("n", "p", None)));
        // Once known, a name stays (the records go when the container does).
        fs::remove_file(&state).unwrap();
        names.start_window();
        assert_eq!(names.name(&id('a'), None), Some(name("n", "p", None)));
    }

    #[test]
    fn records_that_are_not_names_are_not_used() {
        let node = tempfile::tempdir().unwrap();
        let root = node.path();
        let state = |digit| runtime_state(root, 0, &id(digit));
        // A label value that is no Kubernetes name, a file that is not JSON, a FIFO, a link.
        write(
            &state('a'),
            r#"{"annotations":{"io.kubernetes.cri.sandbox-name":"p\nservice_name=evil",
                "io.kubernetes.cri.sandbox-namespace":"n"}}"#,
        );
        write(&state('b'), "not json");
        fs::create_dir_all(state('c').parent().unwrap()).unwrap();
        let fifo =
            std::ffi::CString::new(state('c').into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        write(
            &root.join("elsewhere.json"),
            r#"{"annotations":{"io.kubernetes.cri.sandbox-name":"p",
                "io.kubernetes.cri.sandbox-namespace":"n"}}"#,
        );
        fs::create_dir_all(state('d').parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(root.join("elsewhere.json"), state('d')).unwrap();
        // Log links whose names do not split into three names.
        fs::create_dir_all(root.join(LOG_LINKS)).unwrap();
        for link in [
            format!("a_b_c_d-{}.log", id('e')),
            format!("a_b-{}.log", id('f')),
        ] {
            write(&root.join(LOG_LINKS).join(link), "");
        }
        let mut names = KubernetesNames::new(root);
        for digit in ['a', 'b', 'c', 'd', 'e', 'f'] {
            assert_eq!(names.name(&id(digit), None), None, "container {digit}");
        }
        assert_eq!(names.name("../../etc", None), None);
    }
}
