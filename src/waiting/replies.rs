//! What a blocked waiter is answered, and what happens when it leaves: the blocked-client
//! callbacks of every `... WAIT` command.

use redis_module::Context;

use super::schedule::{arm, defer, Undo};
use super::state::{bump, with_queues, Outcome, Waiting, STATS};
use crate::error::LockError;
use crate::queue::End;
use crate::raw::{self, BlockHandler, Blocked};
use crate::rules::Reply;
use crate::store::{self, waiters};

impl BlockHandler for Waiting {
    type Outcome = Outcome;

    fn reply(ctx: &Context, outcome: Option<&Outcome>) {
        if let Some(Outcome::Granted { lock, request, .. }) = outcome {
            let id = request.id.as_deref();
            if id.is_some_and(|id| store::request::says_cancelled(ctx, &lock.key, id)) {
                // Cancelled between its grant and this reply (the cancel gave the grant back):
                // answered as a wait that timed out, never told it holds. The context is the
                // waiter's own client, whose database is the lock's.
                let reply = waiters::not_granted(ctx, &lock.key, request);
                ctx.reply(reply.map(store::to_value).map_err(Into::into));
                return;
            }
        }
        let reply = match outcome {
            Some(Outcome::Granted { ids, .. }) if !ids.is_empty() => {
                ctx.reply(Ok(store::ids_value(ids)));
                return;
            }
            Some(Outcome::Granted { reply, .. } | Outcome::TimedOut(reply)) => Ok(*reply),
            Some(Outcome::Opened) => Ok(Reply::Int(1)),
            Some(Outcome::Failed(e)) => Err((*e).into()),
            Some(Outcome::Redirect(e)) => Err(redis_module::RedisError::String(e.clone())),
            None => Err(LockError::Internal.into()),
        };
        ctx.reply(reply.map(store::to_value));
    }

    fn unblocked_by_command(ctx: &Context, bc: Blocked) {
        let now = raw::now_ms();
        let Some(waiter) =
            with_queues(|q| q.find(bc).and_then(|id| q.remove_as(id, End::Left, Some(now))))
        else {
            // Not ours to answer (already granted or timed out: its reply is on its way).
            return;
        };
        bump(&STATS.left);
        arm(ctx);
        // The context is the waiter's own client, whose database is the lock's.
        let reply = waiters::not_granted(ctx, &waiter.lock.key, &waiter.request);
        ctx.reply(reply.map(store::to_value).map_err(Into::into));
        // Redis unblocks the client itself after this callback; this frees our handle.
        raw::unblock_client::<Self>(bc, None);
    }

    fn client_gone(ctx: &Context, bc: Blocked, outcome: Option<&Outcome>) {
        let now = raw::now_ms();
        if with_queues(|q| q.find(bc).and_then(|id| q.remove_as(id, End::Left, Some(now))))
            .is_some()
        {
            bump(&STATS.left);
            raw::unblock_client::<Self>(bc, None);
            arm(ctx);
            return;
        }
        // Granted, but gone before its reply: the hold must not stay with a client that is gone.
        if let Some(Outcome::Granted { lock, request, ids, stamp, .. }) = outcome {
            bump(&STATS.rollbacks);
            let undo = Undo {
                lock: lock.clone(),
                request: request.clone(),
                ids: ids.clone(),
                stamp: *stamp,
            };
            defer(ctx, |d| d.rollback.push(undo));
        }
    }
}
