//! The waiter queues and their schedule, without a server.

use rlock::args::Lease;
use rlock::queue::{Event, LockName, Queues, POLLS_PER_SECOND, POLL_MS};
use rlock::rules::Request;

fn lock(key: &str) -> LockName {
    LockName { db: 0, key: key.as_bytes().to_vec() }
}

fn lease() -> Lease {
    Lease::from_millis(1_000).expect("positive")
}

fn push(q: &mut Queues<u32, Request>, key: &str, handle: u32, timeout_at: Option<i64>) -> u64 {
    let request = Request {
        kind: rlock::rules::Kind::Reentrant,
        owner: format!("owner-{handle}").into_bytes(),
        lease: lease(),
        token: false,
        id: None,
        session: None,
        gt: false,
        ownerless: false,
    };
    q.push(lock(key), request, handle, timeout_at)
}

#[test]
fn waiters_are_served_first_in_first_out() {
    let mut q = Queues::default();
    for h in 1..=3 {
        push(&mut q, "l", h, None);
    }
    assert_eq!(q.waiting(0, b"l"), 3);
    let served: Vec<u32> = std::iter::from_fn(|| q.pop_head(0, b"l")).map(|w| w.handle).collect();
    assert_eq!(served, vec![1, 2, 3]);
    assert_eq!(q.waiting(0, b"l"), 0);
    assert_eq!(q.total(), 0);
    assert!(q.locks().is_empty(), "an empty queue is dropped");
}

#[test]
fn a_waiter_leaving_from_the_middle_is_skipped() {
    let mut q = Queues::default();
    let _first = push(&mut q, "l", 1, None);
    let second = push(&mut q, "l", 2, None);
    push(&mut q, "l", 3, None);
    assert_eq!(q.find(2), Some(second));
    assert_eq!(q.remove(second).map(|w| w.request.owner), Some(b"owner-2".to_vec()));
    assert_eq!(q.find(2), None);
    assert_eq!(q.waiting(0, b"l"), 2);
    assert_eq!(q.pop_head(0, b"l").map(|w| w.handle), Some(1));
    assert_eq!(q.pop_head(0, b"l").map(|w| w.handle), Some(3));
    assert_eq!(q.pop_head(0, b"l"), None);
    assert_eq!(q.remove(second), None, "removed once");
}

#[test]
fn locks_are_separate_per_key_and_database() {
    let mut q = Queues::default();
    push(&mut q, "a", 1, None);
    push(&mut q, "b", 2, None);
    let request = Request {
        kind: rlock::rules::Kind::Reentrant,
        owner: b"o".to_vec(),
        lease: lease(),
        token: false,
        id: None,
        session: None,
        gt: false,
        ownerless: false,
    };
    q.push(LockName { db: 1, key: b"a".to_vec() }, request, 3, None);
    assert_eq!((q.waiting(0, b"a"), q.waiting(0, b"b"), q.waiting(1, b"a")), (1, 1, 1));
    assert_eq!(q.pop_head(1, b"a").map(|w| w.handle), Some(3));
    assert_eq!(q.waiting(0, b"a"), 1);
    assert_eq!(q.locks(), vec![lock("a"), lock("b")]);
}

#[test]
fn timeouts_come_due_in_time_order_and_leave_with_their_waiter() {
    let mut q = Queues::default();
    let late = push(&mut q, "l", 1, Some(300));
    let early = push(&mut q, "l", 2, Some(100));
    let gone = push(&mut q, "l", 3, Some(200));
    q.remove(gone);
    assert_eq!(q.next_due(), Some(100));
    assert_eq!(q.pop_due(99), None);
    assert_eq!(q.pop_due(100), Some(Event::Timeout(early)));
    assert_eq!(q.next_due(), Some(300), "the removed waiter's timeout went with it");
    assert_eq!(q.pop_due(1_000), Some(Event::Timeout(late)));
    assert_eq!(q.pop_due(1_000), None);
}

#[test]
fn a_granted_waiter_takes_its_timeout_with_it() {
    let mut q = Queues::default();
    push(&mut q, "l", 1, Some(100));
    assert!(q.pop_head(0, b"l").is_some());
    assert_eq!(q.next_due(), None);
}

#[test]
fn one_lease_check_per_lock_moved_by_each_new_deadline() {
    let mut q = Queues::default();
    q.schedule_lease_check(&lock("nobody-waits"), 50);
    assert_eq!(q.next_due(), None, "no check for a lock without waiters");
    push(&mut q, "l", 1, None);
    q.schedule_lease_check(&lock("l"), 500);
    q.schedule_lease_check(&lock("l"), 700); // renewed
    assert_eq!(q.next_due(), Some(700));
    assert_eq!(q.pop_due(700), Some(Event::LeaseCheck(lock("l"))));
    assert_eq!(q.next_due(), None);
    q.schedule_lease_check(&lock("l"), 900);
    assert!(q.pop_head(0, b"l").is_some());
    assert_eq!(q.next_due(), None, "the check goes with the last waiter");
}

#[test]
fn drain_empties_every_queue_in_order() {
    let mut q = Queues::default();
    push(&mut q, "a", 1, Some(10));
    push(&mut q, "b", 2, None);
    push(&mut q, "a", 3, None);
    let handles: Vec<u32> = q.drain().into_iter().map(|w| w.handle).collect();
    assert_eq!(handles, vec![1, 3, 2]);
    assert_eq!(q.total(), 0);
    assert_eq!(q.next_due(), None);
}

#[test]
fn serving_cost_does_not_depend_on_dead_ids_piling_up() {
    // A long queue whose waiters mostly time out: the dead ids are compacted away, and the
    // head is still found.
    let mut q = Queues::default();
    let ids: Vec<u64> = (0..10_000).map(|h| push(&mut q, "l", h, None)).collect();
    for id in &ids[..9_999] {
        q.remove(*id);
    }
    assert_eq!(q.waiting(0, b"l"), 1);
    assert_eq!(q.pop_head(0, b"l").map(|w| w.handle), Some(9_999));
}

/// A hand-off looks at the head, grants it if the lock kind's rules allow, and looks again: with
/// a kind that can grant several waiters (readers here), one hand-off grants every reader at the
/// head and stops at the first writer, whoever queued behind it.
#[test]
fn a_hand_off_grants_from_the_head_while_the_rules_allow_and_stays_fifo() {
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Mode {
        Read,
        Write,
    }
    let mut q: Queues<u32, Mode> = Queues::default();
    let modes = [Mode::Read, Mode::Read, Mode::Write, Mode::Read];
    for (handle, mode) in (1..).zip(modes) {
        q.push(lock("rw"), mode, handle, None);
    }
    // A waiter that left from the middle of the run of readers is skipped.
    let gone = q.find(2).expect("queued");
    q.remove(gone);
    let mut granted = Vec::new();
    while let Some(head) = q.head(0, b"rw") {
        if head.request == Mode::Write && !granted.is_empty() {
            break;
        }
        let id = head.id;
        granted.push(q.remove(id).expect("queued").handle);
    }
    assert_eq!(granted, vec![1], "the readers at the head, up to the writer");
    assert_eq!(q.head(0, b"rw").map(|w| (w.handle, w.request)), Some((3, Mode::Write)));
    assert_eq!(q.waiting(0, b"rw"), 2, "the writer and the reader behind it still wait");
}

#[test]
fn a_lock_with_waiters_is_looked_at_by_its_deadline_or_the_next_poll() {
    let mut q: Queues<u32, Request> = Queues::default();
    push(&mut q, "a", 1, None);
    assert_eq!(q.look_again_at(1_000, None), 1_000 + POLL_MS, "polled with no deadline known");
    assert_eq!(q.look_again_at(1_000, Some(1_003)), 1_003, "a sooner deadline comes first");
    assert_eq!(q.look_again_at(1_000, Some(60_000)), 1_000 + POLL_MS, "a later one is polled");
    // Every lock's poll falls on the same grid, so one timer tick serves them all.
    push(&mut q, "b", 2, None);
    let (a, b) = (q.look_again_at(1_001, None), q.look_again_at(1_007, None));
    assert_eq!(a, b, "two locks looked at in the same period are polled together");
    assert!(a > 1_007 && a <= 1_001 + POLL_MS && a % POLL_MS == 0, "{a}");
}

#[test]
fn polls_over_all_locks_stay_within_the_budget() {
    let mut q: Queues<u32, Request> = Queues::default();
    let locks = POLLS_PER_SECOND * 5;
    for i in 0..locks {
        push(&mut q, &format!("k{i}"), u32::try_from(i).unwrap(), None);
    }
    let period = q.look_again_at(0, None);
    let per_second = locks as f64 * 1000.0 / period as f64;
    assert!(period > POLL_MS, "{period}");
    assert!(per_second <= POLLS_PER_SECOND as f64, "{per_second} looks a second");
}

#[test]
fn a_flush_drops_the_checks_of_its_databases_and_a_swapdb_moves_them() {
    let mut q: Queues<u32, Request> = Queues::default();
    let in_db = |db: i32, key: &str| LockName { db, key: key.as_bytes().to_vec() };
    q.schedule_check(&in_db(0, "a"), 100);
    q.schedule_check(&in_db(1, "b"), 200);
    q.schedule_check(&in_db(2, "c"), 300);
    q.swap_checks(0, 1);
    assert!(matches!(q.pop_due(100), Some(Event::Check(l)) if l == in_db(1, "a")));
    assert!(matches!(q.pop_due(200), Some(Event::Check(l)) if l == in_db(0, "b")));
    q.drop_checks(Some(0));
    assert_eq!(q.checks(), 1, "database 2's stays");
    q.schedule_check(&in_db(5, "d"), 400);
    q.drop_checks(None);
    assert_eq!(q.checks(), 0);
    assert_eq!(q.next_due(), None, "nothing left in the schedule");
}

/// A freed lock whose check is under another name (RENAME, MOVE): every check is moved to now,
/// when there are few, and each stays one check (rescheduled by its own look, not duplicated).
#[test]
fn checks_are_looked_at_again_now_only_when_few() {
    let mut q: Queues<u32, Request> = Queues::default();
    q.schedule_check(&lock("a"), 60_000);
    q.schedule_check(&lock("b"), 90_000);
    assert!(q.relook_checks(2, 10));
    assert_eq!(q.checks(), 2);
    assert_eq!(q.next_due(), Some(10));
    assert!(matches!(q.pop_due(10), Some(Event::Check(_))));
    assert!(matches!(q.pop_due(10), Some(Event::Check(_))));
    assert_eq!(q.pop_due(100_000).map(|_| ()), None, "no copy left at the old deadlines");
    q.schedule_check(&lock("a"), 60_000);
    q.schedule_check(&lock("b"), 90_000);
    q.schedule_check(&lock("c"), 90_000);
    assert!(!q.relook_checks(2, 10), "too many: left at their deadlines");
    assert_eq!(q.next_due(), Some(60_000));
}

/// A waiter tagged with its request id is found by lock and id while it waits; ids are unique
/// per lock (the same id may wait on another lock), and the tag leaves with its waiter.
#[test]
fn tagged_waiters_are_found_by_lock_and_tag_until_they_leave() {
    let mut q = Queues::default();
    let a = push(&mut q, "l", 1, None);
    let b = push(&mut q, "l", 2, None);
    let other = push(&mut q, "m", 3, None);
    assert_eq!(q.find_tagged(0, b"l", b"r1"), None);
    assert!(q.set_tag(a, b"r1".to_vec()));
    assert!(!q.set_tag(b, b"r1".to_vec()), "one waiter per id and lock");
    assert!(!q.set_tag(a, b"r2".to_vec()), "one tag per waiter");
    assert!(q.set_tag(b, b"r2".to_vec()));
    assert!(q.set_tag(other, b"r1".to_vec()), "another lock");
    assert_eq!(q.find_tagged(0, b"l", b"r1"), Some(a));
    assert_eq!(q.find_tagged(0, b"l", b"r2"), Some(b));
    assert_eq!(q.find_tagged(0, b"m", b"r1"), Some(other));
    assert_eq!(q.find_tagged(1, b"l", b"r1"), None, "another database");
    assert_eq!(q.pop_head(0, b"l").map(|w| w.id), Some(a));
    assert_eq!(q.find_tagged(0, b"l", b"r1"), None, "gone with its waiter");
    q.remove(b);
    assert_eq!(q.find_tagged(0, b"l", b"r2"), None);
    assert_eq!(q.drain().len(), 1);
    assert_eq!(q.find_tagged(0, b"m", b"r1"), None);
    let again = push(&mut q, "l", 4, None);
    assert!(q.set_tag(again, b"r1".to_vec()), "a freed id may wait again");
    assert_eq!(q.find_tagged(0, b"l", b"r1"), Some(again));
}

#[test]
fn listing_counts_and_the_owner_index_follow_every_removal() {
    use rlock::queue::{End, QueueStats};
    let mut q = Queues::default();
    let ids: Vec<u64> = (1..=4).map(|h| push(&mut q, "l", h, Some(1_000 + i64::from(h)))).collect();
    for (i, &id) in ids.iter().enumerate() {
        q.set_since(id, 10 * i as i64);
        q.set_owner(id, format!("owner-{}", i % 2).as_bytes());
    }
    q.set_owner(ids[0], b"again");
    let listed: Vec<u32> = q.list(0, b"l", 3, |_| true).iter().map(|w| w.handle).collect();
    assert_eq!(listed, [1, 2, 3], "queue order, at most count");
    assert_eq!(q.list(0, b"l", 10, |r| r.owner.ends_with(b"2")).len(), 1);
    assert_eq!(q.get(ids[1]).and_then(|w| w.timeout_at()), Some(1_002));
    assert_eq!(q.waits_of(0, b"owner-0").count(), 2, "indexed once each");
    assert_eq!(q.waits_of(1, b"owner-0").count(), 0, "per database");
    assert!(q.owner_waits(0, b"owner-0") && !q.owner_waits(1, b"owner-0"));
    assert!(!q.owner_waits(0, b"again"), "indexed once per waiter");
    q.remove_as(ids[0], End::Granted, Some(25));
    q.remove_as(ids[1], End::TimedOut, Some(40));
    q.remove(ids[2]);
    assert_eq!(q.stats(0, b"l"), QueueStats { waits: 4, handoffs: 1, timeouts: 1 });
    assert_eq!(q.waits_of(0, b"owner-0").count(), 0);
    assert!(!q.owner_waits(0, b"owner-0"), "the owner's last wait ended");
    assert_eq!(q.waits_of(0, b"owner-1").count(), 1);
    let times = q.wait_times();
    assert_eq!((times.count, times.sum_ms), (2, 25 + 30), "remove() records no time");
    q.remove_as(ids[3], End::Granted, Some(100));
    assert!(!q.any_owner_waits());
    assert_eq!(q.stats(0, b"l"), QueueStats::default(), "the figures go with the queue");
}

#[test]
fn wait_time_buckets_are_cumulative_and_saturate() {
    use rlock::queue::{WaitTimes, WAIT_BUCKETS_MS};
    let mut t = WaitTimes::default();
    for ms in [0, 1, 2, 10, 10_001, -5] {
        t.record(ms);
    }
    assert_eq!(WAIT_BUCKETS_MS[0], 1);
    assert_eq!(t.le[0], 3, "0, 1 and a negative length (as 0)");
    assert_eq!(t.le[2], 5, "at most 10 ms");
    assert_eq!(t.le[WAIT_BUCKETS_MS.len() - 1], 5);
    assert_eq!((t.count, t.sum_ms), (6, 10_014));
    t.sum_ms = u64::MAX;
    t.record(i64::MAX);
    assert_eq!(t.sum_ms, u64::MAX);
}

#[test]
fn waiters_apart_are_passed_by_and_taken_wherever_they_stand() {
    let mut q: Queues<u32, Request> = Queues::default();
    let apart = |q: &mut Queues<u32, Request>, handle: u32| {
        let request = Request {
            kind: rlock::rules::Kind::Latch,
            owner: Vec::new(),
            lease: lease(),
            token: false,
            id: None,
            session: None,
            gt: false,
            ownerless: false,
        };
        let joining = rlock::queue::Joining { apart: true, ..Default::default() };
        q.enqueue(lock("l"), request, handle, Some(50), joining)
    };
    assert!(q.first_apart(0, b"l").is_none());
    apart(&mut q, 1);
    push(&mut q, "l", 2, None);
    let gone = apart(&mut q, 3);
    apart(&mut q, 4);
    push(&mut q, "l", 5, None);
    assert!(q.remove(gone).is_some());
    assert_eq!((q.waiting(0, b"l"), q.in_line(0, b"l")), (4, 2));
    assert_eq!(q.head(0, b"l").map(|w| w.handle), Some(1));
    assert_eq!(q.in_line_head(0, b"l").map(|w| w.handle), Some(2), "passes 1 by");
    assert_eq!(q.first_apart(0, b"l").map(|w| w.handle), Some(1));
    assert!(q.pop_head(0, b"l").is_some());
    assert_eq!(q.first_apart(0, b"l").map(|w| w.handle), Some(4), "behind 2");
    let taken = q.take_apart(0, b"l", rlock::queue::End::Granted, 100);
    assert_eq!(taken.iter().map(|w| w.handle).collect::<Vec<_>>(), vec![4]);
    assert_eq!((q.waiting(0, b"l"), q.in_line(0, b"l")), (2, 2));
    assert!(q.first_apart(0, b"l").is_none());
    assert_eq!(q.in_line_head(0, b"l").map(|w| w.handle), Some(2));
    assert!(q.take_apart(0, b"x", rlock::queue::End::Granted, 100).is_empty());
}

/// Latch awaiters timing out one by one while others wait (issue 34 §13): every timeout looks
/// at the line's head and the first awaiter, and before the look walked every awaiter ahead of
/// the line (12,000 awaiters: 72 million entries, a stall of a second). Each look costs O(1)
/// amortized now, whoever waits apart.
#[test]
fn looking_at_the_heads_walks_no_waiter_apart() {
    let mut q: Queues<u32, Request> = Queues::default();
    let n: u32 = 10_000;
    let mut ids = Vec::new();
    for handle in 0..n {
        let request = Request {
            kind: rlock::rules::Kind::Latch,
            owner: Vec::new(),
            lease: lease(),
            token: false,
            id: None,
            session: None,
            gt: false,
            ownerless: false,
        };
        let joining = rlock::queue::Joining { apart: true, ..Default::default() };
        ids.push(q.enqueue(lock("l"), request, handle, Some(50), joining));
    }
    push(&mut q, "l", n, None);
    let before = q.walked();
    // Timeouts from the last awaiter and from the first, as a timer tick serves them.
    for i in 0..ids.len() {
        let id = if i % 2 == 0 { ids[i / 2] } else { ids[ids.len() - 1 - i / 2] };
        assert_eq!(q.in_line_head(0, b"l").map(|w| w.handle), Some(n), "the line's head");
        assert!(q.first_apart(0, b"l").is_some());
        assert!(q.head(0, b"l").is_some());
        assert!(q.remove(id).is_some());
    }
    assert!(q.first_apart(0, b"l").is_none());
    assert_eq!(q.in_line(0, b"l"), 1);
    let walked = q.walked() - before;
    assert!(walked <= 8 * u64::from(n), "{walked} entries walked for {n} timeouts");
}

#[test]
fn a_queue_lists_its_line_and_its_waiters_apart_in_order_of_arrival() {
    let mut q: Queues<u32, Request> = Queues::default();
    let apart = |q: &mut Queues<u32, Request>, handle: u32| {
        let request = Request {
            kind: rlock::rules::Kind::Latch,
            owner: Vec::new(),
            lease: lease(),
            token: false,
            id: None,
            session: None,
            gt: false,
            ownerless: false,
        };
        let joining = rlock::queue::Joining { apart: true, ..Default::default() };
        q.enqueue(lock("l"), request, handle, None, joining)
    };
    push(&mut q, "l", 1, None);
    apart(&mut q, 2);
    apart(&mut q, 3);
    let gone = push(&mut q, "l", 4, None);
    apart(&mut q, 5);
    push(&mut q, "l", 6, None);
    assert!(q.remove(gone).is_some());
    let listed: Vec<u32> = q.list(0, b"l", 10, |_| true).iter().map(|w| w.handle).collect();
    assert_eq!(listed, vec![1, 2, 3, 5, 6]);
    let latches = q.waiting_for(0, b"l", |r| r.kind == rlock::rules::Kind::Latch);
    assert_eq!(latches, 3);
    let served: Vec<u32> = std::iter::from_fn(|| q.pop_head(0, b"l")).map(|w| w.handle).collect();
    assert_eq!(served, vec![1, 2, 3, 5, 6], "the head is the longest waiting, apart or not");
}
