//! `GT` on re-entries and renewals (`RLOCK.ACQUIRE`/`RENEW`, `RWLOCK.ACQUIRE`/`RENEW`): a hold
//! the owner already has ends at the later of its current lease end and now + lease-ms, on the
//! master and (the same absolute expiry) on its replica; without `GT`, Redisson's rule (the new
//! lease) is unchanged. Expiries are read as `PEXPIRETIME` (absolute): the server's clock is
//! read before and after each command to bound "now".

use redis::Connection;
use rlock_tests_integration::{cmd, pexpiretime, run, run_str, server_time_ms, Rng, Server};

/// Runs `args` and returns the server's clock just before and just after it.
fn timed(con: &mut Connection, args: &[&str]) -> (i64, i64) {
    let before = server_time_ms(con);
    cmd(con, args);
    (before, server_time_ms(con))
}

fn hold_key(lock: &str, owner: &str, index: u64) -> Vec<u8> {
    format!("{{{lock}}}:{owner}:rwlock_timeout:{index}").into_bytes()
}

/// The expiries of `keys` on `con`.
fn expiries(con: &mut Connection, keys: &[Vec<u8>]) -> Vec<i64> {
    keys.iter().map(|k| pexpiretime(con, k)).collect()
}

/// Waits until the replica has everything the master wrote, then checks both give `keys` the
/// same absolute expiry.
fn replica_agrees(master: &mut Connection, replica: &mut Connection, keys: &[Vec<u8>]) {
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(master).expect("WAIT");
    assert_eq!(acked, 1, "the replica acknowledged the writes");
    assert_eq!(expiries(replica, keys), expiries(master, keys), "the replica's expiries");
}

/// One lease change checked: `new` (the key's expiry after it) against `old` (before) for a
/// lease of `ms` sent between server times `t0` and `t1`.
fn check_lease(gt: bool, old: i64, new: i64, ms: i64, (t0, t1): (i64, i64), what: &str) {
    let fresh = (t0 + ms..=t1 + ms).contains(&new);
    if gt {
        assert!(new >= old, "{what}: GT shortened {old} to {new}");
        assert!(new == old || fresh, "{what}: GT set {new}, neither {old} nor now + {ms}");
        assert!(new >= t0 + ms, "{what}: GT left {new} before now + {ms} ({t0})");
    } else {
        assert!(fresh, "{what}: without GT {new} is not now + {ms} ({t0}..{t1})");
    }
}

#[test]
fn random_re_entries_and_renewals_of_a_lock_with_gt_never_shorten_its_lease() {
    let master = Server::start();
    let replica = Server::builder().replica_of(&master).start();
    let (mut m, mut r) = (master.conn(), replica.conn());
    let mut rng = Rng(0x0067_7401);
    let key = vec![b"gt-lock".to_vec()];
    assert!(cmd(&mut m, &["RLOCK.ACQUIRE", "gt-lock", "o", "5000"]) == redis::Value::Nil);
    let mut count = 1;
    for step in 0..60 {
        let ms = 200 + rng.below(9_800) as i64;
        let lease = ms.to_string();
        let gt = rng.below(4) != 0;
        let old = pexpiretime(&mut m, b"gt-lock");
        let mut args = if rng.below(2) == 0 {
            count += 1;
            vec!["RLOCK.ACQUIRE", "gt-lock", "o", &lease]
        } else {
            vec!["RLOCK.RENEW", "gt-lock", "o", &lease]
        };
        if gt {
            args.push("GT");
        }
        let times = timed(&mut m, &args);
        let new = pexpiretime(&mut m, b"gt-lock");
        check_lease(gt, old, new, ms, times, &format!("step {step}: {args:?}"));
    }
    let held: String = redis::cmd("HGET").arg("gt-lock").arg("o").query(&mut m).expect("HGET");
    assert_eq!(held, count.to_string(), "every re-entry counted");
    replica_agrees(&mut m, &mut r, &key);
}

#[test]
fn random_read_re_entries_and_renewals_with_gt_end_every_read_hold_together_never_sooner() {
    let master = Server::start();
    let replica = Server::builder().replica_of(&master).start();
    let (mut m, mut r) = (master.conn(), replica.conn());
    let mut rng = Rng(0x0067_7402);
    cmd(&mut m, &["RWLOCK.ACQUIRE", "gt-rw", "o", "READ", "5000"]);
    let mut reads = 1_u64;
    for step in 0..40 {
        let ms = 200 + rng.below(9_800) as i64;
        let lease = ms.to_string();
        let holds: Vec<Vec<u8>> = (1..=reads).map(|i| hold_key("gt-rw", "o", i)).collect();
        let old = expiries(&mut m, &holds).into_iter().max().expect("a hold");
        let (args, renewal) = if rng.below(2) == 0 {
            (vec!["RWLOCK.ACQUIRE", "gt-rw", "o", "READ", &lease, "GT"], false)
        } else if rng.below(2) == 0 {
            (vec!["RWLOCK.RENEW", "gt-rw", "o", &lease, "GT", "READ"], true)
        } else {
            (vec!["RWLOCK.RENEW", "gt-rw", "o", &lease, "GT"], true)
        };
        let times = timed(&mut m, &args);
        if !renewal {
            reads += 1;
        }
        let holds: Vec<Vec<u8>> = (1..=reads).map(|i| hold_key("gt-rw", "o", i)).collect();
        let ends = expiries(&mut m, &holds);
        let what = format!("step {step}: {args:?}");
        assert!(ends.iter().all(|&e| e == ends[0]), "{what}: the holds end together: {ends:?}");
        check_lease(true, old, ends[0], ms, times, &what);
        let hash = pexpiretime(&mut m, b"gt-rw");
        assert!(hash >= ends[0], "{what}: the hash ({hash}) outlives its read holds");
    }
    let mut keys: Vec<Vec<u8>> = (1..=reads).map(|i| hold_key("gt-rw", "o", i)).collect();
    keys.push(b"gt-rw".to_vec());
    replica_agrees(&mut m, &mut r, &keys);
}

#[test]
fn without_gt_a_shorter_re_entry_or_renewal_still_sets_the_shorter_lease() {
    let server = Server::start();
    let mut c = server.conn();
    cmd(&mut c, &["RLOCK.ACQUIRE", "k", "o", "60000"]);
    let times = timed(&mut c, &["RLOCK.ACQUIRE", "k", "o", "1000"]);
    check_lease(false, 0, pexpiretime(&mut c, b"k"), 1000, times, "re-entry");
    cmd(&mut c, &["RLOCK.RENEW", "k", "o", "60000"]);
    let times = timed(&mut c, &["RLOCK.RENEW", "k", "o", "1000"]);
    check_lease(false, 0, pexpiretime(&mut c, b"k"), 1000, times, "renewal");
    // A read re-entry's own hold gets the new lease; the older hold keeps its own.
    cmd(&mut c, &["RWLOCK.ACQUIRE", "rw", "o", "READ", "60000"]);
    let first = pexpiretime(&mut c, &hold_key("rw", "o", 1));
    let times = timed(&mut c, &["RWLOCK.ACQUIRE", "rw", "o", "READ", "1000"]);
    check_lease(false, 0, pexpiretime(&mut c, &hold_key("rw", "o", 2)), 1000, times, "read");
    assert_eq!(pexpiretime(&mut c, &hold_key("rw", "o", 1)), first);
}

#[test]
fn gt_on_a_fresh_grant_or_for_a_non_holder_is_the_plain_command() {
    let server = Server::start();
    let mut c = server.conn();
    let times = timed(&mut c, &["RLOCK.ACQUIRE", "k", "o", "1000", "GT"]);
    check_lease(false, 0, pexpiretime(&mut c, b"k"), 1000, times, "a fresh grant");
    let busy = cmd(&mut c, &["RLOCK.ACQUIRE", "k", "x", "1000", "GT"]);
    assert!(matches!(busy, redis::Value::Int(p) if p > 0), "another owner is told the pttl");
    assert_eq!(cmd(&mut c, &["RLOCK.RENEW", "k", "x", "5000", "GT"]), redis::Value::Int(0));
    // A GT renewal that changes nothing still tells the holder it holds.
    cmd(&mut c, &["RLOCK.RENEW", "k", "o", "60000"]);
    assert_eq!(cmd(&mut c, &["RLOCK.RENEW", "k", "o", "5", "GT"]), redis::Value::Int(1));
    // With SESSION, GT is as without: the session binds the hold, GT keeps its lease.
    cmd(&mut c, &["RLOCK.ACQUIRE", "s", "o", "60000", "SESSION"]);
    let end = pexpiretime(&mut c, b"s");
    assert_eq!(cmd(&mut c, &["RLOCK.ACQUIRE", "s", "o", "5", "SESSION", "GT"]), redis::Value::Nil);
    assert_eq!(pexpiretime(&mut c, b"s"), end);
}

#[test]
fn gt_twice_is_a_syntax_error_and_semaphores_refuse_it_as_any_unknown_option() {
    let server = Server::start();
    let mut c = server.conn();
    cmd(&mut c, &["RSEM.SETPERMITS", "s", "2"]);
    let ids = cmd(&mut c, &["RSEM.ACQUIRE", "s", "1", "LEASE", "1000"]);
    let id = match ids {
        redis::Value::Array(ids) => match &ids[0] {
            redis::Value::BulkString(id) => id.clone(),
            other => panic!("an id: {other:?}"),
        },
        other => panic!("ids: {other:?}"),
    };
    let renew: [&[u8]; 5] = [b"RSEM.RENEW", b"s", &id, b"1000", b"GT"];
    let err = run(&mut c, &renew).expect_err("refused");
    // Its arity is fixed, as before `GT` existed.
    assert!(err.contains("wrong number of arguments"), "RSEM.RENEW ... GT: {err}");
    for args in [
        &["RLOCK.ACQUIRE", "k", "o", "1000", "GT", "GT"][..],
        &["RLOCK.RENEW", "k", "o", "1000", "GT", "GT"],
        &["RWLOCK.ACQUIRE", "rw", "o", "READ", "1000", "GT", "WAIT", "5", "GT"],
        &["RWLOCK.RENEW", "rw", "o", "1000", "GT", "READ", "GT"],
        &["RSEM.ACQUIRE", "s", "1", "LEASE", "1000", "GT"],
        &["RSEM.ACQUIRE", "s", "1", "GT"],
    ] {
        let err = run_str(&mut c, args).expect_err("refused");
        assert!(err.contains("syntax error"), "{args:?}: {err}");
    }
    // Nothing was taken or changed by the refusals.
    assert_eq!(cmd(&mut c, &["EXISTS", "k", "rw"]), redis::Value::Int(0));
    assert_eq!(cmd(&mut c, &["RSEM.AVAILABLE", "s"]), redis::Value::Int(1));
}
