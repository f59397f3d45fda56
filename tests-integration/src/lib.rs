//! A real `redis-server` for each test, with the built rlock module loaded.
//!
//! Each [`Server`] owns its process: a free loopback port, a temporary directory (config, log,
//! AOF/RDB files), a bounded start-up wait, and a kill on drop. When the test fails (the thread
//! is panicking), the server's log is printed.
//!
//! Environment:
//! - `REDIS_SERVER`: the server binary (default `redis-server` on `PATH`);
//! - `RLOCK_MODULE`: the module to load (default `target/release/librlock.so` of this
//!   workspace; `make test` builds it first).

//!
//! The harness: [`server`] (one process), [`cluster`] (a Redis Cluster), [`sentinel`]
//! (Sentinels), [`client_model`] (the Rust client's model-based test: beliefs and their checks),
//! [`helpers`] (commands, polling, INFO fields), [`redisson`] (Redisson's
//! read-write lock scripts), [`python`] (the Python package run from a test), [`rng`] (a seeded
//! PRNG, shared with the module's server-free tests), [`fuzz`] (what the live fuzz runs share),
//! [`deadlock`] (reading a `DEADLOCK` reply's cycle, what a refused wait leaves), [`sessions`]
//! (session counters, a process to kill), [`proxy`] (a TCP proxy that stops forwarding
//! silently and heals), [`kinds`] (the five kinds of hold as commands, for the cancellation
//! tests), [`idle`] (an unloadable server, the module's timers and waiters), [`lock_client`]
//! (a Rust client of a test server, what its tests read beside it, ACL users).

pub mod client_model;
pub mod cluster;
pub mod deadlock;
pub mod docs;
pub mod fuzz;
pub mod helpers;
pub mod idle;
pub mod kinds;
pub mod lock_client;
pub mod model;
pub mod proxy;
pub mod python;
pub mod redisson;
pub mod rng;
pub mod sentinel;
pub mod server;
pub mod sessions;
pub mod transcript;

pub use cluster::Cluster;
pub use deadlock::{closes_a_cycle, deadlock_links, wait_state, Link, DEADLOCK_PREFIX};
pub use fuzz::{all_keys, assert_replica_matches, fuzz_steps, BlockedCall};
pub use helpers::*;
pub use proxy::Proxy;
pub use rng::Rng;
pub use sentinel::{Sentinel, SENTINEL_MASTER};
pub use server::{module_path, wait_link_up, wait_replica_online, Builder, Server};
pub use sessions::{barrier, session_ends, session_holds, Process};
