//! Who may use the admin socket: root, the daemon's own uid, and members of the
//! configured admin group. Credentials come from the kernel (`SO_PEERCRED`), never
//! from the client, so they cannot be forged by what the client sends.

use std::ffi::CString;

use nix::unistd::{Gid, Uid, User, getgrouplist};

/// The credentials of a connected admin client, read with `SO_PEERCRED` when it
/// connected. Passed to the handler so it can record who acted (e.g. "redriven by
/// uid 1000").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Effective user id of the client process.
    pub uid: u32,
    /// Effective group id of the client process.
    pub gid: u32,
    /// Process id, when the platform reports it.
    pub pid: Option<i32>,
}

/// The access rule, pure. `peer_groups` are the peer user's supplementary groups
/// (may be empty when not looked up). Allowed: uid 0, the daemon's uid, or, when an
/// admin group is configured, a peer whose gid or a supplementary group is it.
pub fn allowed(
    peer_uid: u32,
    peer_gid: u32,
    peer_groups: &[u32],
    daemon_uid: u32,
    admin_gid: Option<u32>,
) -> bool {
    if peer_uid == 0 || peer_uid == daemon_uid {
        return true;
    }
    admin_gid.is_some_and(|g| peer_gid == g || peer_groups.contains(&g))
}

/// Applies [`allowed`] to a peer, looking up its supplementary groups (through NSS,
/// which may block, so the caller runs this on a blocking thread) only when the
/// cheap checks fail and an admin group is configured.
pub fn check_peer(peer: &Peer, daemon_uid: u32, admin_gid: Option<u32>) -> bool {
    if allowed(peer.uid, peer.gid, &[], daemon_uid, admin_gid) {
        return true;
    }
    if admin_gid.is_none() {
        return false;
    }
    let groups = supplementary_groups(peer.uid, peer.gid);
    allowed(peer.uid, peer.gid, &groups, daemon_uid, admin_gid)
}

/// The groups of the user `uid` (per the group database), or none when the user or
/// its groups cannot be resolved.
fn supplementary_groups(uid: u32, gid: u32) -> Vec<u32> {
    let Ok(Some(user)) = User::from_uid(Uid::from_raw(uid)) else {
        return Vec::new();
    };
    let Ok(name) = CString::new(user.name) else {
        return Vec::new();
    };
    getgrouplist(&name, Gid::from_raw(gid))
        .map(|gs| gs.into_iter().map(Gid::as_raw).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAEMON: u32 = 990;
    const ADMINS: u32 = 4242;

    #[test]
    fn root_is_always_allowed() {
        assert!(allowed(0, 0, &[], DAEMON, None));
    }

    #[test]
    fn the_daemons_own_uid_is_allowed() {
        assert!(allowed(DAEMON, 100, &[], DAEMON, None));
    }

    #[test]
    fn a_member_of_the_admin_group_is_allowed_by_primary_or_supplementary_group() {
        assert!(allowed(1000, ADMINS, &[], DAEMON, Some(ADMINS)));
        assert!(allowed(1000, 100, &[27, ADMINS], DAEMON, Some(ADMINS)));
    }

    #[test]
    fn anyone_else_is_refused() {
        assert!(!allowed(1000, 100, &[27], DAEMON, Some(ADMINS)));
        assert!(!allowed(1000, 100, &[ADMINS], DAEMON, None));
    }

    #[test]
    fn check_peer_allows_the_current_user_as_daemon_uid() {
        let me = Uid::current().as_raw();
        let peer = Peer {
            uid: me,
            gid: 1,
            pid: None,
        };
        assert!(check_peer(&peer, me, None));
    }

    #[test]
    fn check_peer_refuses_an_unknown_uid_outside_the_group() {
        let peer = Peer {
            uid: 3_999_999,
            gid: 3_999_999,
            pid: None,
        };
        assert!(!check_peer(&peer, DAEMON, Some(ADMINS)));
    }
}
