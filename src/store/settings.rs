//! Server settings the store's writes depend on, kept here so that no write reads the server's
//! configuration: read at load and again whenever `CONFIG SET` (or `CONFIG RESETSTAT`, a
//! `CONFIG REWRITE`'s reload) changes a setting (`events`).
//!
//! - `hash-max-listpack-value`: a lock write is replicated as one `RESTORE` of a listpack hash
//!   only while its fields fit it: a module-less replica (or an AOF replay) then builds the same
//!   encoding the master has (Redis converts an `HSET` listpack past the limit, but keeps a
//!   `RESTORE`d one as sent).
//! - `cluster-node-timeout`: in a cluster, a stall of half of it starts the replica guard's
//!   quarantine (`replicas::stall_ms`).
//! - `hz`: the cron's period, below which no gap between two replica checks is a stall
//!   (`replicas::stall_ms`).
//! - `maxmemory-policy`: once an `allkeys-*` policy has been in force, a token counter (a key
//!   with no TTL) may have been evicted, so tokens also exceed every token this server granted
//!   (`replicas::counters_evictable`).

use std::sync::atomic::{AtomicUsize, Ordering};

use redis_module::{CallOptionsBuilder, CallReply, CallResult, Context};

use crate::raw;
use crate::replicas;

/// `hash-max-listpack-value` as last read (Redis's default until then).
static LISTPACK_VALUE_MAX: AtomicUsize = AtomicUsize::new(64);

/// The longest field or value the server keeps in a listpack hash.
pub fn listpack_value_max() -> usize {
    LISTPACK_VALUE_MAX.load(Ordering::Relaxed)
}

/// One setting's value, as `CONFIG GET` gives it.
fn config(ctx: &Context, name: &str) -> Option<Vec<u8>> {
    let reply: CallResult =
        ctx.call_ext("CONFIG", &CallOptionsBuilder::new().build(), &["GET", name]);
    match reply {
        Ok(CallReply::Array(items)) => match items.get(1) {
            Some(Ok(CallReply::String(value))) => Some(value.as_bytes().to_vec()),
            _ => None,
        },
        _ => None,
    }
}

/// Reads the settings again (at load, and after a change of any of `changed`: `None` for all).
pub fn refresh(ctx: &Context, changed: Option<&[&str]>) {
    let wanted = |name: &str| changed.is_none_or(|names| names.iter().any(|n| n.contains(name)));
    if wanted("hash-max") {
        let value = config(ctx, "hash-max-listpack-value")
            .and_then(|v| std::str::from_utf8(&v).ok().and_then(|v| v.parse().ok()));
        // Unreadable: the smallest limit, so a RESTORE is never sent where HSET would differ.
        LISTPACK_VALUE_MAX.store(value.unwrap_or(0), Ordering::Relaxed);
    }
    if wanted("cluster-node-timeout") {
        let timeout = raw::in_cluster(ctx)
            .then(|| config(ctx, "cluster-node-timeout"))
            .flatten()
            .and_then(|v| std::str::from_utf8(&v).ok().and_then(|v| v.parse().ok()));
        replicas::set_cluster_node_timeout(timeout);
    }
    if wanted("hz") {
        let hz = config(ctx, "hz")
            .and_then(|v| std::str::from_utf8(&v).ok().and_then(|v| v.parse().ok()));
        replicas::set_hz(hz);
    }
    if wanted("maxmemory-policy") {
        // Unreadable: assume the worst.
        let policy = config(ctx, "maxmemory-policy");
        if policy.is_none_or(|p| p.starts_with(b"allkeys-")) {
            replicas::counters_evictable();
        }
    }
}
