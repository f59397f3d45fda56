//! One acquire request, of any kind: a fresh `REQUEST id`, a non-blocking try on the shared
//! connection, then a server-side wait on a dedicated connection. Whatever ends the request
//! without the caller taking its grant (the future dropped at any await, the deadline passed,
//! a lost reply, a failed replica acknowledgement) cancels it exactly with `RLOCK.CANCEL key id`
//! through the client's releaser: the server then gives back what the request got, or refuses
//! it if it arrives later, so nothing stays held and no permit is lost. The same id lets a wait
//! be sent again after a failover, a lost connection or one that died silently
//! ([`crate::engine::resume`]): the server replays a grant it made meanwhile.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::Value;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::engine::binding::Binding;
use crate::engine::hold::Hold;
use crate::engine::kind::{self, Answer, Grant, Kind};
use crate::engine::outcome::{acknowledged, Ended};
use crate::engine::{
    bound, connection_lost, resume, uncertain, wait_ms, waiting, within, COUNTED_RECORD, GRACE,
    SETTLE,
};
use crate::error::{Error, Result};
use crate::shared::Shared;

/// One acquire request. Dropped while it may hold something nobody took, it is cancelled.
pub(crate) struct Request {
    shared: Arc<Shared>,
    key: Arc<[u8]>,
    kind: Kind,
    owner: Arc<str>,
    lease_ms: u64,
    id: Arc<str>,
    /// A command is (or may be) in flight, or a grant was answered and not taken.
    armed: bool,
    /// When the command that got the answer was sent.
    sent: Instant,
    /// Whether that command was a server-side wait (granted at some moment after `sent`).
    waited: bool,
    /// A session's binding: the acquire carries `SESSION` and runs on its connection.
    session: Option<Arc<Binding>>,
    /// A check of a wait ([`Self::still_waits`]) was answered otherwise than "already
    /// waiting": the server no longer queued the request then, so the check itself may have
    /// been granted under the request's id. An answer "not granted" (or a refusal) that comes
    /// after it cancels the request instead of disarming it.
    checked: AtomicBool,
    /// An [`crate::Owner`]'s write hold on the key, for its read request: every send may keep
    /// the key, and so that hold's write field, until the send time plus the lease
    /// ([`Hold::kin_sent`]), whatever comes of the request (granted late, cancelled).
    kin: Option<Hold>,
    /// When the request first went out (its grant, if any, came after).
    first_sent: Option<Instant>,
    /// An [`crate::Owner`]'s request: it may be a re-entry on the server (a read under the
    /// owner's write, a count of the owner's lost hold), whose lease `GT` never shortens.
    gt: bool,
    /// The last try got no answer because its connection was lost (not a timeout).
    try_lost: bool,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("kind", &self.kind)
            .field("owner", &self.owner)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Request {
    /// A request of `kind` on `key` for `owner` (ignored by permits) with a lease of
    /// `lease_ms` (ignored by counted permits), with a fresh id.
    pub(crate) fn new(
        shared: &Arc<Shared>,
        key: &Arc<[u8]>,
        kind: Kind,
        owner: Arc<str>,
        lease_ms: u64,
    ) -> Self {
        Self {
            shared: Arc::clone(shared),
            key: Arc::clone(key),
            kind,
            owner,
            lease_ms,
            id: Arc::from(uuid::Uuid::new_v4().simple().to_string()),
            armed: false,
            sent: Instant::now(),
            waited: false,
            session: None,
            checked: AtomicBool::new(false),
            kin: None,
            first_sent: None,
            gt: false,
            try_lost: false,
        }
    }

    /// Sends `GT` with every acquire of the request (an [`crate::Owner`]'s, see the field).
    #[must_use]
    pub(crate) fn gt(mut self, gt: bool) -> Self {
        self.gt = gt && self.kind.takes_gt();
        self
    }

    /// Records the owner's write hold a read request is sent under (see the field).
    #[must_use]
    pub(crate) fn kin(mut self, write: Option<Hold>) -> Self {
        self.kin = write;
        self
    }

    /// An acquire of the request goes out now: the kin write hold may be kept that long.
    fn sending(&self) -> Instant {
        let now = Instant::now();
        if let Some(write) = &self.kin {
            let lease = Duration::from_millis(self.lease_ms);
            write.kin_sent(now, crate::engine::hold::after(now, lease));
        }
        now
    }

    /// Makes it a session acquire (with `Some`): `SESSION [LOCKDELAY ms]`, sent on the
    /// session's connection (try and wait alike), so the grant binds to that connection.
    #[must_use]
    pub(crate) fn session(mut self, binding: Option<Arc<Binding>>) -> Self {
        self.session = binding;
        self
    }

    /// Records the hold a session acquire got with its session (a no-op otherwise), so that
    /// the session's close marks it lost.
    ///
    /// # Errors
    /// [`Error::SessionClosed`] when the session closed meanwhile: the hold is then marked
    /// lost, and the caller gives the grant back (drops the request, which cancels it).
    pub(crate) fn bind(&self, hold: &Hold) -> Result<()> {
        match &self.session {
            Some(binding) if !binding.adopt(hold) => {
                hold.lose();
                Err(Error::SessionClosed)
            }
            _ => Ok(()),
        }
    }

    /// The owner the request acquires for.
    pub(crate) const fn owner(&self) -> &Arc<str> {
        &self.owner
    }

    /// When the command that got the grant was sent (the grant's lease started after it).
    pub(crate) const fn sent(&self) -> Instant {
        self.sent
    }

    /// Whether the grant came from a server-side wait (its lease started at the hand-off,
    /// some time after [`Self::sent`]).
    pub(crate) const fn waited(&self) -> bool {
        self.waited
    }

    /// The caller took the grant: nothing to cancel any more.
    pub(crate) fn taken(&mut self) {
        self.armed = false;
    }

    /// Tries once, then waits in the server until `deadline` (`None`: as long as it takes).
    /// `Ok(None)`: not granted by then (nothing held). The call returns by `bound` (the
    /// caller's [`crate::engine::bound`] of the deadline: plus [`crate::engine::GRACE`]; plus
    /// the acknowledgement's time with replica/AOF acknowledgement), whatever the server does.
    ///
    /// # Errors
    /// [`Error::TimedOut`] when the server did not answer in time (the request is cancelled
    /// when dropped); the server's refusal; a failed acknowledgement (the grant is cancelled
    /// before this returns, within a bound).
    pub(crate) async fn run(
        &mut self,
        deadline: Option<Instant>,
        bound: Option<Instant>,
    ) -> Result<Option<Grant>> {
        let options = &self.shared.options;
        let ack_in_cluster = (options.replica_ack.is_some() || options.aof_ack.is_some())
            && self.shared.target.is_cluster();
        // In a cluster, the acknowledgement must run on the node's own connection: the
        // server-side path does that, and answers at once when the lock is free.
        if !ack_in_cluster {
            match self.try_once(bound).await {
                Ok(Some(grant)) => return Ok(Some(grant)),
                Ok(None) => {}
                // The try's connection was lost (killed, reset) while there is time left: no
                // answer, as for a wait. The wait sends the same request id again on a
                // connection of its own, which replays a grant the try got. (A try the server
                // did not answer in time, a stall, stays `TimedOut`.)
                Err(_) if self.armed && self.try_lost && !Self::passed(deadline) => {}
                // A session's server that is no longer the master: the session closes with it.
                Err(Error::Redis(e)) if self.session_replaced(&e, deadline).await => {
                    return Err(Error::SessionClosed);
                }
                // Refused by a server that is not (or not yet) the master to ask (the old
                // master during a failover: nothing ran): the wait asks where the key is
                // served now, as it does after a failover (a session's, on its connection,
                // again after a pause).
                Err(Error::Redis(e)) if crate::conn::not_master(&e) && !Self::passed(deadline) => {}
                Err(e) => return Err(e),
            }
            if Self::passed(deadline) {
                return Ok(None);
            }
        }
        self.wait(deadline).await
    }

    /// Whether `deadline` has passed (never, without one).
    fn passed(deadline: Option<Instant>) -> bool {
        deadline.is_some_and(|d| d <= Instant::now())
    }

    /// One non-blocking acquire on the shared connection, its answer awaited until `bound`
    /// (then the connection's own response timeout), then the acknowledgement, awaited until
    /// `bound` plus [`Self::ack_time`] (a session's try: both, in one task, until then).
    ///
    /// # Errors
    /// As [`Self::run`]; an unanswered try is [`Error::TimedOut`].
    /// Whether the last try got no answer because its connection was lost (killed, reset),
    /// not because its time ran out: an untimed acquire may ask again.
    pub(crate) const fn try_lost(&self) -> bool {
        self.try_lost
    }

    pub(crate) async fn try_once(&mut self, bound: Option<Instant>) -> Result<Option<Grant>> {
        let cmd = self.command(None);
        let acked = bound.map(|b| crate::engine::hold::after(b, self.ack_time()));
        if let Some(binding) = self.session.clone() {
            // The try and its acknowledgement run in one task on the session's connection.
            return self.on_session(&binding, cmd, acked, false).await;
        }
        (self.armed, self.sent, self.waited) = (true, self.sending(), false);
        self.first_sent.get_or_insert(self.sent);
        let mut conn = self.shared.conn.clone();
        let reply = within(bound, async { Ok(cmd.query_async::<Value>(&mut conn).await?) }).await;
        self.try_lost = reply.as_ref().is_err_and(connection_lost);
        let ended = match reply {
            Err(e) if uncertain(&e) => Ended::Unknown(Error::TimedOut),
            Err(e) => Ended::Refused(e),
            Ok(reply) => match self.kind.answer(&reply) {
                Ok(Answer::Granted(grant)) => {
                    match within(acked, acknowledged(&self.shared.options, &mut conn)).await {
                        Ok(()) => Ended::Answer(Answer::Granted(grant)),
                        Err(e) => Ended::Unacked(e),
                    }
                }
                Ok(Answer::Busy) => Ended::Answer(Answer::Busy),
                Err(e) => Ended::Unknown(e),
            },
        };
        self.settle(ended, acked).await
    }

    /// How long a grant's replica / AOF acknowledgement may take, beyond a call's bound (its
    /// timeouts and 1 s; nothing without acknowledgement).
    fn ack_time(&self) -> Duration {
        self.shared.options.response_timeout().unwrap_or_default()
    }

    /// A server-side wait until `deadline` on a dedicated connection to the key's node, in a
    /// task; the connection's response timeout and this call are bounded by the deadline plus
    /// the grace. The wait is sent again, with the same id and the time left, where the key is
    /// served now when its connection fails or the server stops being the one to wait on (a
    /// failover), and when the check from another connection finds the request no longer
    /// waiting in the server while no answer came (a connection that died silently): the same
    /// id replays a grant made meanwhile (on the new master too, when it was replicated), so
    /// nothing is granted twice and nothing is left behind.
    ///
    /// # Errors
    /// As [`Self::run`].
    pub(crate) async fn wait(&mut self, deadline: Option<Instant>) -> Result<Option<Grant>> {
        let now = Instant::now();
        let ack = self.ack_time();
        let bound = bound(deadline, now).map(|b| crate::engine::hold::after(b, ack));
        if let Some(binding) = self.session.clone() {
            return self.session_waits(&binding, deadline).await;
        }
        self.sending();
        (self.armed, self.sent, self.waited) = (true, now, true);
        self.first_sent.get_or_insert(self.sent);
        let waits = async { Ok(self.waits(deadline, bound).await) };
        let ended = within(bound, waits).await.unwrap_or_else(Ended::Unknown);
        self.settle(ended, bound).await
    }

    /// A session's server-side waits, on its connection, one after the other while its server
    /// refuses them as a master that grants nothing now (`NOREPLICAS`: its replica guard, or
    /// `LOADING`: nothing ran) and time is left, after a pause as [`Self::waits`] takes. A
    /// session is bound to its server: when that server is no longer the master (a replica
    /// now, or the Sentinels name another), the session closes ([`Error::SessionClosed`]), as
    /// it does when the Sentinels demote the old master and kill its connections.
    ///
    /// # Errors
    /// As [`Self::run`]; the last refusal when the deadline passed.
    async fn session_waits(
        &mut self,
        binding: &Arc<Binding>,
        deadline: Option<Instant>,
    ) -> Result<Option<Grant>> {
        let mut pause = resume::RETRY_FIRST;
        loop {
            let started = Instant::now();
            let bound =
                bound(deadline, started).map(|b| crate::engine::hold::after(b, self.ack_time()));
            let cmd = self.command(Some(wait_ms(deadline, started)));
            match self.on_session(binding, cmd, bound, true).await {
                Err(Error::Redis(e)) if self.session_replaced(&e, deadline).await => {
                    return Err(Error::SessionClosed);
                }
                Err(Error::Redis(e)) if crate::conn::not_master(&e) => {
                    let now = Instant::now();
                    if deadline.is_some_and(|d| d <= now) {
                        return Err(Error::Redis(e));
                    }
                    let (this, next) = resume::next_pause(pause, started.elapsed());
                    let left = deadline.map_or(this, |d| d.saturating_duration_since(now));
                    tokio::time::sleep(this.min(left)).await;
                    pause = next;
                }
                other => return other,
            }
        }
    }

    /// Whether `e`, a session acquire's refusal, says the session's server is no longer the
    /// master: a replica's refusal (`READONLY`, `MASTERDOWN`), or a master's that grants
    /// nothing now (`NOREPLICAS`, `LOADING`) while the Sentinels name another master (the old
    /// master after a failover, until they demote it). Closes the session then. Not a
    /// session's request, or another refusal: `false`. The Sentinels are given the time left
    /// before `deadline`, at most [`resume::CHECK_TIMEOUT`] (none left: not asked).
    async fn session_replaced(&self, e: &redis::RedisError, deadline: Option<Instant>) -> bool {
        let Some(binding) = &self.session else { return false };
        if !crate::conn::not_master(e) {
            return false;
        }
        let left = deadline.map_or(resume::CHECK_TIMEOUT, |d| {
            d.saturating_duration_since(Instant::now()).min(resume::CHECK_TIMEOUT)
        });
        let replaced = match e.code() {
            Some("READONLY" | "MASTERDOWN") => true,
            _ if left.is_zero() => false,
            _ => match &self.shared.target {
                crate::conn::Target::Sentinel(sentinel) => {
                    let named = tokio::time::timeout(left, sentinel.fresh_master());
                    named.await.ok().and_then(std::result::Result::ok).is_some_and(|master| {
                        master.get_connection_info().addr()
                            != binding.server().get_connection_info().addr()
                    })
                }
                _ => false,
            },
        };
        if replaced {
            binding.close();
        }
        replaced
    }

    /// Server-side waits, one after the other, until one ends with an answer or an error that
    /// is not a failover's or a lost connection's (or the deadline passed).
    async fn waits(&self, deadline: Option<Instant>, bound: Option<Instant>) -> Ended {
        let mut pause = resume::RETRY_FIRST;
        loop {
            let started = self.sending();
            let cmd = self.command(Some(wait_ms(deadline, started)));
            // The connection's own timeout is a backstop that frees the task: the call's bound
            // comes first, so the caller always sees a passed deadline as `TimedOut`.
            let response_timeout =
                bound.map(|b| b.saturating_duration_since(started).saturating_add(GRACE));
            let (reply, answer) = oneshot::channel();
            let (shared, key) = (Arc::clone(&self.shared), Arc::clone(&self.key));
            tokio::spawn(waiting::wait(shared, key, self.kind, cmd, response_timeout, reply));
            let Some(ended) = self.watched(answer).await else {
                // No longer waiting in the server and no answer: its connection is dead (the
                // answer's receiver is dropped, so the task ends and closes it). Sent again.
                pause = resume::RETRY_FIRST;
                continue;
            };
            let e = match ended {
                Ended::Unknown(e) | Ended::Refused(e)
                    if resume::resumable(&e) || resume::already_waiting(&e) =>
                {
                    e
                }
                other => return other,
            };
            let now = Instant::now();
            if deadline.is_some_and(|d| d <= now) {
                return Ended::Unknown(e); // may hold something: cancelled when dropped
            }
            resume::forget_master(&self.shared);
            let (this, next) = resume::next_pause(pause, started.elapsed());
            let left = deadline.map_or(this, |d| d.saturating_duration_since(now));
            tokio::time::sleep(this.min(left)).await;
            pause = next;
        }
    }

    /// The answer of one wait attempt; `None` when, while it gave none, the check from another
    /// connection ([`Self::still_waits`], from [`resume::CHECK_AFTER`] on, every
    /// [`resume::CHECK_EVERY`]) found the request no longer waiting and no answer came within
    /// [`resume::REPLY_GRACE`] after.
    async fn watched(&self, mut answer: oneshot::Receiver<Ended>) -> Option<Ended> {
        let stopped = |_| Ended::Unknown(stopped());
        let mut check = Instant::now() + resume::CHECK_AFTER;
        loop {
            tokio::select! {
                ended = &mut answer => return Some(ended.unwrap_or_else(stopped)),
                () = tokio::time::sleep_until(check) => {}
            }
            if !self.still_waits().await {
                let late = tokio::time::timeout(self.reply_grace(), &mut answer).await;
                return late.ok().map(|ended| ended.unwrap_or_else(stopped));
            }
            check = Instant::now() + resume::CHECK_EVERY;
        }
    }

    /// How long an answer the server has sent may take to arrive: [`resume::REPLY_GRACE`], plus
    /// the replica / AOF acknowledgement that runs before it is reported.
    fn reply_grace(&self) -> Duration {
        resume::REPLY_GRACE.saturating_add(self.ack_time())
    }

    /// Whether the server still has the request waiting, as far as can be told: the same
    /// acquire without `WAIT`, same id, on the shared connection. `ERR ... is already waiting`:
    /// it waits. A grant (a replay of the one made meanwhile, or a new one: the id makes it the
    /// same request's, which a later attempt replays and a cancellation undoes) or busy (it
    /// waits nowhere): it does not. No answer, or another refusal: as far as can be told, it
    /// does (the wait's own answer decides).
    ///
    /// A check that got no answer, or another refusal, may still have been granted under the
    /// request's id (sent, then the reply lost or late): like an answered one it marks the
    /// request checked, so that a wait then answered busy or refused cancels it (exact, and
    /// nothing when nothing was granted). Only "already waiting" proves the check took nothing.
    async fn still_waits(&self) -> bool {
        self.sending();
        let cmd = self.command(None);
        let mut conn = self.shared.conn.clone();
        let reply =
            tokio::time::timeout(resume::CHECK_TIMEOUT, cmd.query_async::<Value>(&mut conn));
        match reply.await {
            Ok(Ok(reply)) => {
                let waits = self.kind.answer(&reply).is_err();
                if !waits {
                    self.checked.store(true, Ordering::Relaxed);
                }
                waits
            }
            Ok(Err(e)) if e.to_string().contains("is already waiting") => true,
            Ok(Err(_)) | Err(_) => {
                self.checked.store(true, Ordering::Relaxed);
                true
            }
        }
    }

    /// A try (`waited: false`) or a wait on the session's connection, in a task that keeps it
    /// counted in flight until the server answers (or `bound` passes), then acknowledged on
    /// that same connection; the call returns by `bound`.
    ///
    /// # Errors
    /// As [`Self::run`]; [`Error::SessionClosed`] when the session closed before the command
    /// was sent (nothing sent) or while it was in flight (the request stays armed: dropped, it
    /// is cancelled).
    async fn on_session(
        &mut self,
        binding: &Arc<Binding>,
        cmd: redis::Cmd,
        bound: Option<Instant>,
        waited: bool,
    ) -> Result<Option<Grant>> {
        let Some((mut con, in_flight)) = binding.connection() else {
            return Err(Error::SessionClosed);
        };
        (self.armed, self.sent, self.waited) = (true, self.sending(), waited);
        self.first_sent.get_or_insert(self.sent);
        let (reply, answer) = oneshot::channel();
        let (shared, kind, bound_to) = (Arc::clone(&self.shared), self.kind, Arc::clone(binding));
        tokio::spawn(async move {
            let _in_flight = in_flight;
            let run = async {
                Ok(match cmd.query_async::<Value>(&mut con).await {
                    Ok(answer) => match kind.answer(&answer) {
                        Ok(Answer::Granted(grant)) => {
                            match acknowledged(&shared.options, &mut con).await {
                                Ok(()) => Ended::Answer(Answer::Granted(grant)),
                                Err(e) => Ended::Unacked(e),
                            }
                        }
                        Ok(Answer::Busy) => Ended::Answer(Answer::Busy),
                        Err(e) => Ended::Unknown(e),
                    },
                    Err(e) if crate::error::redis_uncertain(&e) && !e.is_timeout() => {
                        bound_to.close(); // the connection failed: so did the session
                        Ended::Unknown(Error::SessionClosed)
                    }
                    Err(e) if crate::error::redis_uncertain(&e) => Ended::Unknown(e.into()),
                    Err(e) => Ended::Refused(e.into()),
                })
            };
            let ended = within(bound, run).await.unwrap_or_else(Ended::Unknown);
            let _ = reply.send(ended);
        });
        let answer = async {
            match waited {
                true => Ok(self.watched_session(binding, answer).await),
                false => answer.await.map_err(|_| stopped()),
            }
        };
        let ended = within(bound, answer).await.unwrap_or_else(Ended::Unknown);
        self.settle(ended, bound).await
    }

    /// The answer of a session's wait; from [`resume::CHECK_AFTER`] on, every
    /// [`resume::CHECK_EVERY`], the session's connection is checked from another connection to
    /// its server. A session is its connection, so a wait on it is never sent again: when the
    /// server no longer lists the connection (`CLIENT LIST ID`), or granted the request (its
    /// record exists) and no answer came within [`Self::reply_grace`], the connection is dead
    /// (silently: nothing else would tell), and the session is closed: its server end is killed
    /// (`CLIENT KILL ID`: the server ends its holds, which it would otherwise keep for a
    /// connection a proxy keeps open), its guards are lost, and this wait ends with
    /// [`Error::SessionClosed`] (the request stays armed: dropped, it is cancelled, which gives
    /// back a grant the kill did not end).
    async fn watched_session(
        &self,
        binding: &Arc<Binding>,
        mut answer: oneshot::Receiver<Ended>,
    ) -> Ended {
        let stopped = |_| Ended::Unknown(stopped());
        let mut check = Instant::now() + resume::CHECK_AFTER;
        loop {
            tokio::select! {
                ended = &mut answer => return ended.unwrap_or_else(stopped),
                () = tokio::time::sleep_until(check) => {}
            }
            match self.session_seen(binding).await {
                Seen::Waiting => check = Instant::now() + resume::CHECK_EVERY,
                Seen::Gone => {
                    binding.close();
                    return Ended::Unknown(Error::SessionClosed);
                }
                Seen::Granted => {
                    if let Ok(ended) = tokio::time::timeout(self.reply_grace(), &mut answer).await {
                        return ended.unwrap_or_else(stopped);
                    }
                    if let Some(kill) = binding.kill_command() {
                        let killing = async {
                            let mut con = self.session_server(binding).await?;
                            Ok::<_, Error>(kill.query_async::<Value>(&mut con).await?)
                        };
                        let _ = tokio::time::timeout(resume::CHECK_TIMEOUT, killing).await;
                    }
                    binding.close();
                    return Ended::Unknown(Error::SessionClosed);
                }
            }
        }
    }

    /// What the session's server shows of its waiting request, asked on a connection of its
    /// own: its record (written when it is granted) and the session's connection. No answer,
    /// or a refusal (an ACL user without `CLIENT`): as far as can be told, it still waits.
    async fn session_seen(&self, binding: &Binding) -> Seen {
        let connecting = tokio::time::timeout(resume::CHECK_TIMEOUT, self.session_server(binding));
        let Ok(Ok(mut conn)) = connecting.await else { return Seen::Waiting };
        if let Some(id) = binding.client_id() {
            let mut list = redis::cmd("CLIENT");
            list.arg("LIST").arg("ID").arg(id);
            let listed = tokio::time::timeout(resume::CHECK_TIMEOUT, list.query_async(&mut conn));
            let gone = match listed.await {
                Ok(Ok(Value::BulkString(line))) => {
                    !binding.listed_in(&String::from_utf8_lossy(&line))
                }
                Ok(Ok(Value::VerbatimString { text, .. })) => !binding.listed_in(&text),
                _ => false,
            };
            if gone {
                return Seen::Gone;
            }
        }
        let exists = redis::cmd("EXISTS").arg(kind::record(&self.key, &self.id)).clone();
        let granted = tokio::time::timeout(resume::CHECK_TIMEOUT, exists.query_async(&mut conn));
        match granted.await {
            Ok(Ok(1)) => Seen::Granted,
            _ => Seen::Waiting,
        }
    }

    /// A connection of its own to the session's server, for a check (the shared connection
    /// may name another server now: the Sentinels' new master, where the session's connection
    /// id is some other client's).
    async fn session_server(&self, binding: &Binding) -> Result<MultiplexedConnection> {
        crate::conn::dedicated(binding.server(), Some(resume::CHECK_TIMEOUT)).await
    }

    /// The acquire command (`TOKEN` when the client asks for fencing tokens; `SESSION [LOCKDELAY
    /// ms]` for a session's).
    fn command(&self, wait_ms: Option<u64>) -> redis::Cmd {
        let token = self.shared.options.fencing;
        let mut cmd =
            self.kind.acquire(&self.key, &self.owner, self.lease_ms, wait_ms, token, &self.id);
        if let Some(binding) = &self.session {
            binding.mark(&mut cmd);
        }
        if self.gt {
            cmd.arg("GT");
        }
        cmd
    }

    /// Turns how a command ended into the call's result, settling what nobody will take: a
    /// cancellation is waited for at most [`SETTLE`], and never past the call's `bound` (the
    /// releaser goes on with it).
    async fn settle(&mut self, ended: Ended, bound: Option<Instant>) -> Result<Option<Grant>> {
        let settle =
            bound.map_or(SETTLE, |b| b.saturating_duration_since(Instant::now()).min(SETTLE));
        match ended {
            Ended::Answer(Answer::Granted(grant)) => Ok(Some(grant)),
            // A check answered while the request was not queued may have been granted: given
            // back exactly rather than left to nobody.
            Ended::Answer(Answer::Busy) if self.checked.load(Ordering::Relaxed) => {
                self.cancel(settle).await;
                Ok(None)
            }
            Ended::Refused(e) if self.checked.load(Ordering::Relaxed) => {
                self.cancel(settle).await;
                Err(e)
            }
            Ended::Answer(Answer::Busy) => {
                self.armed = false;
                Ok(None)
            }
            Ended::Refused(e) => {
                self.armed = false;
                Err(e)
            }
            // Still armed: the caller returns the error and drops the request, which cancels it.
            Ended::Unknown(e) => Err(e),
            Ended::Unacked(e) => {
                self.cancel(settle).await;
                Err(e)
            }
        }
    }

    /// Cancels the request now (when it may hold something), waiting at most `max` for the
    /// server's answer; the releaser goes on after that.
    pub(crate) async fn cancel(&mut self, max: Duration) {
        if !std::mem::replace(&mut self.armed, false) {
            return;
        }
        let (done, answer) = oneshot::channel();
        let until = self.cancel_until();
        let kept = self.kept_by_cancel();
        let then: crate::releaser::Then = Box::new(move |reply| {
            if let Some(kept) = kept {
                kept(reply);
            }
            let _ = done.send(());
        });
        let (key, cmd, durable) = (Arc::clone(&self.key), self.cancel_cmd(), self.durable());
        self.shared.releaser.submit_durable(key, cmd, until, durable, Some(then));
        let _ = tokio::time::timeout(max, answer).await;
    }

    /// What a cancellation's reply tells the owner's write hold this read request was sent
    /// under: `2` says the request had been granted (and was given back now). Its grant set the
    /// key's expiry to at least its first send time plus its lease, which giving it back never
    /// shortens while the owner's write field is there (a read release never shortens a
    /// writer's key), and the write field lasts as long as the key: so a write hold the client
    /// knew of before the request first went out, and still confirmed when the reply comes (its
    /// field was there when the grant ran), is valid that long too ([`Hold::kept_by_cancel`]),
    /// and its guard is not told lost at its own deadline. A later write hold of the owner is
    /// never kept so. The hold is held weakly: a pending job keeps nothing (nor the client).
    fn kept_by_cancel(&self) -> Option<crate::releaser::Then> {
        let (write, sent) = (self.kin.as_ref()?.downgrade(), self.first_sent?);
        let until = crate::engine::hold::after(sent, Duration::from_millis(self.lease_ms));
        Some(Box::new(move |reply| {
            if matches!(reply, Ok(Value::Int(2))) {
                if let Some(write) = write.upgrade_any() {
                    write.kept_by_cancel(sent, until);
                }
            }
        }))
    }

    /// A cancellation of a counted request that gave its permits back (answered `2`) is made
    /// durable (see [`crate::releaser::Durable`]): counted permits have no lease.
    fn durable(&self) -> crate::releaser::Durable {
        match self.kind {
            Kind::Counted(_) => crate::releaser::Durable::When(|v| matches!(v, Value::Int(2))),
            _ => crate::releaser::Durable::Never,
        }
    }

    fn cancel_cmd(&self) -> redis::Cmd {
        kind::cancel(&self.key, &self.id)
    }

    /// How long the releaser keeps trying a cancellation: as long as a grant would last (its
    /// lease; the server's record of a counted request), at least [`SETTLE`].
    fn cancel_until(&self) -> std::time::Instant {
        let keep = if self.kind.leased() {
            Duration::from_millis(self.lease_ms).max(SETTLE)
        } else {
            COUNTED_RECORD
        };
        crate::releaser::until_after(keep)
    }
}

impl Drop for Request {
    /// A request that may hold something nobody took is cancelled in the background.
    fn drop(&mut self) {
        if self.armed {
            let until = self.cancel_until();
            let (key, cmd, durable) = (Arc::clone(&self.key), self.cancel_cmd(), self.durable());
            let then = self.kept_by_cancel();
            self.shared.releaser.submit_durable(key, cmd, until, durable, then);
        }
    }
}

/// What the check of a session's wait saw.
enum Seen {
    /// Nothing says otherwise.
    Waiting,
    /// The server no longer has the session's connection.
    Gone,
    /// The server granted the request.
    Granted,
}

/// The waiting task went away without an answer (its runtime is shutting down).
fn stopped() -> Error {
    Error::Redis(redis::RedisError::from((redis::ErrorKind::Io, "the waiting task stopped")))
}
