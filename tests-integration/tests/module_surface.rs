//! The module's surface as a first user meets it: the version `MODULE LIST` shows, the version and commit in `INFO rlock` and the load log, a load
//! log without the redis-module crate's defrag warning, `COMMAND DOCS` that say what the parser
//! accepts and summaries that name what the replies hold, no timer left armed once the holds
//! are gone (so `MODULE UNLOAD` works), and number errors in Redis's terms that name only their
//! own argument.
//!
//! # Layout
//! This file holds the reply readers the parts share; the parts, in `module_surface/`:
//! - `version`: the version and commit, and the load log;
//! - `command_docs`: `COMMAND DOCS` against the parser;
//! - `timers`: no timer outlives the holds;
//! - `numbers`: number errors;
//! - `tour`: `RWLOCK.INFO`'s readers, `RLOCK.INFO` on a read-write lock, the cost of the
//!   commands that loop.

#[path = "module_surface/command_docs.rs"]
mod command_docs;
#[path = "module_surface/numbers.rs"]
mod numbers;
#[path = "module_surface/timers.rs"]
mod timers;
#[path = "module_surface/tour.rs"]
mod tour;
#[path = "module_surface/version.rs"]
mod version;

use redis::Value;

/// Field/value pairs of a map reply (a flat array under RESP2, a map under RESP3).
fn pairs(value: &Value) -> Vec<(String, Value)> {
    match value {
        Value::Array(items) => items
            .chunks(2)
            .filter_map(|pair| match pair {
                [k, v] => Some((text(k), v.clone())),
                _ => None,
            })
            .collect(),
        Value::Map(items) => items.iter().map(|(k, v)| (text(k), v.clone())).collect(),
        other => panic!("not a map: {other:?}"),
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(n) => n.to_string(),
        other => panic!("not text: {other:?}"),
    }
}

fn field(value: &Value, name: &str) -> Option<Value> {
    pairs(value).into_iter().find(|(k, _)| k == name).map(|(_, v)| v)
}
