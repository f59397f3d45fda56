//! The wait-for graph search, without a server: a graph of maps.

use std::collections::HashMap;

use rlock::deadlock_rules::{
    blockers, describe, field_owners, find_cycle, Found, Graph, Holders, Link, Wants, MAX_STEPS,
};

#[derive(Default)]
struct Map {
    waits: HashMap<Vec<u8>, Vec<(Vec<u8>, Wants)>>,
    held: HashMap<Vec<u8>, Holders>,
    dead_readers: Vec<(Vec<u8>, Vec<u8>)>,
    /// What the search read: the keys whose holders it read, the owners whose waits it listed,
    /// the readers whose liveness it checked.
    read: Vec<Vec<u8>>,
    listed: Vec<Vec<u8>>,
    checked: usize,
}

impl Map {
    fn wait(mut self, owner: &str, key: &str, wants: Wants) -> Self {
        let entry = self.waits.entry(owner.into()).or_default();
        entry.push((key.into(), wants));
        self
    }
    fn lock(mut self, key: &str, owner: &str) -> Self {
        self.held.insert(key.into(), Holders::Lock(vec![owner.into()]));
        self
    }
    fn rw(mut self, key: &str, write: bool, writer: Option<&str>, readers: &[&str]) -> Self {
        let readers = readers.iter().map(|r| (r.as_bytes().to_vec(), 1)).collect();
        let writer = writer.map(|w| w.as_bytes().to_vec());
        self.held.insert(key.into(), Holders::Rw { write, writer, readers });
        self
    }
}

impl Graph for Map {
    fn waits(&mut self, owner: &[u8]) -> bool {
        self.waits.get(owner).is_some_and(|w| !w.is_empty())
    }
    fn waits_of(&mut self, owner: &[u8]) -> Vec<(Vec<u8>, Wants)> {
        self.listed.push(owner.to_vec());
        self.waits.get(owner).cloned().unwrap_or_default()
    }
    fn holders(&mut self, key: &[u8], steps: &mut usize) -> Holders {
        *steps = steps.saturating_sub(1);
        self.read.push(key.to_vec());
        self.held.get(key).cloned().unwrap_or(Holders::Nobody)
    }
    fn reader_live(&mut self, key: &[u8], owner: &[u8], _: u64, steps: &mut usize) -> bool {
        *steps = steps.saturating_sub(1);
        self.checked += 1;
        !self.dead_readers.contains(&(key.to_vec(), owner.to_vec()))
    }
}

fn link(owner: &str, key: &str, holder: &str) -> Link {
    Link { owner: owner.into(), key: key.into(), holder: holder.into() }
}

#[test]
fn a_two_lock_cycle_is_found_and_named_from_the_new_wait() {
    let mut g = Map::default().lock("k1", "A").lock("k2", "B").wait("A", "k2", Wants::Lock);
    let found = find_cycle(&mut g, b"B", b"k1", Wants::Lock);
    assert_eq!(found, Found::Cycle(vec![link("B", "k1", "A"), link("A", "k2", "B")]));
}

#[test]
fn a_three_lock_cycle_through_a_read_write_lock_is_found() {
    let mut g = Map::default()
        .lock("k1", "A")
        .rw("k2", true, Some("B"), &[])
        .rw("k3", false, None, &["C", "D"])
        .wait("A", "k2", Wants::Read)
        .wait("B", "k3", Wants::Write);
    let found = find_cycle(&mut g, b"C", b"k1", Wants::Lock);
    let want = vec![link("C", "k1", "A"), link("A", "k2", "B"), link("B", "k3", "C")];
    assert_eq!(found, Found::Cycle(want));
}

#[test]
fn a_chain_a_reader_behind_a_writer_and_a_dead_reader_are_not_cycles() {
    // A chain that ends with an owner who waits for nothing.
    let mut g = Map::default().lock("k1", "A").lock("k2", "B").wait("A", "k2", Wants::Lock);
    assert_eq!(find_cycle(&mut g, b"C", b"k1", Wants::Lock), Found::NoCycle);
    // A reader waiting on a lock in read mode waits for the writer queued ahead, not readers.
    let mut g = Map::default().lock("k1", "A").rw("k2", false, None, &["B"]);
    let mut g = std::mem::take(&mut g).wait("A", "k2", Wants::Read);
    assert_eq!(find_cycle(&mut g, b"B", b"k1", Wants::Lock), Found::NoCycle);
    // A reader whose every hold ended is no holder.
    let mut g =
        Map::default().lock("k1", "A").rw("k2", false, None, &["B"]).wait("A", "k2", Wants::Write);
    g.dead_readers.push((b"k2".to_vec(), b"B".to_vec()));
    assert_eq!(find_cycle(&mut g, b"B", b"k1", Wants::Lock), Found::NoCycle);
    // A waiter of another kind than its key waits for no owner.
    let mut g = Map::default().lock("k1", "A").lock("k2", "B").wait("A", "k2", Wants::Write);
    assert_eq!(find_cycle(&mut g, b"B", b"k1", Wants::Lock), Found::NoCycle);
}

#[test]
fn an_owner_that_waits_nowhere_is_not_followed() {
    // The lock's holder waits nowhere: only the lock is read, nobody's waits are listed.
    let mut g = Map::default().lock("k1", "A").lock("k2", "B").wait("B", "k1", Wants::Lock);
    assert_eq!(find_cycle(&mut g, b"C", b"k1", Wants::Lock), Found::NoCycle);
    assert_eq!((g.read, g.listed), (vec![b"k1".to_vec()], Vec::<Vec<u8>>::new()));
    // A chain: the holder's waits are listed, its lock read; the end of the chain is not.
    let mut g = Map::default().lock("k1", "A").lock("k2", "B").wait("A", "k2", Wants::Lock);
    assert_eq!(find_cycle(&mut g, b"C", b"k1", Wants::Lock), Found::NoCycle);
    assert_eq!(g.read, [b"k1".to_vec(), b"k2".to_vec()]);
    assert_eq!(g.listed, [b"A".to_vec()]);
    // A reader that waits nowhere: its liveness is not read either.
    let mut g = Map::default().rw("k1", false, None, &["B", "D"]).wait("D", "k9", Wants::Lock);
    assert_eq!(find_cycle(&mut g, b"C", b"k1", Wants::Write), Found::NoCycle);
    assert_eq!(g.checked, 1, "D's holds only");
    // The waiter itself among the holders still closes a cycle only through others.
    let mut g = Map::default().lock("k1", "A").lock("k2", "C").wait("A", "k2", Wants::Lock);
    assert!(
        matches!(find_cycle(&mut g, b"C", b"k1", Wants::Lock), Found::Cycle(c) if c.len() == 2)
    );
}

#[test]
fn every_blocker_is_named_by_a_field_of_its_lock() {
    let names = |field: &'static [u8]| field_owners(field).collect::<Vec<&[u8]>>();
    assert!(names(b"mode").is_empty());
    assert_eq!(names(b"a:1"), [b"a:1".as_slice()]);
    assert_eq!(names(b"a:1:write"), [b"a:1:write".as_slice(), b"a:1"]);
    assert_eq!(names(b":write"), [b":write".as_slice(), b""]);
    // The blockers of a read-write lock's hash, as its fields name them.
    let rw = Holders::Rw {
        write: true,
        writer: Some(b"w".to_vec()),
        readers: vec![(b"w".to_vec(), 1), (b"r".to_vec(), 1)],
    };
    let fields: [&[u8]; 4] = [b"mode", b"w:write", b"w", b"r"];
    for b in blockers(&rw, b"x", Wants::Write) {
        assert!(fields.iter().any(|f| field_owners(f).any(|o| o == b.owner)), "{:?}", b.owner);
    }
}

/// Whether `owner` is reachable from the holders of `key` (a plain depth-first search over
/// every edge, nothing pruned): the reference `find_cycle` is checked against.
fn reaches(g: &Map, owner: &[u8], key: &[u8]) -> bool {
    let holders_of = |k: &[u8]| match g.held.get(k) {
        Some(Holders::Lock(owners)) => owners.clone(),
        _ => Vec::new(),
    };
    let mut stack: Vec<Vec<u8>> = holders_of(key).into_iter().filter(|h| h != owner).collect();
    let mut seen: Vec<Vec<u8>> = Vec::new();
    while let Some(at) = stack.pop() {
        if at == owner {
            return true;
        }
        if seen.contains(&at) {
            continue;
        }
        seen.push(at.clone());
        for (k, _) in g.waits.get(&at).cloned().unwrap_or_default() {
            stack.extend(holders_of(&k).into_iter().filter(|h| *h != at));
        }
    }
    false
}

#[test]
fn random_graphs_agree_with_a_search_that_prunes_nothing() {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut cycles = 0;
    for _ in 0..2_000 {
        let mut g = Map::default();
        let (locks, owners) = (1 + next(6), 1 + next(6));
        for k in 0..locks {
            if next(4) > 0 {
                g = g.lock(&format!("k{k}"), &format!("o{}", next(owners)));
            }
        }
        for _ in 0..next(8) {
            g = g.wait(&format!("o{}", next(owners)), &format!("k{}", next(locks)), Wants::Lock);
        }
        let (owner, key) = (format!("o{}", next(owners)), format!("k{}", next(locks)));
        let want = reaches(&g, owner.as_bytes(), key.as_bytes());
        match find_cycle(&mut g, owner.as_bytes(), key.as_bytes(), Wants::Lock) {
            Found::Cycle(links) => {
                assert!(want, "{owner} -> {key}: a cycle the reference does not see");
                cycles += 1;
                // Every link is an edge of the graph, and the cycle closes on the new wait.
                assert_eq!(
                    (links[0].owner.as_slice(), links[0].key.as_slice()),
                    (owner.as_bytes(), key.as_bytes())
                );
                assert_eq!(links.last().map(|l| l.holder.as_slice()), Some(owner.as_bytes()));
                for l in &links[1..] {
                    assert!(g.waits[&l.owner].iter().any(|(k, _)| *k == l.key));
                    assert_eq!(g.held[&l.key], Holders::Lock(vec![l.holder.clone()]));
                }
            }
            Found::NoCycle => assert!(!want, "{owner} -> {key}: a cycle missed"),
            Found::OverBudget => panic!("a small graph ran out of budget"),
        }
    }
    assert!(cycles > 50, "the graphs close cycles often enough to test ({cycles})");
}

#[test]
fn a_cycle_longer_than_the_budget_is_not_claimed() {
    // o0 holds k0; o(i+1) holds k(i+1) and waits for k(i); the new wait: o0 for k(n).
    let n = MAX_STEPS;
    let mut g = Map::default();
    for i in 0..=n {
        g = g.lock(&format!("k{i}"), &format!("o{i}"));
        if i > 0 {
            g = g.wait(&format!("o{i}"), &format!("k{}", i - 1), Wants::Lock);
        }
    }
    let key = format!("k{n}");
    assert_eq!(find_cycle(&mut g, b"o0", key.as_bytes(), Wants::Lock), Found::OverBudget);
    // The same shape, short: found.
    let mut g = Map::default().lock("k0", "o0").lock("k1", "o1").lock("k2", "o2");
    g = g.wait("o1", "k0", Wants::Lock).wait("o2", "k1", Wants::Lock);
    assert!(
        matches!(find_cycle(&mut g, b"o0", b"k2", Wants::Lock), Found::Cycle(c) if c.len() == 3)
    );
}

#[test]
fn blockers_leave_the_waiter_out_and_follow_each_mode() {
    let rw = Holders::Rw {
        write: false,
        writer: None,
        readers: vec![(b"me".to_vec(), 1), (b"r".to_vec(), 2)],
    };
    let write: Vec<&[u8]> = blockers(&rw, b"me", Wants::Write).iter().map(|b| b.owner).collect();
    assert_eq!(write, [b"r".as_slice()]);
    assert!(blockers(&rw, b"x", Wants::Read).is_empty());
    let w =
        Holders::Rw { write: true, writer: Some(b"w".to_vec()), readers: vec![(b"w".to_vec(), 1)] };
    let read: Vec<&[u8]> = blockers(&w, b"x", Wants::Read).iter().map(|b| b.owner).collect();
    assert_eq!(read, [b"w".as_slice()], "the writer once, its own reads not again");
    assert!(blockers(&Holders::Lock(vec![b"a".to_vec()]), b"a", Wants::Lock).is_empty());
}

#[test]
fn the_text_is_escaped_and_bounded() {
    let odd = link("o\r\nw ner\0", "k\r\n", "h");
    let text = describe(&[odd.clone(), link("h", "k2", "o\r\nw ner\0")]);
    assert_eq!(
        text,
        "DEADLOCK this wait would close a cycle: o\\x0d\\x0aw\\x20ner\\x00 waits for k\\x0d\\x0a \
         held by h; h waits for k2 held by o\\x0d\\x0aw\\x20ner\\x00"
    );
    let long: Vec<Link> = (0..100).map(|i| link(&"o".repeat(100), &format!("k{i}"), "h")).collect();
    let text = describe(&long);
    assert!(text.len() < 1_200 && text.ends_with("; ..."), "{}", text.len());
    assert!(!text.contains('\r') && !text.contains('\n'));
}
