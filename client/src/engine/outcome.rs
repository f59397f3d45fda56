//! How one command of an acquire request ended ([`Ended`]), and the replica / AOF
//! acknowledgement a grant needs before it counts ([`acknowledged`]): shared by the request
//! (its try on the shared connection) and its server-side wait.

use crate::engine::kind::Answer;
use crate::error::{Error, Result};
use crate::options::Options;

/// How one command of a request ended, for the request to settle.
#[derive(Debug)]
pub(crate) enum Ended {
    /// The server answered.
    Answer(Answer),
    /// Refused before anything was granted, and nothing is in flight (a server error: the
    /// module changes nothing on an error; or the command was never sent).
    Refused(Error),
    /// Unknown: the command may have run, or may still run (a lost reply, a stall).
    Unknown(Error),
    /// Granted, but the replica (or AOF) acknowledgement failed.
    Unacked(Error),
}

/// With [`Options::replica_ack`]: waits for the replicas to acknowledge the writes of `con`
/// (the grant just made); then [`Options::aof_ack`]'s `WAITAOF`.
///
/// # Errors
/// [`Error::NotReplicated`], [`Error::NotPersisted`], or the server's error.
pub(crate) async fn acknowledged<C>(options: &Options, con: &mut C) -> Result<()>
where
    C: redis::aio::ConnectionLike + Send,
{
    if let Some((wanted, timeout)) = options.replica_ack {
        let timeout = crate::engine::millis(timeout);
        let acknowledged: u32 =
            redis::cmd("WAIT").arg(wanted).arg(timeout).query_async(con).await?;
        if acknowledged < wanted {
            return Err(Error::NotReplicated { wanted, acknowledged });
        }
    }
    if let Some(aof) = options.aof_ack {
        let (local, replicas): (u32, u32) = redis::cmd("WAITAOF")
            .arg(u32::from(aof.local))
            .arg(aof.replicas)
            .arg(crate::engine::millis(aof.timeout))
            .query_async(con)
            .await?;
        if (aof.local && local == 0) || replicas < aof.replicas {
            return Err(Error::NotPersisted {
                local: (aof.local, local > 0),
                replicas: (aof.replicas, replicas),
            });
        }
    }
    Ok(())
}
