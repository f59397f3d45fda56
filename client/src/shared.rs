//! [`Shared`]: what every handle of one client holds: where the server is, the shared
//! connection, the background releaser and the settings. Above the connection and the releaser,
//! below everything that takes locks.

use crate::conn::{Conn, Target};
use crate::options::Options;
use crate::releaser::Releaser;

/// What every handle of one [`crate::LockClient`] shares: where the server is, the shared
/// connection, the client's id (the prefix of its owner ids) and settings.
pub(crate) struct Shared {
    pub(crate) target: Target,
    pub(crate) conn: Conn,
    pub(crate) id: String,
    pub(crate) next_handle: std::sync::atomic::AtomicU64,
    pub(crate) options: Options,
    /// Runs releases and cancellations in the background (drops, abandoned acquires).
    pub(crate) releaser: Releaser,
}
