//! Key slots and slot ownership, without a server.

use rlock::cluster::{key_slot, ClusterView, SlotState};

#[test]
fn key_slots_follow_redis_cluster() {
    // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
    assert_eq!(key_slot(b"foo"), 12_182);
    assert_eq!(key_slot(b"hello"), 866);
    assert_eq!(key_slot(b"somekey"), 11_058);
    // A hash tag hashes only the tag; an empty tag hashes the whole key.
    assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
    assert_eq!(key_slot(b"{user1000}.followers"), key_slot(b"user1000"));
    // An empty first tag: the whole key is hashed (CLUSTER KEYSLOT foo{}{bar} = 8363).
    assert_eq!(key_slot(b"foo{}{bar}"), 8_363);
    assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
    assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
    assert_eq!(key_slot(b"redisson_lock__channel:{orders:42}"), key_slot(b"orders:42"));
}

const NODES: &str = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004,host-4 slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922
292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30003@31003 master - 0 1426238318243 3 connected 10923-16383 [93-<-e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca]
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460 [93->-292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f]
6ec23923021cf3ffec47632106199cb7f496ce01 127.0.0.1:30005@31005 master,fail - 1426238316232 1426238315232 5 disconnected
";

#[test]
fn cluster_nodes_gives_ownership_and_migrations() {
    let view = ClusterView::parse(NODES);
    assert_eq!(view.slot_state(0), SlotState::Mine);
    assert_eq!(view.slot_state(5460), SlotState::Mine);
    assert_eq!(view.slot_state(93), SlotState::Migrating { to: "127.0.0.1:30003".into() });
    assert_eq!(view.slot_state(5461), SlotState::Moved { to: "127.0.0.1:30002".into() });
    assert_eq!(view.slot_state(16_383), SlotState::Moved { to: "127.0.0.1:30003".into() });
}

#[test]
fn redirections_take_redis_own_forms() {
    let view = ClusterView::parse(NODES);
    assert_eq!(view.redirect(0, false), None);
    assert_eq!(view.redirect(93, true), None, "a migrating slot still serves the keys it has");
    assert_eq!(view.redirect(93, false), Some("ASK 93 127.0.0.1:30003".into()));
    assert_eq!(view.redirect(6000, false), Some("MOVED 6000 127.0.0.1:30002".into()));
    let partial = ClusterView::parse(&NODES.replace("10923-16383", "10923-12000"));
    assert_eq!(partial.redirect(13_000, false), Some("CLUSTERDOWN Hash slot not served".into()));
    assert_eq!(ClusterView::parse("garbage\n\n").slot_state(1), SlotState::Unserved);
}
