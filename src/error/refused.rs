//! The replica guard's refusals ([`Refused`], re-exported as `replicas::Refused`): which rule
//! refused, its name in `INFO rlock`, and its three `NOREPLICAS` replies (to a grant, to a
//! give-back of counted permits, to a change of a semaphore's count). The error floor owns them, so that [`super::LockError`]
//! carries a refusal without reaching up into the guard, which imports them from here.

/// Which rule of the guard refused a grant: named in the `NOREPLICAS` reply and in `INFO
/// rlock` (`rlock_guard_refuses`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Fewer replicas in sync (online, lag within `rlock.replica-max-lag`) than required at
    /// the last check (`rlock.min-replicas`; auto: one, once one has been online).
    TooFewReplicas,
    /// The quarantine after a stall: a gap between two checks over the stall threshold
    /// (`rlock.stall-ms`), during which only acknowledgements sent after it count.
    StallQuarantine,
    /// No recent check: none since this server became master (or loaded the module), or the
    /// last one is older than its validity (the server stalled just now, its cron has not run
    /// since).
    NoRecentCheck,
    /// Too few replicas in sync, the replica being required only because the file
    /// `rlock-had-replicas` in the server's working directory says this master has had replicas
    /// (no replica has been online since the module loaded).
    HadReplicasFile,
    /// The quarantine after a restart: a master that loaded with the file `rlock-had-replicas`
    /// present (it crashed or was restarted while it had replicas) grants nothing for as long
    /// as after a stall, counted from its first check: the group may be failing it over
    /// meanwhile.
    RestartQuarantine,
    /// After a restart, fewer replicas in sync than were online before it (the count in the
    /// file `rlock-had-replicas`), though the setting's own rule is met: a missing one may have
    /// been promoted.
    ReplicasBeforeRestart,
}

/// Both `NOREPLICAS` replies of each rule from one table: the rule's reason (and what the
/// caller can do) after what this master refuses, a grant or a give-back of counted permits.
macro_rules! refusal_texts {
    ($($rule:ident => $reason:literal,)*) => {
        impl Refused {
            /// The `NOREPLICAS` reply to a grant (an acquire, a renewal) this rule refuses.
            #[must_use]
            pub const fn message(self) -> &'static str {
                match self {
                    $(Self::$rule => concat!("NOREPLICAS this master grants no lock: ", $reason),)*
                }
            }

            /// The `NOREPLICAS` reply to a give-back of counted permits (`RSEM.RELEASE key
            /// permits`, `RLOCK.CANCEL` of a counted grant) this rule refuses: counted permits
            /// have no lease, so one given back here and lost with this master's data (it is
            /// replaced, and its writes thrown away when it is demoted) would be lost for good.
            #[must_use]
            pub const fn give_back_message(self) -> &'static str {
                match self {
                    $(Self::$rule => concat!(
                        "NOREPLICAS this master gives back no permits (a give-back here would be lost if it has been replaced): ",
                        $reason
                    ),)*
                }
            }

            /// The `NOREPLICAS` reply to a change of a semaphore's count (`RSEM.ADDPERMITS`,
            /// `RSEM.SETPERMITS`) this rule refuses: made here and lost with this master's
            /// data, permits added would be missing for good, and permits taken away would be
            /// back (more than the semaphore's total).
            #[must_use]
            pub const fn count_message(self) -> &'static str {
                match self {
                    $(Self::$rule => concat!(
                        "NOREPLICAS this master changes no permit count (a change here would be lost if it has been replaced): ",
                        $reason
                    ),)*
                }
            }
        }
    };
}

// Every text of the guard's refusal is here.
refusal_texts! {
    TooFewReplicas => "too few of its replicas are in sync (rlock.min-replicas, rlock.replica-max-lag); it may have been replaced, retry on the current master",
    StallQuarantine => "it stalled for longer than rlock.stall-ms and is in quarantine until its replicas acknowledge again; it may have been replaced, retry on the current master",
    NoRecentCheck => "its replicas were not checked recently (it stalled, or became master just now); it may have been replaced, retry on the current master",
    HadReplicasFile => "the file rlock-had-replicas in its working directory (INFO rlock: rlock_had_replicas_file) says it has had replicas, and none is in sync (rlock.min-replicas -1); it may have been replaced, retry on the current master, or delete the file (or set rlock.min-replicas 0) to run it standalone",
    RestartQuarantine => "it restarted as a master that had replicas (the file rlock-had-replicas in its working directory) and is in quarantine for rlock.replica-max-lag + 1.5 s; it may have been replaced, retry on the current master",
    ReplicasBeforeRestart => "it restarted, and fewer of its replicas are in sync than were online before (the file rlock-had-replicas in its working directory, INFO rlock: rlock_replicas_before_restart); a missing one may have been promoted, retry on the current master, or delete the file (or set rlock.min-replicas 0) once it is known not to be",
}

impl Refused {
    /// The rule's name in `INFO rlock`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::TooFewReplicas => "too_few_replicas",
            Self::StallQuarantine => "stall_quarantine",
            Self::NoRecentCheck => "no_recent_check",
            Self::HadReplicasFile => "had_replicas_file",
            Self::RestartQuarantine => "restart_quarantine",
            Self::ReplicasBeforeRestart => "replicas_before_restart",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::LockError;

    const EVERY_RULE: [Refused; 6] = [
        Refused::TooFewReplicas,
        Refused::StallQuarantine,
        Refused::NoRecentCheck,
        Refused::HadReplicasFile,
        Refused::RestartQuarantine,
        Refused::ReplicasBeforeRestart,
    ];

    #[test]
    fn a_refused_give_back_says_so_with_the_reason_of_the_refused_grant() {
        for rule in EVERY_RULE {
            let grant = rule.message().strip_prefix("NOREPLICAS this master grants no lock: ");
            let give_back = rule.give_back_message().strip_prefix(
                "NOREPLICAS this master gives back no permits (a give-back here would be lost if it has been replaced): ",
            );
            let count = rule.count_message().strip_prefix(
                "NOREPLICAS this master changes no permit count (a change here would be lost if it has been replaced): ",
            );
            assert!(grant.is_some_and(|reason| reason.len() > 20), "{rule:?}");
            assert_eq!(give_back, grant, "{rule:?}");
            assert_eq!(count, grant, "{rule:?}");
        }
    }

    #[test]
    fn each_refusal_names_its_rule() {
        for rule in EVERY_RULE {
            let text = LockError::NoReplicas(rule).message();
            assert!(text.starts_with("NOREPLICAS "), "{text}");
            assert!(!rule.name().is_empty());
        }
        assert!(Refused::StallQuarantine.message().contains("rlock.stall-ms"));
        assert!(Refused::TooFewReplicas.message().contains("rlock.min-replicas"));
    }
}
