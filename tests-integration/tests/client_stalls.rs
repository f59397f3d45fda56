//! The Rust client through server stalls (SIGSTOP) and write pauses: a release or a cancel
//! in flight is bounded, retried when its connection is killed, and lands exactly after the
//! resume; a guard stalled past its deadline is lost and stays truthful.

use std::time::Duration;

use tokio::time::Instant;

use rlock_client::{Error, LockClient, Options};
use rlock_tests_integration::lock_client::{available, client, has_key};
use rlock_tests_integration::{blocked_clients, poll, Server};

/// How long anything the client does in the background may take to show.
const LIMIT: Duration = Duration::from_secs(10);

/// A lease long enough that a leaked hold is still there when the test looks.
const LONG: Option<Duration> = Some(Duration::from_secs(60));

/// One guard of any kind, as far as these stalls and pauses need.
enum Guard {
    Lock(rlock_client::LockGuard),
    Permit(rlock_client::PermitGuard),
}

impl Guard {
    fn is_lost(&self) -> bool {
        match self {
            Self::Lock(g) => g.is_lost(),
            Self::Permit(g) => g.is_lost(),
        }
    }
    fn valid_until(&self) -> Option<Instant> {
        match self {
            Self::Lock(g) => g.valid_until(),
            Self::Permit(g) => g.valid_until(),
        }
    }
    async fn release(self) -> rlock_client::Result<()> {
        match self {
            Self::Lock(g) => g.release().await,
            Self::Permit(g) => g.release().await,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Of {
    Lock,
    Read,
    Write,
    Leased,
}

const KINDS: [Of; 4] = [Of::Lock, Of::Read, Of::Write, Of::Leased];

/// Takes `name` as `of` (a leased semaphore gets 2 permits first) with `lease`.
async fn take(client: &LockClient, of: Of, name: &str, lease: Option<Duration>) -> Guard {
    match of {
        Of::Lock => Guard::Lock(client.lock(name).acquire(lease).await.expect("lock")),
        Of::Read => Guard::Lock(client.rw_lock(name).read().acquire(lease).await.expect("read")),
        Of::Write => Guard::Lock(client.rw_lock(name).write().acquire(lease).await.expect("write")),
        Of::Leased => {
            let sem = client.leased_semaphore(name);
            sem.try_set_permits(2).await.expect("permits");
            Guard::Permit(sem.acquire(1, lease).await.expect("leased"))
        }
    }
}

/// Whether `name` (of kind `of`) is free again on `server`.
fn free(server: &Server, of: Of, name: &str) -> bool {
    match of {
        Of::Leased => available(server, name) == 2,
        _ => !has_key(server, name),
    }
}

// ---- SIGSTOP during releases and renewals -----------------------------------------------------

/// `guard.release()` while the server is stopped returns within a bound (no deadline of its own,
/// but it must not hang on a stalled server), and the release lands after SIGCONT: nothing stays
/// held, and a leased semaphore gets back exactly its one permit (not more: no double release).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_during_a_stall_is_bounded_and_lands_exactly_after_the_resume() {
    let server = Server::start();
    let client = client(&server).await;
    for of in KINDS {
        let name = format!("stall-release-{of:?}");
        let guard = take(&client, of, &name, LONG).await;
        server.pause();
        let started = Instant::now();
        let released = tokio::time::timeout(Duration::from_secs(30), guard.release()).await;
        let took = started.elapsed();
        server.resume();
        assert!(released.is_ok(), "{of:?}: release() still running after 30 s of stall");
        assert!(took < Duration::from_secs(6), "{of:?}: release() took {took:?} on a stall");
        poll("the release to land", LIMIT, || free(&server, of, &name).then_some(()));
        if let Of::Leased = of {
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert_eq!(available(&server, &name), 2, "exactly the one permit came back");
        }
    }
}

/// A watchdog guard whose server stops past the guard's deadline reports lost by that
/// deadline, and stays lost after SIGCONT (the hold's lease ended during the stall: the server
/// does not hold it; the guard must never claim otherwise). Dropping it leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_stalled_past_its_deadline_is_lost_by_it_and_stays_truthful_after_the_resume() {
    let server = Server::start();
    let options = Options::default().watchdog_timeout(Duration::from_millis(1500));
    let client = LockClient::with_options(server.client(), options).await.expect("client");
    for of in KINDS {
        let name = format!("stall-renew-{of:?}");
        let guard = take(&client, of, &name, None).await;
        tokio::time::sleep(Duration::from_millis(700)).await; // one renewal went through
        assert!(!guard.is_lost(), "{of:?}: held before the stall");
        server.pause();
        let until = guard.valid_until().expect("a deadline");
        tokio::time::sleep_until(until + Duration::from_millis(100)).await;
        let lost_in_time = guard.is_lost();
        tokio::time::sleep(Duration::from_secs(2)).await;
        server.resume();
        assert!(lost_in_time, "{of:?}: not lost 100 ms past its own deadline on a stall");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let held = !free(&server, of, &name);
        assert!(
            guard.is_lost() && guard.valid_until().is_none(),
            "{of:?}: the guard claims the hold again after the resume (server holds: {held})"
        );
        drop(guard);
        poll("nothing held after the drop", LIMIT, || free(&server, of, &name).then_some(()));
    }
}

// ---- CLIENT PAUSE + CLIENT KILL during a release and during RLOCK.CANCEL -------------------------

fn pause_writes(server: &Server, ms: u64) {
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("WRITE")
        .query(&mut server.conn())
        .expect("CLIENT PAUSE");
}

fn kill_normal_clients(server: &Server) -> i64 {
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query(&mut server.conn())
        .expect("KILL")
}

fn unpause(server: &Server) {
    let () = redis::cmd("CLIENT").arg("UNPAUSE").query(&mut server.conn()).expect("UNPAUSE");
}

/// A release held back by `CLIENT PAUSE WRITE` whose connection is then killed (before the
/// server ran it) is retried: the call answers, and nothing stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_connection_is_killed_while_paused_is_retried_and_lands() {
    let server = Server::start();
    let client = client(&server).await;
    for of in KINDS {
        let name = format!("kill-release-{of:?}");
        let guard = take(&client, of, &name, LONG).await;
        pause_writes(&server, 20_000);
        let releasing = tokio::spawn(guard.release());
        poll("the release to be held back", LIMIT, || {
            (blocked_clients(&mut server.conn()) >= 1).then_some(())
        });
        assert!(kill_normal_clients(&server) >= 1);
        tokio::time::sleep(Duration::from_millis(100)).await;
        unpause(&server);
        let result = tokio::time::timeout(LIMIT, releasing).await.expect("bounded").expect("task");
        poll("nothing held", LIMIT, || free(&server, of, &name).then_some(()));
        assert!(result.is_ok(), "{of:?}: the retried release reported {result:?}");
    }
}

/// A counted grant whose replica acknowledgement fails is cancelled with `RLOCK.CANCEL`; that
/// cancellation is held back by `CLIENT PAUSE WRITE` and its connection killed: the releaser
/// sends it again, and the permit comes back (exactly: available = total).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_whose_connection_is_killed_while_paused_is_retried_and_gives_back_exactly() {
    let server = Server::start();
    let options = Options::default().replica_ack(1, Duration::from_millis(1500));
    let client = LockClient::with_options(server.client(), options).await.expect("client");
    let sem = client.semaphore("kill-cancel");
    sem.try_set_permits(3).await.expect("permits");
    let taking = tokio::spawn(async move { sem.try_acquire(2, Duration::ZERO).await });
    // The grant happened; its WAIT 1 1500 blocks: pause writes now, so the cancel waits.
    poll("the acknowledgement's WAIT", LIMIT, || {
        (blocked_clients(&mut server.conn()) == 1 && available(&server, "kill-cancel") == 1)
            .then_some(())
    });
    pause_writes(&server, 20_000);
    poll("the cancel to be held back", LIMIT, || {
        (blocked_clients(&mut server.conn()) == 1 && !taking.is_finished()).then_some(())
    });
    tokio::time::sleep(Duration::from_millis(1800)).await; // WAIT answered; cancel sent
    assert!(kill_normal_clients(&server) >= 1);
    unpause(&server);
    let result = tokio::time::timeout(LIMIT, taking).await.expect("bounded").expect("task");
    assert!(matches!(result, Err(Error::NotReplicated { .. })), "{result:?}");
    poll("the cancelled permits to come back", LIMIT, || {
        (available(&server, "kill-cancel") == 3).then_some(())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(available(&server, "kill-cancel"), 3, "given back exactly once");
}
