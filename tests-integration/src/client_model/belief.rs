//! What a caller may believe: each guard it holds, the hold's place on the servers, and what
//! the guard says of it (held or lost, valid until when).

use rlock_client::{Error, LockGuard, MultiGuard, PermitGuard};
use tokio::time::Instant;

/// A guard of any kind.
pub enum Held {
    Lock(LockGuard),
    Permit(PermitGuard),
    Multi(MultiGuard),
}

impl Held {
    /// What the guard says: lost.
    #[must_use]
    pub fn is_lost(&self) -> bool {
        match self {
            Self::Lock(g) => g.is_lost(),
            Self::Permit(g) => g.is_lost(),
            Self::Multi(g) => g.is_lost(),
        }
    }

    /// Until when the guard says its hold is valid (`None` for a [`MultiGuard`], which does
    /// not say, and for a lost guard).
    #[must_use]
    pub fn valid_until(&self) -> Option<Instant> {
        match self {
            Self::Lock(g) => g.valid_until(),
            Self::Permit(g) => g.valid_until(),
            Self::Multi(_) => None,
        }
    }

    /// The owner id the server stores a lock guard's hold under ("" for other guards).
    #[must_use]
    pub fn owner(&self) -> String {
        match self {
            Self::Lock(g) => g.owner().to_owned(),
            _ => String::new(),
        }
    }

    /// A permit guard's permit ids (empty for other guards).
    #[must_use]
    pub fn ids(&self) -> Vec<Vec<u8>> {
        match self {
            Self::Permit(g) => g.ids().to_vec(),
            _ => Vec::new(),
        }
    }

    /// Releases it.
    ///
    /// # Errors
    /// The guard's own release error.
    pub async fn release(self) -> Result<(), Error> {
        match self {
            Self::Lock(g) => g.release().await,
            Self::Permit(g) => g.release().await,
            Self::Multi(g) => g.release().await,
        }
    }
}

/// Where a guard's hold is: a server (its index in the run) and a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A reentrant lock.
    Lock { server: usize, key: String },
    /// A read-write lock's read side.
    Read { server: usize, key: String },
    /// A read-write lock's write side.
    Write { server: usize, key: String },
    /// Leased permits.
    Permits { server: usize, key: String },
    /// A [`MultiGuard`]: one lock per part, held on at least `quorum` of them (all for a
    /// MultiLock, a majority for a RedLock).
    Multi { parts: Vec<(usize, String)>, quorum: usize },
}

impl Target {
    /// The `server/key` names it touches (for the transcript's excerpts).
    #[must_use]
    pub fn keys(&self) -> Vec<String> {
        match self {
            Self::Lock { server, key }
            | Self::Read { server, key }
            | Self::Write { server, key }
            | Self::Permits { server, key } => vec![format!("{server}/{key}")],
            Self::Multi { parts, .. } => parts.iter().map(|(s, k)| format!("{s}/{k}")).collect(),
        }
    }
}

/// One guard the caller holds, as the model knows it.
pub struct Belief {
    /// Its number in the run (`g<id>` in the transcript).
    pub id: usize,
    pub target: Target,
    pub held: Held,
    /// [`Held::owner`] at the grant.
    pub owner: String,
    /// [`Held::ids`] at the grant.
    pub ids: Vec<Vec<u8>>,
    /// Taken through a session: its hold ends when the session's connection closes, which
    /// the client learns a moment later.
    pub session: bool,
    /// When the run first saw it lost.
    pub lost_seen: Option<Instant>,
    /// A violation was reported on it (keep-going runs check it no more).
    pub flagged: bool,
}

impl Belief {
    /// Who it is for mutual exclusion: the owner id of a lock guard, the guard itself for a
    /// [`MultiGuard`].
    #[must_use]
    pub fn identity(&self) -> String {
        match self.target {
            Target::Multi { .. } => format!("multi g{}", self.id),
            _ => self.owner.clone(),
        }
    }

    /// What it claims now: `None` when it says it is lost (or its deadline has passed).
    #[must_use]
    pub fn claim(&self, now: Instant) -> Option<Claim> {
        if self.flagged || self.held.is_lost() {
            return None;
        }
        let until = self.held.valid_until();
        if matches!(self.target, Target::Multi { .. }) {
            return Some(self.claim_until(None));
        }
        let until = until.filter(|u| *u > now)?;
        Some(self.claim_until(Some(until)))
    }

    fn claim_until(&self, until: Option<Instant>) -> Claim {
        Claim {
            belief: self.id,
            target: self.target.clone(),
            identity: self.identity(),
            owner: self.owner.clone(),
            ids: self.ids.clone(),
            until,
            session: self.session,
        }
    }
}

/// What one guard claims at one moment: held, by `owner` (or `ids`), until `until`.
#[derive(Debug, Clone)]
pub struct Claim {
    pub belief: usize,
    pub target: Target,
    pub identity: String,
    pub owner: String,
    pub ids: Vec<Vec<u8>>,
    /// `None`: held, no deadline said ([`MultiGuard`]).
    pub until: Option<Instant>,
    pub session: bool,
}
