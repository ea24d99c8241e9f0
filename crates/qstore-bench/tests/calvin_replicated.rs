//! Calvin replicated through each replica group's raft log, end to end on an embedded
//! cluster: every cluster instance runs the same sequenced epochs, so every copy of every
//! partition ends equal to the serial replay of the history; and an instance that lost a
//! server is rebuilt from another's copies once the server is back.

mod common;

use common::{every_copy_checked, failed_over, rebuilt, small, verified};
use qstore_core::config::CalvinLocks;
use qstore_core::RunConfig;

fn config(workload: &str, factor: u32, locks: CalvinLocks) -> RunConfig {
    let mut c = small("calvin", workload);
    c.protocol.calvin.locks = locks;
    c.replication.factor = factor;
    c
}

#[test]
fn every_copy_reaches_the_oracle_state_on_every_workload() {
    let cases = [
        ("ycsb", 2, CalvinLocks::LockTable),
        ("ycsb", 3, CalvinLocks::Vll),
        ("bank", 3, CalvinLocks::LockTable),
        ("append", 3, CalvinLocks::LockTable),
        ("append", 2, CalvinLocks::Vll),
    ];
    for (workload, factor, locks) in cases {
        let cfg = config(workload, factor, locks);
        let case = format!("{workload} rf {factor} {locks:?}");
        let (v, _) = verified(&cfg);
        every_copy_checked(&v, &cfg, &case);
    }
}

/// Calvin's fail-over: one server of instance 0 is cut off mid-run (a group leader: instance
/// 0's members lead at start). Its group elects another leader; the other nodes of its
/// instance see it stall, take it out of service and hand their groups over; clients
/// resubmit what was lost. Every transaction is answered, the two instances in service end
/// with equal copies that match the serial replay, and no element is appended twice (a
/// resubmitted transaction ran once).
#[test]
fn a_cut_off_leader_is_replaced_and_nothing_is_lost_or_run_twice() {
    for (server, seed) in [(1, 1), (2, 2)] {
        let mut cfg = config("append", 3, CalvinLocks::LockTable);
        cfg.seed = seed;
        cfg.client.txns = 0;
        cfg.client.duration_s = 3.0;
        cfg.net.cut_off_node = Some(server);
        cfg.net.cut_off_after_ms = 800;
        let (v, _) = failed_over(&cfg);
        assert!(matches!(v.invariants, Some(Ok(_))));
    }
}

/// A server cut off for a while and then back (a rebooted machine): its instance goes out of
/// service at once (a leader's, whose groups move to other instances, or a follower's), and
/// once the server is back the instance is rebuilt from another instance's copies, after an
/// epoch the leader of group 0 marks, and serves again: every copy of every partition ends
/// equal to the serial replay, and no element is appended twice.
#[test]
fn a_server_that_comes_back_has_its_instance_rebuilt_from_copies() {
    for (server, workload, seed) in [(1, "append", 1), (7, "bank", 2), (3, "append", 3)] {
        let mut cfg = config(workload, 3, CalvinLocks::LockTable);
        cfg.seed = seed;
        cfg.client.txns = 0;
        cfg.client.duration_s = 4.0;
        cfg.net.cut_off_node = Some(server);
        cfg.net.cut_off_after_ms = 800;
        cfg.net.cut_off_for_ms = 600;
        rebuilt(&cfg, server);
    }
}
