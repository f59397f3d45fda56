//! STAND-IN: replaced by rel24. The per-client background releaser, with exactly the interface
//! of spec24 B1 (`submit`, `flush`), kept minimal: a thread of its own with a `current_thread`
//! runtime and fresh connections from the client's [`Target`], following MOVED/ASK and asking
//! the Sentinels again after errors, retrying with backoff until a reply or `until`.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::{AsyncConnectionConfig, Cmd, RedisResult, Value};
use tokio::sync::{mpsc, oneshot};

use crate::conn::Target;

/// One command to run until it gets a reply or its time is up.
struct Job {
    key: Arc<[u8]>,
    cmd: Cmd,
    until: Instant,
    done: Option<oneshot::Sender<RedisResult<Value>>>,
}

/// Jobs submitted and not ended yet, and the condition `flush` waits on.
#[derive(Default)]
struct Pending {
    count: Mutex<usize>,
    ended: Condvar,
}

impl Pending {
    fn add(&self) {
        *self.count.lock().unwrap_or_else(PoisonError::into_inner) += 1;
    }

    fn end(&self) {
        let mut count = self.count.lock().unwrap_or_else(PoisonError::into_inner);
        *count = count.saturating_sub(1);
        self.ended.notify_all();
    }
}

/// One per `Shared` (per LockClient). Never blocks the caller; works outside any runtime.
// STAND-IN: replaced by rel24
pub(crate) struct Releaser {
    target: Target,
    jobs: Mutex<Option<mpsc::UnboundedSender<Job>>>,
    pending: Arc<Pending>,
}

impl Releaser {
    /// A releaser for the server(s) `target` names; its thread starts with the first job.
    pub(crate) fn new(target: Target) -> Self {
        Self { target, jobs: Mutex::new(None), pending: Arc::default() }
    }

    /// Runs `cmd` (idempotent: a release carrying `REQUEST id`, an `RLOCK.CANCEL`, a leased
    /// `RSEM.RELEASE key ID ..`) on the server that serves `key` now, retrying with backoff on
    /// connection errors, timeouts, READONLY, LOADING, MOVED/ASK, TRYAGAIN, CLUSTERDOWN until it
    /// gets a reply or `until` passes. `done` (if any) gets the reply.
    pub(crate) fn submit(
        &self,
        key: Arc<[u8]>,
        cmd: Cmd,
        until: Instant,
        done: Option<oneshot::Sender<RedisResult<Value>>>,
    ) {
        let job = Job { key, cmd, until, done };
        let mut jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        if jobs.is_none() {
            *jobs = self.start();
        }
        let Some(sender) = jobs.as_ref() else { return };
        self.pending.add();
        if let Err(mpsc::error::SendError(job)) = sender.send(job) {
            self.pending.end();
            drop(job);
        }
    }

    /// Blocks (bounded by `max`) until every job submitted so far ended.
    pub(crate) fn flush(&self, max: Duration) {
        let until = Instant::now() + max;
        let mut count = self.pending.count.lock().unwrap_or_else(PoisonError::into_inner);
        while *count > 0 {
            let Some(left) = until.checked_duration_since(Instant::now()) else { return };
            count = self
                .pending
                .ended
                .wait_timeout(count, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Starts the thread that runs the jobs.
    fn start(&self) -> Option<mpsc::UnboundedSender<Job>> {
        let (sender, mut receiver) = mpsc::unbounded_channel::<Job>();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
        let (target, pending) = (self.target.clone(), Arc::clone(&self.pending));
        std::thread::Builder::new()
            .name("rlock-releaser".into())
            .spawn(move || {
                runtime.block_on(async move {
                    while let Some(job) = receiver.recv().await {
                        let (target, pending) = (target.clone(), Arc::clone(&pending));
                        tokio::spawn(async move {
                            run(&target, job).await;
                            pending.end();
                        });
                    }
                });
            })
            .ok()?;
        Some(sender)
    }
}

impl Drop for Releaser {
    fn drop(&mut self) {
        self.flush(Duration::from_secs(5));
    }
}

/// Whether an error is worth trying again (elsewhere, or later).
fn retriable(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.redirect_node().is_some()
        || matches!(
            e.code(),
            Some("READONLY" | "LOADING" | "TRYAGAIN" | "CLUSTERDOWN" | "MASTERDOWN" | "NOREPLICAS")
        )
}

async fn run(target: &Target, mut job: Job) {
    let quick = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_response_timeout(Some(Duration::from_secs(1)));
    let mut node: Option<(String, u16)> = None;
    let mut asking = false;
    let mut backoff = Duration::from_millis(20);
    let last = loop {
        let client = match target {
            Target::Sentinel(sentinel) => sentinel.master().await.map(|(client, _)| client),
            _ => target
                .client_at(node.as_ref().map(|(h, p)| (h.as_str(), *p)))
                .map_err(|e| redis::RedisError::from((redis::ErrorKind::Io, "", e.to_string()))),
        };
        let reply = match client {
            Ok(client) => match client.get_multiplexed_async_connection_with_config(&quick).await {
                Ok(mut con) => {
                    if std::mem::take(&mut asking) {
                        let _: RedisResult<Value> =
                            redis::cmd("ASKING").query_async(&mut con).await;
                    }
                    job.cmd.query_async::<Value>(&mut con).await
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        match reply {
            Ok(value) => break Ok(value),
            Err(e) if retriable(&e) && Instant::now() < job.until => {
                if let Some((address, _)) = e.redirect_node() {
                    if let Some((host, port)) = address.rsplit_once(':') {
                        if let Ok(port) = port.parse() {
                            node = Some((host.to_owned(), port));
                            asking = matches!(
                                e.kind(),
                                redis::ErrorKind::Server(redis::ServerErrorKind::Ask)
                            );
                            continue;
                        }
                    }
                }
                if let Target::Sentinel(sentinel) = target {
                    sentinel.forget();
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            Err(e) => break Err(e),
        }
    };
    let _ = &job.key;
    if let Some(done) = job.done.take() {
        let _ = done.send(last);
    }
}
