//! The per-client background releaser: what a guard's `Drop` (or an acquire that ends without
//! handing out a guard) must still tell the server, sent without blocking the caller and
//! without needing the caller's runtime.
//!
//! One [`Releaser`] per [`crate::conn::Shared`] (per `LockClient` and its clones). On its first
//! job it starts an OS thread of its own running a `current_thread` tokio runtime with its own
//! connections (a connection made in the user's runtime dies with that runtime). Each job runs
//! as its own task there, so a stalled server delays only the jobs it serves. A job goes to the
//! server that serves its key *now*:
//! - one server: that server;
//! - Sentinel: the master the Sentinels name now, asked again after a connection error, a
//!   timeout, or `READONLY` / `NOREPLICAS` / `MASTERDOWN` / `LOADING` (never kept on a demoted
//!   master);
//! - a cluster: a cluster connection built from *all* the seed nodes (any reachable one gives
//!   the slot map), routed by the key's slot, following `MOVED` / `ASK`.
//!
//! A job is retried with a growing pause (25 ms doubling up to 1 s) after connection errors,
//! timeouts and the refusals above (and `TRYAGAIN`, `CLUSTERDOWN`), until the server replies or
//! its `until` passes (the hold's lease end: after that the lease ended it anyway). Jobs must be
//! idempotent (a release carrying `REQUEST id`, an `RLOCK.CANCEL`, a leased `RSEM.RELEASE key
//! ID ..`): a retry may reach a server that already ran the first send.
//!
//! A counted give-back (a `Semaphore::release`, an `RLOCK.CANCEL` of a counted request that
//! answered `2`) is then made durable ([`Durable`]): counted permits have no lease, so one a
//! master answered and then lost with its role would be a permit lost for good. It is sent
//! again (idempotent by its request id), and on that connection `INFO replication` gives the
//! master's replicas and `WAIT n` (1 s) their acknowledgement; fewer acknowledged, the round
//! is tried again (on the current master) until `until`. These rounds use connections of their
//! own (a `WAIT` blocks its connection), and count as pending until they end.
//!
//! When the releaser is dropped (the last `LockClient` clone, handle and guard are gone) with
//! jobs still pending, the thread goes on with them (it ends once its last job ends), and:
//! - outside any tokio runtime (a plain thread, the end of a synchronous `main`), the drop
//!   waits for them, at most [`FLUSH_MAX`], so they are done before the process can exit;
//! - inside a runtime (a user's task, the library's own, `block_on`), it never blocks: it
//!   leaves a task on that runtime that waits for them asynchronously, and that task, if the
//!   runtime shuts down first (the end of an async `main`), waits for them in its drop (the
//!   rest of [`FLUSH_MAX`]), when nothing else of that runtime runs any more.
//!
//! With nothing pending the drop never waits.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route as SlotRoute, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{AsyncConnectionConfig, RedisError, RedisResult, Value};
use tokio::sync::{mpsc, oneshot};

use crate::conn::Sentinel;

/// How long dropping the last handle of a client waits for its pending releases.
pub(crate) const FLUSH_MAX: Duration = Duration::from_secs(5);
/// How long the first try of a job waits for its reply before it is sent again (on a new
/// connection); doubled after each try that timed out, up to [`MAX_PATIENCE`], so a stalled
/// server collects a few connections, not one per try.
const ATTEMPT: Duration = Duration::from_secs(2);
const MAX_PATIENCE: Duration = Duration::from_secs(16);
/// How long connecting to a server may take.
const CONNECT: Duration = Duration::from_secs(1);
/// The first pause between tries, doubled after each failed try up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(25);
const MAX_PAUSE: Duration = Duration::from_secs(1);
/// How long making a cluster connection (or finding a Sentinel group's master) may take.
const RESOLVE: Duration = Duration::from_secs(10);
/// The least time given to a try, even past `until` (every job is tried at least once).
const MIN_ATTEMPT: Duration = Duration::from_millis(200);
/// How long one durability check of a counted give-back waits for the replicas (`WAIT n ms`).
const DURABLE_WAIT_MS: u64 = 1000;

/// Where the releaser sends its jobs: the topology of the client, with settings (database,
/// credentials, protocol) of the client's own connections.
pub(crate) enum Route {
    /// One server.
    Single(redis::Client),
    /// The master a Sentinel group names (a resolver of the releaser's own).
    Sentinel(Sentinel),
    /// A cluster, reached through any of its seed nodes.
    Cluster(ClusterClient),
}

/// What a job's reply is given to, once it ends: a channel, or a function called on the
/// releaser's thread (inside its runtime). Dropped without a reply (the job never ran: no
/// thread), neither sees anything.
pub(crate) type Then = Box<dyn FnOnce(&RedisResult<Value>) + Send>;

/// Whether a job's give-back must also be made durable: sent again and acknowledged by every
/// replica of the master ([`confirm`]), since counted permits have no lease and a give-back a
/// master answered and then lost with its role (cut off and replaced before it replicated)
/// would be a permit lost for good.
#[derive(Clone, Copy)]
pub(crate) enum Durable {
    /// No: sent until answered.
    Never,
    /// When its answer says it gave permits back (an `RLOCK.CANCEL` answered `2`).
    When(fn(&Value) -> bool),
    /// Already answered (by the caller): only made durable.
    Now,
}

/// One job: a command, the key it is for, until when to retry it, and who wants its reply.
struct Job {
    key: Arc<[u8]>,
    cmd: redis::Cmd,
    until: Instant,
    durable: Durable,
    done: Option<oneshot::Sender<RedisResult<Value>>>,
    then: Option<Then>,
    /// Counts the job as pending until it is dropped (ended, or never run).
    _ticket: Ticket,
}

/// Jobs submitted and not yet ended, and a signal when one ends.
#[derive(Default)]
struct Pending {
    count: Mutex<u64>,
    ended: Condvar,
}

/// One pending job: counted while it lives.
struct Ticket(Arc<Pending>);

impl Ticket {
    fn new(pending: &Arc<Pending>) -> Self {
        *pending.count.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        Self(Arc::clone(pending))
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut count = self.0.count.lock().unwrap_or_else(PoisonError::into_inner);
        *count = count.saturating_sub(1);
        self.0.ended.notify_all();
    }
}

/// One per `Shared` (per `LockClient`). Never blocks the caller; works outside any runtime.
pub(crate) struct Releaser {
    /// Given to the thread when it starts.
    route: Arc<Route>,
    /// The thread's queue, once started.
    queue: Mutex<Option<mpsc::UnboundedSender<Job>>>,
    pending: Arc<Pending>,
}

impl Releaser {
    /// A releaser for `route`; its thread starts with the first job.
    pub(crate) fn new(route: Route) -> Self {
        Self { route: Arc::new(route), queue: Mutex::new(None), pending: Arc::default() }
    }

    /// Runs `cmd` (idempotent: a release carrying `REQUEST id`, an `RLOCK.CANCEL`, a leased
    /// `RSEM.RELEASE key ID ..`) on the server that serves `key` *now* (single server; the master
    /// the Sentinels name now, re-asked after connection errors/READONLY/NOREPLICAS; a cluster via
    /// its slot map and any reachable node, following MOVED/ASK), retrying with backoff on
    /// connection errors, timeouts, READONLY, LOADING, MOVED/ASK, TRYAGAIN, CLUSTERDOWN until it
    /// gets a reply or `until` passes. `done` (if any) gets the reply.
    ///
    /// A server's error reply comes to `done` as an `Err`; so does the last failure when
    /// `until` passed without a reply. The job is tried at least once, even past `until`.
    #[cfg(test)]
    pub(crate) fn submit(
        &self,
        key: Arc<[u8]>,
        cmd: redis::Cmd,
        until: Instant,
        done: Option<oneshot::Sender<RedisResult<Value>>>,
    ) {
        self.enqueue(Job {
            key,
            cmd,
            until,
            durable: Durable::Never,
            done,
            then: None,
            _ticket: Ticket::new(&self.pending),
        });
    }

    /// As [`Self::submit`], with `then` called with the reply (on the releaser's thread) when
    /// the job ends.
    pub(crate) fn submit_then(&self, key: Arc<[u8]>, cmd: redis::Cmd, until: Instant, then: Then) {
        self.submit_durable(key, cmd, until, Durable::Never, Some(then));
    }

    /// As [`Self::submit_then`] (`then` is called with the first answer), the give-back then
    /// made durable as `durable` says: `cmd` (idempotent by its request id) sent again and
    /// `WAIT`ed for on that connection by every replica the master has, again on the current
    /// master until they all acknowledged or `until` passed. Counted as pending (see
    /// [`Self::flush`]) until then.
    pub(crate) fn submit_durable(
        &self,
        key: Arc<[u8]>,
        cmd: redis::Cmd,
        until: Instant,
        durable: Durable,
        then: Option<Then>,
    ) {
        let ticket = Ticket::new(&self.pending);
        self.enqueue(Job { key, cmd, until, durable, done: None, then, _ticket: ticket });
    }

    fn enqueue(&self, job: Job) {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let job = match queue.as_ref() {
            Some(q) => match q.send(job) {
                Ok(()) => return,
                // The thread is gone (it could not build its runtime): start another.
                Err(mpsc::error::SendError(job)) => job,
            },
            None => job,
        };
        *queue = start(Arc::clone(&self.route));
        if let Some(q) = queue.as_ref() {
            // On failure the job is dropped: its `done` sees a closed channel.
            let _ = q.send(job);
        }
    }

    /// Blocks (bounded by `max`) until every job submitted so far ended.
    pub(crate) fn flush(&self, max: Duration) {
        self.pending.wait(max);
    }
}

impl Pending {
    fn count(&self) -> u64 {
        *self.count.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Blocks (bounded by `max`) until no job is pending.
    fn wait(&self, max: Duration) {
        let count = self.count.lock().unwrap_or_else(PoisonError::into_inner);
        let waited = self.ended.wait_timeout_while(count, max, |n| *n > 0);
        drop(waited.unwrap_or_else(PoisonError::into_inner));
    }
}

impl Drop for Releaser {
    /// With jobs pending: waits for them (at most [`FLUSH_MAX`]) outside any runtime; inside
    /// one, hands the wait to a task of that runtime (see the module's doc) and returns at
    /// once. Closing the queue then lets the thread end after its last job.
    fn drop(&mut self) {
        if self.pending.count() == 0 {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.flush(FLUSH_MAX);
            return;
        };
        let until = Instant::now() + FLUSH_MAX;
        let flush = ShutdownFlush(Some((Arc::clone(&self.pending), until)));
        // Spawned on a runtime that is shutting down, the task is dropped at once: its drop
        // then waits, as at the end of `main`.
        drop(runtime.spawn(flush.run()));
    }
}

/// The wait for pending jobs a releaser dropped inside a runtime leaves behind: done
/// asynchronously while the runtime runs; in its drop (blocking, at most until `until`) when the
/// runtime shuts down first.
struct ShutdownFlush(Option<(Arc<Pending>, Instant)>);

impl ShutdownFlush {
    /// How often the asynchronous wait looks at the count.
    const POLL: Duration = Duration::from_millis(20);

    async fn run(mut self) {
        while let Some((pending, until)) = &self.0 {
            if pending.count() == 0 || Instant::now() >= *until {
                self.0 = None;
                return;
            }
            tokio::time::sleep(Self::POLL).await;
        }
    }
}

impl Drop for ShutdownFlush {
    fn drop(&mut self) {
        if let Some((pending, until)) = self.0.take() {
            pending.wait(until.saturating_duration_since(Instant::now()));
        }
    }
}

/// Now plus `lease`, as a job's `until` (a lease too long to add to now: a day from now, so a
/// drop never panics).
pub(crate) fn until_after(lease: Duration) -> Instant {
    const DAY: Duration = Duration::from_secs(86_400);
    let now = Instant::now();
    now.checked_add(lease).or_else(|| now.checked_add(DAY)).unwrap_or(now)
}

/// Starts the releaser's thread; `None` when the system refuses a thread.
fn start(route: Arc<Route>) -> Option<mpsc::UnboundedSender<Job>> {
    let (queue, jobs) = mpsc::unbounded_channel();
    let thread = std::thread::Builder::new()
        .name("rlock-releaser".to_owned())
        .spawn(move || run_thread(&route, jobs));
    thread.ok().map(|_| queue)
}

/// The thread: a `current_thread` runtime running every job as a task of its own, until the
/// queue is closed and the last job ended. Without a runtime, the jobs are dropped (their
/// `done` see a closed channel).
fn run_thread(route: &Arc<Route>, mut jobs: mpsc::UnboundedReceiver<Job>) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        jobs.close();
        while jobs.try_recv().is_ok() {}
        return;
    };
    let conns = Arc::new(Conns::new(Arc::clone(route), false));
    // Durability checks block their connection in `WAIT` (up to a second while replicas are
    // cut off): connections of their own, so they never delay a release.
    let apart = Arc::new(Conns::new(Arc::clone(route), true));
    runtime.block_on(async move {
        let mut running = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                job = jobs.recv() => match job {
                    Some(job) => {
                        running.spawn(run_job(Arc::clone(&conns), Arc::clone(&apart), job));
                    }
                    None => break,
                },
                Some(_) = running.join_next(), if !running.is_empty() => {}
            }
        }
        while running.join_next().await.is_some() {}
    });
}

/// Runs one job to a reply, or until its `until` passes (at least one try); then, if its
/// give-back must be made durable, checks it on `apart`'s connections ([`confirm`]).
async fn run_job(conns: Arc<Conns>, apart: Arc<Conns>, mut job: Job) {
    let answered = match job.durable {
        Durable::Now => true,
        Durable::Never => {
            send_job(&conns, &mut job).await;
            false
        }
        Durable::When(gave_back) => {
            matches!(send_job(&conns, &mut job).await, Some(Ok(v)) if gave_back(&v))
        }
    };
    if answered {
        confirm(&apart, &job.key, &job.cmd, tokio::time::Instant::from_std(job.until)).await;
    }
}

/// Makes an answered counted give-back durable: rounds of [`Conns::confirm`] (with the pauses
/// of a job's tries) until every replica acknowledged it, `until` passed, or the server refused
/// it otherwise than as a server that is not (or not yet) the master.
async fn confirm(conns: &Conns, key: &[u8], cmd: &redis::Cmd, until: tokio::time::Instant) {
    let mut pause = FIRST_PAUSE;
    loop {
        let budget = until.saturating_duration_since(tokio::time::Instant::now());
        match conns.confirm(key, cmd, budget.clamp(MIN_ATTEMPT, ATTEMPT)).await {
            Ok(true) => return,
            Err(e) if !worth_retrying(&e) => return,
            Ok(false) | Err(_) => {}
        }
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return;
        }
        tokio::time::sleep(pause.min(left)).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

/// Sends one job until a reply or its `until`, and hands the reply to whoever wants it;
/// returns it (a copy of a value; `None` for an error).
async fn send_job(conns: &Conns, job: &mut Job) -> Option<RedisResult<Value>> {
    let until = tokio::time::Instant::from_std(job.until);
    let (mut pause, mut patience) = (FIRST_PAUSE, ATTEMPT);
    let reply = loop {
        let budget = until.saturating_duration_since(tokio::time::Instant::now());
        let reply = conns.send(&job.key, &job.cmd, budget.clamp(MIN_ATTEMPT, patience)).await;
        if reply.as_ref().is_err_and(RedisError::is_timeout) {
            patience = (patience * 2).min(MAX_PATIENCE);
        }
        match reply {
            Err(e) if worth_retrying(&e) && tokio::time::Instant::now() < until => {
                let left = until.saturating_duration_since(tokio::time::Instant::now());
                tokio::time::sleep(pause.min(left)).await;
                pause = (pause * 2).min(MAX_PAUSE);
            }
            reply => break reply,
        }
    };
    if let Some(then) = job.then.take() {
        then(&reply);
    }
    let copy = reply.as_ref().ok().map(|v| Ok(v.clone()));
    if let Some(done) = job.done.take() {
        let _ = done.send(reply);
    }
    copy
}

/// The error of a try that took longer than its budget.
fn timed_out(what: &'static str) -> RedisError {
    RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, what))
}

/// Whether a failed try may succeed later: anything but a final answer of the server (a
/// server's error reply other than the refusals of a server that is not, or not yet, the one
/// to ask).
fn worth_retrying(e: &RedisError) -> bool {
    !crate::error::from_server(e)
        || e.is_cluster_error()
        || matches!(
            e.code(),
            Some("READONLY" | "NOREPLICAS" | "MASTERDOWN" | "LOADING" | "TRYAGAIN" | "CLUSTERDOWN")
        )
}

/// Whether an error says the connection (or the server behind it) failed: the connection is
/// then dropped, and the next try makes a new one.
fn connection_failed(e: &RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal()
}

/// The releaser's connections (only ever used on its thread).
struct Conns {
    route: Arc<Route>,
    /// Connections of its own also for a Sentinel group's master (the resolver's own
    /// connection serves the other jobs), kept in `single` with the master's address.
    apart: bool,
    /// One server: the connection (made on first use, dropped after a connection failure).
    single: tokio::sync::Mutex<Option<MultiplexedConnection>>,
    /// With `apart`: the Sentinel group's master the connection in `single` goes to.
    single_addr: std::sync::Mutex<Option<redis::ConnectionAddr>>,
    /// A cluster: the cluster connection (made on first use; it repairs itself).
    cluster: tokio::sync::Mutex<Option<ClusterConnection>>,
}

impl Conns {
    fn new(route: Arc<Route>, apart: bool) -> Self {
        Self {
            route,
            apart,
            single: tokio::sync::Mutex::new(None),
            single_addr: std::sync::Mutex::new(None),
            cluster: tokio::sync::Mutex::new(None),
        }
    }

    /// One durability check of a give-back, on one connection (so one server): `cmd` sent
    /// again (idempotent by its request id: a master that ran it does nothing more, a new one
    /// whose record still says granted gives back now), `INFO replication` (the replicas the
    /// master has; a server that is no longer master: `false`), then `WAIT n`
    /// ([`DURABLE_WAIT_MS`]). `true` when all `n` acknowledged (or there are none).
    async fn confirm(&self, key: &[u8], cmd: &redis::Cmd, budget: Duration) -> RedisResult<bool> {
        let mut con = self.connection().await?;
        let mut info = redis::cmd("INFO");
        info.arg("replication");
        let mut reply = Ok(Value::Nil);
        for (cmd, budget) in [(cmd, budget), (&info, budget)] {
            reply = self.try_on(&mut con, key, cmd, budget).await;
            reply.as_ref().map_err(Clone::clone)?;
        }
        let Some(replicas) = replicas_of(&reply?) else {
            self.forget().await; // a demoted master: the next try finds the current one
            return Ok(false);
        };
        if replicas == 0 {
            return Ok(true);
        }
        let mut wait = redis::cmd("WAIT");
        wait.arg(replicas).arg(DURABLE_WAIT_MS);
        let budget = budget + Duration::from_millis(DURABLE_WAIT_MS);
        let acked = self.try_on(&mut con, key, &wait, budget).await?;
        Ok(redis::from_redis_value::<u64>(acked).is_ok_and(|n| n >= replicas))
    }

    /// One command on `con` within `budget`, as [`Self::send`] (a failed connection forgotten).
    async fn try_on(
        &self,
        con: &mut Con<'_>,
        key: &[u8],
        cmd: &redis::Cmd,
        budget: Duration,
    ) -> RedisResult<Value> {
        let reply = match tokio::time::timeout(budget, con.req(key, cmd)).await {
            Ok(reply) => reply,
            Err(_) => Err(timed_out("the server did not answer in time")),
        };
        if let Con::Sentinel(sentinel, _) = con {
            sentinel.check_reply(&reply);
        }
        if reply.as_ref().is_err_and(connection_failed) {
            self.forget().await;
        }
        reply.and_then(Value::extract_error)
    }

    /// One try of `cmd` for `key`, the command given `budget` to answer (connecting is bounded
    /// by its own timeouts: a try cut short while connecting would never get anywhere); a
    /// server's error reply is an `Err`.
    async fn send(&self, key: &[u8], cmd: &redis::Cmd, budget: Duration) -> RedisResult<Value> {
        let mut con = self.connection().await?;
        self.try_on(&mut con, key, cmd, budget).await
    }

    /// A connection to where jobs go now: made (or, for Sentinel, the master found) on first
    /// use, and again after [`Self::forget`].
    async fn connection(&self) -> RedisResult<Con<'_>> {
        match &*self.route {
            Route::Single(client) => {
                let mut slot = self.single.lock().await;
                if let Some(con) = slot.as_ref() {
                    return Ok(Con::Single(con.clone()));
                }
                let config = config();
                let connecting = client.get_multiplexed_async_connection_with_config(&config);
                let con = tokio::time::timeout(ATTEMPT, connecting)
                    .await
                    .map_err(|_| timed_out("connecting took too long"))??;
                Ok(Con::Single(slot.insert(con).clone()))
            }
            Route::Sentinel(sentinel) => {
                // A master the Sentinels replaced still answers (a release, a cancellation)
                // until they demote it: ask them first, so a job never ends on an old master.
                // Asking is capped (a silent Sentinel would hold the job for its connection's
                // timeouts, per Sentinel): cut short, the cached master is used and the next
                // try asks again.
                let connecting = async {
                    sentinel.refresh_capped().await;
                    if !self.apart {
                        return sentinel.connection().await;
                    }
                    let (client, _) = sentinel.master().await?;
                    self.own_connection(&client).await
                };
                let con = tokio::time::timeout(RESOLVE, connecting)
                    .await
                    .map_err(|_| timed_out("asking the Sentinels took too long"))??;
                Ok(Con::Sentinel(sentinel, con))
            }
            Route::Cluster(client) => {
                let mut slot = self.cluster.lock().await;
                if let Some(con) = slot.as_ref() {
                    return Ok(Con::Cluster(con.clone()));
                }
                let con = tokio::time::timeout(RESOLVE, client.get_async_connection())
                    .await
                    .map_err(|_| timed_out("no cluster node answered in time"))??;
                Ok(Con::Cluster(slot.insert(con).clone()))
            }
        }
    }

    /// With `apart`, a connection of its own to the Sentinel group's master `client` (kept
    /// while that master stays the same).
    async fn own_connection(&self, client: &redis::Client) -> RedisResult<MultiplexedConnection> {
        let addr = client.get_connection_info().addr().clone();
        let mut slot = self.single.lock().await;
        let same =
            self.single_addr.lock().unwrap_or_else(PoisonError::into_inner).as_ref() == Some(&addr);
        if let (Some(con), true) = (slot.as_ref(), same) {
            return Ok(con.clone());
        }
        let config = config();
        let connecting = client.get_multiplexed_async_connection_with_config(&config);
        let con = tokio::time::timeout(ATTEMPT, connecting)
            .await
            .map_err(|_| timed_out("connecting took too long"))??;
        *self.single_addr.lock().unwrap_or_else(PoisonError::into_inner) = Some(addr);
        Ok(slot.insert(con).clone())
    }

    /// Forgets the connection after a failure or a timeout: the next try connects again (one
    /// server), or asks the Sentinels again. A cluster connection repairs itself.
    async fn forget(&self) {
        match &*self.route {
            Route::Single(_) => *self.single.lock().await = None,
            Route::Sentinel(sentinel) => {
                sentinel.forget();
                *self.single.lock().await = None;
            }
            Route::Cluster(_) => {}
        }
    }
}

/// A connection of the releaser, for one try.
enum Con<'a> {
    Single(MultiplexedConnection),
    Sentinel(&'a Sentinel, MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Con<'_> {
    /// Sends `cmd` (for `key`: a cluster routes it by the key's slot).
    async fn req(&mut self, key: &[u8], cmd: &redis::Cmd) -> RedisResult<Value> {
        match self {
            Self::Single(con) | Self::Sentinel(_, con) => con.req_packed_command(cmd).await,
            Self::Cluster(con) => {
                let node = SlotRoute::with_key(key, SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(node));
                con.route_command(cmd.clone(), routing).await
            }
        }
    }
}

/// The replicas a master has (`connected_slaves` of `INFO replication`); `None` when the
/// server that answered is not a master (or the reply is not one of `INFO`).
fn replicas_of(info: &Value) -> Option<u64> {
    let text: String = redis::from_redis_value(info.clone()).ok()?;
    let field = |name: &str| {
        text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(':').map(str::trim))
    };
    if field("role")? != "master" {
        return None;
    }
    field("connected_slaves").map_or(Some(0), |n| n.parse().ok())
}

/// Settings of the releaser's connection to one server (each try bounds its own wait).
fn config() -> AsyncConnectionConfig {
    AsyncConnectionConfig::new().set_connection_timeout(Some(CONNECT)).set_response_timeout(None)
}

/// A cluster client for the releaser: every seed node, its timeouts.
///
/// # Errors
/// When the addresses are invalid.
pub(crate) fn cluster_client(nodes: Vec<redis::ConnectionInfo>) -> RedisResult<ClusterClient> {
    redis::cluster::ClusterClient::builder(nodes)
        .connection_timeout(CONNECT)
        .response_timeout(ATTEMPT)
        .build()
}

/// A Sentinel resolver for the releaser (its own: never shared with the user's runtime).
pub(crate) fn sentinel(
    sentinels: Vec<redis::ConnectionInfo>,
    master: String,
    template: redis::ConnectionInfo,
) -> Sentinel {
    // Each try bounds its own wait; asking the Sentinels is bounded by `RESOLVE`.
    Sentinel::new(sentinels, master, template, MAX_PATIENCE)
}

#[cfg(test)]
mod tests;
