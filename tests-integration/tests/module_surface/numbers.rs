//! Number errors: in Redis's terms, each naming only its own argument, changing nothing.

use rlock_tests_integration::{cmd, digest, run_str, Server};

// ---- number errors ------------------------------------------------------------------------------

const MAX: &str = "9223372036854775807";

#[test]
fn integer_arguments_say_what_is_wrong_and_name_only_themselves() {
    let server = Server::start();
    let mut con = server.conn();
    let big = "99999999999999999999";
    let lease_range = format!("ERR lease-ms is out of range (1 to {MAX})");
    let timeout_range = format!("ERR timeout-ms is out of range (0 to {MAX})");
    let permits_range = format!("ERR permits is out of range (1 to {MAX})");
    let set_range = format!("ERR permits is out of range (0 to {MAX})");
    let delta_range = format!("ERR delta is out of range (-9223372036854775808 to {MAX})");
    let lease_positive = "ERR lease-ms must be positive";
    let lease_not_int = "ERR lease-ms is not an integer";
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["RLOCK.ACQUIRE", "L", "a", big], &lease_range),
        (vec!["RLOCK.ACQUIRE", "L", "a", "9223372036854775808"], &lease_range),
        (vec!["RLOCK.ACQUIRE", "L", "a", "0"], lease_positive),
        (vec!["RLOCK.ACQUIRE", "L", "a", "-5"], lease_positive),
        (vec!["RLOCK.ACQUIRE", "L", "a", "-99999999999999999999"], lease_positive),
        (vec!["RLOCK.ACQUIRE", "L", "a", "abc"], lease_not_int),
        (vec!["RLOCK.ACQUIRE", "L", "a", "1.5"], lease_not_int),
        (vec!["RLOCK.ACQUIRE", "L", "a", "010"], lease_not_int),
        (vec!["RLOCK.ACQUIRE", "L", "a", "+1"], lease_not_int),
        (vec!["RLOCK.ACQUIRE", "L", "a", "-0"], lease_not_int),
        (vec!["RLOCK.ACQUIRE", "L", "a", ""], lease_not_int),
        (vec!["RLOCK.RELEASE", "L", "a", "0"], lease_positive),
        (vec!["RLOCK.RENEW", "L", "a", big], &lease_range),
        (vec!["RWLOCK.ACQUIRE", "R", "a", "READ", "0"], lease_positive),
        (vec!["RWLOCK.RENEW", "R", "a", "x"], lease_not_int),
        (vec!["RSEM.ACQUIRE", "S", "1", "LEASE", "0"], lease_positive),
        (vec!["RSEM.ACQUIRE", "S", "1", "LEASE"], "ERR lease-ms is missing after LEASE"),
        (vec!["RSEM.RENEW", "S", "id", big], &lease_range),
        (
            vec!["RLOCK.ACQUIRE", "L", "a", "10", "WAIT", "-1"],
            "ERR timeout-ms must not be negative",
        ),
        (vec!["RLOCK.ACQUIRE", "L", "a", "10", "WAIT", "x"], "ERR timeout-ms is not an integer"),
        (vec!["RLOCK.ACQUIRE", "L", "a", "10", "WAIT", big], &timeout_range),
        (vec!["RLOCK.ACQUIRE", "L", "a", "10", "WAIT"], "ERR timeout-ms is missing after WAIT"),
        (
            vec!["RWLOCK.ACQUIRE", "R", "a", "WRITE", "10", "WAIT", "-1"],
            "ERR timeout-ms must not be negative",
        ),
        (vec!["RSEM.ACQUIRE", "S", "1", "WAIT", big], &timeout_range),
        (vec!["RSEM.ACQUIRE", "S", "0"], "ERR permits must be positive"),
        (vec!["RSEM.ACQUIRE", "S", "-1"], "ERR permits must be positive"),
        (vec!["RSEM.ACQUIRE", "S", "x"], "ERR permits is not an integer"),
        (vec!["RSEM.ACQUIRE", "S", big], &permits_range),
        (vec!["RSEM.RELEASE", "S", "0"], "ERR permits must be positive"),
        (vec!["RSEM.RELEASE", "S", big], &permits_range),
        (vec!["RSEM.SETPERMITS", "S", "-1"], "ERR permits must not be negative"),
        (vec!["RSEM.SETPERMITS", "S", big], &set_range),
        (vec!["RSEM.SETPERMITS", "S", "1.5"], "ERR permits is not an integer"),
        (vec!["RSEM.ADDPERMITS", "S", "1.5"], "ERR delta is not an integer"),
        (vec!["RSEM.ADDPERMITS", "S", big], &delta_range),
        (vec!["RSEM.ADDPERMITS", "S", "-99999999999999999999"], &delta_range),
        // Ids: each names the argument as the command's syntax does.
        (vec!["RLOCK.CANCEL", "L", ""], "ERR id must not be empty"),
        (vec!["RSEM.RENEW", "S", "", "10"], "ERR id must not be empty"),
        (vec!["RSEM.RELEASE", "S", "ID"], "ERR permit id is missing after ID"),
        (vec!["RSEM.RELEASE", "S", "ID", ""], "ERR permit id (after ID) must not be empty"),
        (
            vec!["RLOCK.ACQUIRE", "L", "a", "10", "REQUEST"],
            "ERR request id is missing after REQUEST",
        ),
        (
            vec!["RLOCK.ACQUIRE", "L", "a", "10", "REQUEST", ""],
            "ERR request id (after REQUEST) must not be empty",
        ),
    ];
    cmd(&mut con, &["SET", "unrelated", "1"]);
    let before = digest(&mut con);
    for (args, expected) in &cases {
        assert_eq!(run_str(&mut con, args), Err((*expected).to_owned()), "{args:?}");
    }
    assert_eq!(digest(&mut con), before, "an error changed something");
    // No error names another command (RSEM.ACQUIRE S 0 named RSEM.SETPERMITS).
    for (args, expected) in &cases {
        for other in ["RLOCK.", "RWLOCK.", "RSEM."] {
            assert!(!expected.contains(other), "{args:?}: {expected}");
        }
    }
}
