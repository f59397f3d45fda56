//! Redis Cluster, the plain-Rust part: the hash slot of a key, and which node serves a slot,
//! read from `CLUSTER NODES` (Redis 7.0's module API has no slot-ownership call).

use std::collections::HashMap;

/// The number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16_384;

/// CRC16/XMODEM, as Redis Cluster uses for key slots.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

/// The hash slot of `key`: CRC16 of the key, or of its hash tag (the part between the first
/// `{` and the next `}`, when not empty), modulo 16384.
#[must_use]
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS
}

/// Who serves a slot, seen from this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotState {
    /// This node serves it.
    Mine,
    /// This node serves it but is migrating it to the node at this address.
    Migrating { to: String },
    /// Another node serves it.
    Moved { to: String },
    /// No node serves it.
    Unserved,
}

/// This node's view of slot ownership, from one `CLUSTER NODES` reply.
#[derive(Debug, Default)]
pub struct ClusterView {
    /// Slot ranges of every master, with its address (`ip:port`) and whether it is this node.
    ranges: Vec<(u16, u16, String, bool)>,
    /// Slots this node is migrating, with the target's address.
    migrating: HashMap<u16, String>,
}

impl ClusterView {
    /// Parses a `CLUSTER NODES` reply; lines it cannot read are skipped.
    #[must_use]
    pub fn parse(nodes: &str) -> Self {
        let mut addresses: HashMap<&str, String> = HashMap::new();
        let mut lines = Vec::new();
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                continue;
            }
            // "ip:port@cport[,hostname]" -> "ip:port"
            let address = fields[1].split(['@', ',']).next().unwrap_or("").to_owned();
            addresses.insert(fields[0], address);
            lines.push(fields);
        }
        let mut view = Self::default();
        for fields in &lines {
            let flags: Vec<&str> = fields[2].split(',').collect();
            if !flags.contains(&"master") || flags.contains(&"fail") {
                continue;
            }
            let me = flags.contains(&"myself");
            let address = addresses.get(fields[0]).cloned().unwrap_or_default();
            for slot in &fields[8..] {
                if let Some(inner) = slot.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
                    // "[slot->-target]" (migrating out) or "[slot-<-source]" (importing).
                    if let Some((s, target)) = inner.split_once("->-") {
                        if let (true, Ok(s), Some(to)) = (me, s.parse(), addresses.get(target)) {
                            view.migrating.insert(s, to.clone());
                        }
                    }
                    continue;
                }
                let (start, end) = slot.split_once('-').unwrap_or((slot, slot));
                if let (Ok(start), Ok(end)) = (start.parse(), end.parse()) {
                    view.ranges.push((start, end, address.clone(), me));
                }
            }
        }
        view
    }

    /// Who serves `slot`.
    #[must_use]
    pub fn slot_state(&self, slot: u16) -> SlotState {
        let owner = self.ranges.iter().find(|(start, end, _, _)| (*start..=*end).contains(&slot));
        match owner {
            Some((.., true)) => match self.migrating.get(&slot) {
                Some(to) => SlotState::Migrating { to: to.clone() },
                None => SlotState::Mine,
            },
            Some((_, _, to, false)) => SlotState::Moved { to: to.clone() },
            None => SlotState::Unserved,
        }
    }

    /// The error a client waiting on a key of `slot` gets when this node cannot grant it
    /// (`None`: it can), in Redis Cluster's own redirection forms.
    #[must_use]
    pub fn redirect(&self, slot: u16, key_here: bool) -> Option<String> {
        match self.slot_state(slot) {
            SlotState::Mine => None,
            SlotState::Migrating { .. } if key_here => None,
            SlotState::Migrating { to } => Some(format!("ASK {slot} {to}")),
            SlotState::Moved { to } => Some(format!("MOVED {slot} {to}")),
            SlotState::Unserved => Some("CLUSTERDOWN Hash slot not served".to_owned()),
        }
    }
}
