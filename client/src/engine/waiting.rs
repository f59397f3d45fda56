//! The server-side wait of a request (`... WAIT ms REQUEST id`), run by a task of its own on a
//! dedicated connection to the node that serves the key, following the key's slot when it
//! moves (MOVED/ASK), then acknowledged by the replicas on that same connection. When the
//! caller goes away the task just ends, closing its connection: the request's cancellation
//! (`RLOCK.CANCEL`, sent by the caller's side) settles whatever the server did.

use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, RedisError, Value};
use tokio::sync::oneshot;

use crate::engine::kind::{Answer, Kind};
use crate::engine::outcome::{acknowledged, Ended};
use crate::error::redis_uncertain;
use crate::error::Error;
use crate::shared::Shared;

/// How many MOVED/ASK redirections one wait follows.
pub(crate) const MAX_REDIRECTS: usize = 5;

/// The node a MOVED or ASK error points to, and whether it was ASK.
pub(crate) fn redirection(e: &RedisError) -> Option<((String, u16), bool)> {
    let (address, _slot) = e.redirect_node()?;
    let (host, port) = address.rsplit_once(':')?;
    let ask = matches!(e.kind(), redis::ErrorKind::Server(redis::ServerErrorKind::Ask));
    Some(((host.to_owned(), port.parse().ok()?), ask))
}

/// Runs the wait `cmd` of a `kind` request on `key` and sends how it ended on `reply`, unless
/// the caller goes away first (then it stops, and drops its connection).
pub(crate) async fn wait(
    shared: Arc<Shared>,
    key: Arc<[u8]>,
    kind: Kind,
    cmd: Cmd,
    response_timeout: Option<Duration>,
    mut reply: oneshot::Sender<Ended>,
) {
    let ended = tokio::select! {
        ended = on_nodes(&shared, &key, kind, &cmd, response_timeout) => ended,
        () = reply.closed() => return,
    };
    let _ = reply.send(ended);
}

/// The wait on the node serving `key`, then on the nodes it is redirected to.
async fn on_nodes(
    shared: &Shared,
    key: &[u8],
    kind: Kind,
    cmd: &Cmd,
    response_timeout: Option<Duration>,
) -> Ended {
    // Nothing was sent until the wait's command is: errors before it refuse the request.
    let mut node = match shared.target.node_for(key, &mut shared.conn.clone()).await {
        Ok(node) => node,
        Err(e) => return Ended::Refused(e),
    };
    let mut asking = false;
    for _ in 0..=MAX_REDIRECTS {
        let mut con = match crate::conn::dedicated(&node, response_timeout).await {
            Ok(con) => con,
            Err(e) => return Ended::Refused(e),
        };
        if asking {
            if let Err(e) = redis::cmd("ASKING").query_async::<()>(&mut con).await {
                return Ended::Refused(e.into());
            }
        }
        let answer = match cmd.query_async::<Value>(&mut con).await {
            Ok(answer) => answer,
            Err(e) => match redirection(&e) {
                // The key's slot moved (cluster): wait on the node that has it now.
                Some(((host, port), ask)) => match shared.target.client_at(Some((&host, port))) {
                    Ok(next) => {
                        (node, asking) = (next, ask);
                        continue;
                    }
                    Err(e) => return Ended::Refused(e),
                },
                // No answer in time (the server stalls): a passed deadline, as the caller's.
                None if e.is_timeout() => return Ended::Unknown(Error::TimedOut),
                None if redis_uncertain(&e) => return Ended::Unknown(e.into()),
                // An error reply: the module changed nothing.
                None => return Ended::Refused(e.into()),
            },
        };
        return match kind.answer(&answer) {
            // Redis's WAIT counts the writes of the connection that asked.
            Ok(Answer::Granted(grant)) => match acknowledged(&shared.options, &mut con).await {
                Ok(()) => Ended::Answer(Answer::Granted(grant)),
                Err(e) => Ended::Unacked(e),
            },
            Ok(Answer::Busy) => Ended::Answer(Answer::Busy),
            Err(e) => Ended::Unknown(e),
        };
    }
    Ended::Refused(Error::Redis(RedisError::from((
        redis::ErrorKind::Server(redis::ServerErrorKind::Moved),
        "the key's slot kept moving",
    ))))
}
