//! Names: Redisson's `prefixName` rule for the keys and channel a lock derives from its name,
//! braced names included.

use std::time::Duration;

use redis::{Connection, Value};

use rlock_tests_integration::{cmd, Server};

fn exists(con: &mut Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<i64>(con).expect("EXISTS") == 1
}

fn get(con: &mut Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(con).expect("GET")
}

#[test]
fn braced_names_derive_keys_and_channels_by_redissons_prefixname_rule() {
    let server = Server::start();
    let mut con = server.conn();
    let mut sub = server.conn();
    sub.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let mut sub = sub.as_pubsub();
    sub.subscribe("redisson_lock__channel:{user1}:lock").expect("subscribe");
    for name in ["{user1}:lock", "orders{42}", "a}b"] {
        cmd(&mut con, &["RLOCK.ACQUIRE", name, "o", "30000", "TOKEN"]);
        let counter = if name.contains('{') {
            format!("redisson_lock_token:{name}")
        } else {
            format!("redisson_lock_token:{{{name}}}")
        };
        assert_eq!(get(&mut con, &counter).as_deref(), Some("1"), "{counter}");
        assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", name, "o", "REQUEST", "r1"]), Value::Int(1));
        let latch = if name.contains('{') {
            format!("redisson_unlock_latch:{name}:r1")
        } else {
            format!("redisson_unlock_latch:{{{name}}}:r1")
        };
        assert!(exists(&mut con, &latch), "{latch}");
    }
    let msg = sub.get_message().expect("the unlock message of {user1}:lock");
    assert_eq!(msg.get_channel_name(), "redisson_lock__channel:{user1}:lock");
    assert_eq!(msg.get_payload_bytes(), b"0");
}
