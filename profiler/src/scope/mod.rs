//! Which processes a recording covers beyond plain pids: a cgroup v2 subtree (`--cgroup`), a
//! container (`--container`, resolved to its cgroup), a user (`--uid`); and the reverse, which
//! container or systemd unit a sampled process belongs to, for per-container breakdowns, and
//! the Kubernetes pod and names of a container.

pub mod cgroup;
pub mod container;
pub mod kubernetes;

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Where users are named.
pub const PASSWD_PATH: &str = "/etc/passwd";

/// Why a scope option could not be resolved.
#[derive(Debug)]
pub enum ScopeError {
    /// No cgroup v2 hierarchy is mounted.
    NoCgroup2Mount,
    /// `--cgroup` named nothing inside the cgroup v2 hierarchy.
    NoSuchCgroup {
        arg: PathBuf,
        mount: PathBuf,
    },
    /// `--container` is not a plausible container id prefix.
    BadContainerId {
        query: String,
    },
    NoContainer {
        query: String,
        root: PathBuf,
    },
    AmbiguousContainer {
        query: String,
        ids: Vec<String>,
    },
    UnknownUser {
        name: String,
    },
    /// `(uid_t)-1`: the kernel's "no user", which no process runs as.
    InvalidUid,
    Io {
        path: PathBuf,
        source: io::Error,
    },
}

impl fmt::Display for ScopeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScopeError::NoCgroup2Mount => write!(
                f,
                "no cgroup v2 filesystem is mounted (none in /proc/self/mountinfo): mount one \
                 with `mount -t cgroup2 none /sys/fs/cgroup/unified`; cgroup and container \
                 scopes need cgroup v2 ids"
            ),
            ScopeError::NoSuchCgroup { arg, mount } => write!(
                f,
                "no cgroup v2 directory '{}': give a path under {} or a path as shown after \
                 `0::` in /proc/PID/cgroup",
                arg.display(),
                mount.display()
            ),
            ScopeError::BadContainerId { query } => write!(
                f,
                "'{query}' is not a container id: give at least 4 hexadecimal digits of the id \
                 (docker ps, podman ps or crictl ps show ids)"
            ),
            ScopeError::NoContainer { query, root } => write!(
                f,
                "no container matching '{query}' under {} (is it running? docker ps shows ids)",
                root.display()
            ),
            ScopeError::AmbiguousContainer { query, ids } => write!(
                f,
                "'{query}' matches {} containers ({}): give more digits of the id",
                ids.len(),
                ids.join(", ")
            ),
            ScopeError::UnknownUser { name } => write!(
                f,
                "no user '{name}' in {PASSWD_PATH}: give a user name from it or a numeric uid"
            ),
            ScopeError::InvalidUid => write!(
                f,
                "--uid {}: that is (uid_t)-1, which means \"no user\" to the kernel; no process \
                 runs as it. Give a user name or a uid below {}",
                u32::MAX,
                u32::MAX
            ),
            ScopeError::Io { path, source } => {
                write!(f, "cannot read {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for ScopeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ScopeError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The uid of `--uid USER`: a number as is (it need not be in /etc/passwd: containers have
/// their own users), else a name looked up in /etc/passwd.
pub fn resolve_uid(user: &str) -> Result<u32, ScopeError> {
    if let Ok(uid) = user.parse::<u32>() {
        return if uid == u32::MAX {
            Err(ScopeError::InvalidUid)
        } else {
            Ok(uid)
        };
    }
    let passwd = std::fs::read_to_string(PASSWD_PATH).map_err(|source| ScopeError::Io {
        path: PASSWD_PATH.into(),
        source,
    })?;
    uid_in_passwd(&passwd, user).ok_or_else(|| ScopeError::UnknownUser {
        name: user.to_string(),
    })
}

/// The uid of `name` in passwd(5) text (`name:password:uid:gid:gecos:home:shell`).
pub fn uid_in_passwd(passwd: &str, name: &str) -> Option<u32> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        if fields.next()? != name {
            return None;
        }
        fields.nth(1)?.trim().parse().ok()
    })
}

/// A fresh directory standing in for a cgroup tree in tests.
#[cfg(test)]
fn temp_tree(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("profiler-scope-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "\
root:x:0:0:root:/root:/bin/bash
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
# local accounts
alice:x:1000:1000:Alice,,,:/home/alice:/bin/bash
systemd-network:x:998:998:systemd Network Management:/:/usr/sbin/nologin
broken:x:notanumber:0::/:/bin/sh
";

    #[test]
    fn finds_users_by_name_in_passwd() {
        assert_eq!(uid_in_passwd(PASSWD, "root"), Some(0));
        assert_eq!(uid_in_passwd(PASSWD, "alice"), Some(1000));
        assert_eq!(uid_in_passwd(PASSWD, "systemd-network"), Some(998));
        assert_eq!(uid_in_passwd(PASSWD, "ali"), None);
        assert_eq!(uid_in_passwd(PASSWD, "broken"), None);
        assert_eq!(uid_in_passwd(PASSWD, "# local accounts"), None);
    }

    #[test]
    fn resolves_numbers_and_names_on_this_machine() {
        assert_eq!(resolve_uid("4242").unwrap(), 4242);
        let err = resolve_uid("4294967295").unwrap_err().to_string();
        assert!(
            err.contains("--uid 4294967295") && err.contains("no user"),
            "{err}"
        );
        assert_eq!(resolve_uid("root").unwrap(), 0);
        let err = resolve_uid("no-such-user-here").unwrap_err();
        assert!(
            err.to_string()
                .contains("no user 'no-such-user-here' in /etc/passwd"),
            "{err}"
        );
    }
}
