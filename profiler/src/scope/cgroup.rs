//! The cgroup v2 hierarchy as the capture program sees it: where it is mounted, the id of a
//! cgroup directory (what `bpf_get_current_cgroup_id()` returns for its processes), the cgroups
//! below one, and which cgroups a process belongs to (/proc/PID/cgroup).

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::ScopeError;

const MOUNTINFO_PATH: &str = "/proc/self/mountinfo";

/// The cgroup v2 id of a cgroup directory: its inode number in the cgroup2 filesystem.
pub fn cgroup_id(path: &Path) -> io::Result<u64> {
    Ok(fs::metadata(path)?.ino())
}

/// The directory and every cgroup below it, parent before children. A container's processes
/// can live in sub-cgroups, so a scope covers the whole subtree.
pub fn cgroup_subtree(path: &Path) -> io::Result<Vec<PathBuf>> {
    let mut dirs = vec![path.to_path_buf()];
    let mut next = 0;
    while let Some(dir) = dirs.get(next).cloned() {
        next += 1;
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            // Cgroups come and go while we walk: a vanished one has no processes to cover.
            Err(err) if err.kind() == io::ErrorKind::NotFound && dir != path => continue,
            Err(err) => return Err(err),
        };
        for entry in entries {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                dirs.push(entry.path());
            }
        }
    }
    Ok(dirs)
}

/// The cgroup ids of `path` and every cgroup below it, `path`'s first.
pub fn cgroup_subtree_ids(path: &Path) -> io::Result<Vec<u64>> {
    let mut ids = Vec::new();
    for dir in cgroup_subtree(path)? {
        match cgroup_id(&dir) {
            Ok(id) => ids.push(id),
            Err(err) if err.kind() == io::ErrorKind::NotFound && dir != path => {}
            Err(err) => return Err(err),
        }
    }
    Ok(ids)
}

/// Where this machine mounts the cgroup v2 hierarchy (/sys/fs/cgroup, or
/// /sys/fs/cgroup/unified on hybrid v1/v2 systems).
pub fn cgroup2_mount() -> Result<PathBuf, ScopeError> {
    let mountinfo = fs::read_to_string(MOUNTINFO_PATH).map_err(|source| ScopeError::Io {
        path: MOUNTINFO_PATH.into(),
        source,
    })?;
    cgroup2_mount_in(&mountinfo).ok_or(ScopeError::NoCgroup2Mount)
}

/// The mount point of the first cgroup2 filesystem in proc_pid_mountinfo(5) text:
/// `ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS`.
pub fn cgroup2_mount_in(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (mount, filesystem) = line.split_once(" - ")?;
        if filesystem.split(' ').next()? != "cgroup2" {
            return None;
        }
        mount
            .split(' ')
            .nth(4)
            .map(|point| PathBuf::from(unescape_mount_field(point)))
    })
}

/// Mountinfo writes space, tab, newline and backslash in paths as 3-digit octal escapes.
fn unescape_mount_field(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let escaped = rest
            .get(at + 1..at + 4)
            .and_then(|digits| u8::from_str_radix(digits, 8).ok())
            .filter(u8::is_ascii);
        match escaped {
            Some(byte) => {
                out.push(char::from(byte));
                rest = &rest[at + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The cgroup directory named by `--cgroup PATH`: a path under the cgroup2 mount, or a cgroup
/// path as /proc/PID/cgroup shows it (relative to the mount, with or without a leading `/`).
pub fn resolve_cgroup_dir(arg: &Path, mount: &Path) -> Result<PathBuf, ScopeError> {
    let candidate = if arg.starts_with(mount) {
        arg.to_path_buf()
    } else {
        mount.join(arg.strip_prefix("/").unwrap_or(arg))
    };
    let not_found = || ScopeError::NoSuchCgroup {
        arg: arg.into(),
        mount: mount.into(),
    };
    let io_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source: io::Error| match source.kind() {
            io::ErrorKind::NotFound => not_found(),
            _ => ScopeError::Io { path, source },
        }
    };
    let dir = candidate.canonicalize().map_err(io_error(&candidate))?;
    let mount = mount.canonicalize().map_err(io_error(mount))?;
    // `..` must not lead out of the hierarchy: only v2 cgroups have the ids the filter uses.
    if dir.starts_with(&mount) && dir.is_dir() {
        Ok(dir)
    } else {
        Err(not_found())
    }
}

/// One line of /proc/PID/cgroup: `HIERARCHY:CONTROLLERS:PATH`; hierarchy 0 with no
/// controllers is the cgroup v2 line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcCgroup {
    pub hierarchy: u32,
    /// Comma-separated v1 controllers (`cpu,cpuacct`, `name=systemd`); empty for v2.
    pub controllers: String,
    pub path: String,
}

impl ProcCgroup {
    pub fn is_v2(&self) -> bool {
        self.hierarchy == 0 && self.controllers.is_empty()
    }
}

/// Parses the text of /proc/PID/cgroup (see cgroups(7)); malformed lines are skipped.
pub fn parse_proc_cgroup(text: &str) -> Vec<ProcCgroup> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            Some(ProcCgroup {
                hierarchy: fields.next()?.parse().ok()?,
                controllers: fields.next()?.to_string(),
                path: fields.next()?.to_string(),
            })
        })
        .collect()
}

/// The cgroups of a running process.
pub fn process_cgroups(pid: u32) -> io::Result<Vec<ProcCgroup>> {
    Ok(parse_proc_cgroup(&fs::read_to_string(format!(
        "/proc/{pid}/cgroup"
    ))?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scope::temp_tree;

    #[test]
    fn finds_the_cgroup2_mount_on_hybrid_and_unified_systems() {
        let hybrid = "\
25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 25 0:27 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
32 31 0:28 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
33 31 0:29 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
";
        assert_eq!(
            cgroup2_mount_in(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let unified = "\
35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";
        assert_eq!(
            cgroup2_mount_in(unified),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        let escaped = "40 1 0:50 / /mnt/my\\040cgroups rw - cgroup2 none rw\n";
        assert_eq!(
            cgroup2_mount_in(escaped),
            Some(PathBuf::from("/mnt/my cgroups"))
        );
        let v1_only = "33 31 0:29 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        assert_eq!(cgroup2_mount_in(v1_only), None);
    }

    #[test]
    fn unescapes_only_valid_octal_escapes() {
        assert_eq!(unescape_mount_field("a\\011b\\134c"), "a\tb\\c");
        assert_eq!(unescape_mount_field("trailing\\"), "trailing\\");
        assert_eq!(unescape_mount_field("\\9xy"), "\\9xy");
    }

    #[test]
    fn parses_v1_and_v2_lines_of_proc_pid_cgroup() {
        let text = "\
12:memory:/docker/3f1c2a9b8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b
4:cpu,cpuacct:/system.slice/docker.service
1:name=systemd:/user.slice/user-1000.slice/session-2.scope
0::/user.slice/user-1000.slice/session-2.scope
not a cgroup line
";
        let cgroups = parse_proc_cgroup(text);
        assert_eq!(cgroups.len(), 4);
        assert_eq!(cgroups[1].hierarchy, 4);
        assert_eq!(cgroups[1].controllers, "cpu,cpuacct");
        assert_eq!(cgroups[1].path, "/system.slice/docker.service");
        assert!(!cgroups[2].is_v2());
        assert!(cgroups[3].is_v2());
        assert_eq!(
            cgroups[3].path,
            "/user.slice/user-1000.slice/session-2.scope"
        );
    }

    #[test]
    fn resolves_cgroup_arguments_inside_the_mount_only() {
        let mount = temp_tree("resolve");
        fs::create_dir_all(mount.join("system.slice/nginx.service")).unwrap();
        let service = mount
            .join("system.slice/nginx.service")
            .canonicalize()
            .unwrap();
        for arg in [
            service.clone(),
            PathBuf::from("/system.slice/nginx.service"),
            PathBuf::from("system.slice/nginx.service"),
        ] {
            assert_eq!(
                resolve_cgroup_dir(&arg, &mount).unwrap(),
                service,
                "{}",
                arg.display()
            );
        }
        for arg in ["/system.slice/missing.service", "system.slice/../.."] {
            let err = resolve_cgroup_dir(Path::new(arg), &mount).unwrap_err();
            assert!(
                matches!(err, ScopeError::NoSuchCgroup { .. }),
                "{arg}: {err}"
            );
            assert!(
                err.to_string()
                    .contains(&format!("no cgroup v2 directory '{arg}'")),
                "{err}"
            );
        }
        fs::remove_dir_all(mount).unwrap();
    }

    #[test]
    fn lists_a_subtree_parent_first() {
        let root = temp_tree("subtree");
        fs::create_dir_all(root.join("a/b")).unwrap();
        fs::create_dir_all(root.join("c")).unwrap();
        fs::write(root.join("a/cgroup.procs"), "").unwrap();
        let dirs = cgroup_subtree(&root).unwrap();
        assert_eq!(dirs[0], root);
        let mut rest: Vec<_> = dirs[1..]
            .iter()
            .map(|d| d.strip_prefix(&root).unwrap())
            .collect();
        rest.sort();
        assert_eq!(rest, [Path::new("a"), Path::new("a/b"), Path::new("c")]);
        let ids = cgroup_subtree_ids(&root).unwrap();
        let inodes: Vec<u64> = dirs
            .iter()
            .map(|d| fs::metadata(d).unwrap().ino())
            .collect();
        assert_eq!(ids, inodes);
        assert!(cgroup_subtree_ids(&root.join("missing")).is_err());
        fs::remove_dir_all(root).unwrap();
    }
}
