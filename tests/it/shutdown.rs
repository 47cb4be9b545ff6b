//! A control node stops promptly whatever its peers do. The last node of a quorum, left alone
//! with a write in flight that can never commit (no quorum), shuts down within a bound, and
//! the write is refused, never acknowledged. Before the fix, its shutdown waited forever for
//! the proposer's commit (`deploy/local/quorum.sh stop` timed out on the last node).

use std::time::Duration;

use gyre_control::ClusterClient;
use gyre_event::{Event, EventBody, Timestamp};

use crate::support::InProcessCluster;

#[test]
fn the_last_node_stops_with_a_write_in_flight() {
    let runtime = crate::support::runtime();
    runtime.block_on(async {
        let cluster = InProcessCluster::start().await;
        let leader = cluster.leader_id().await;
        let InProcessCluster {
            _dir,
            nodes,
            addresses,
            ..
        } = cluster;
        let mut leader_node = None;
        for node in nodes {
            if node.id == leader {
                leader_node = Some(node);
            } else {
                node.shutdown().await.expect("a follower stops");
            }
        }
        let leader_node = leader_node.expect("the leader is one of the nodes");
        let address = addresses[usize::try_from(leader - 1).unwrap()].clone();
        let before = leader_node.raft.raft.metrics().borrow().last_log_index;

        // A write the leader appends but can never commit.
        let mut client = ClusterClient::new(&address).expect("client");
        client.retry_deadline = Duration::from_secs(2);
        let write = tokio::spawn(async move {
            client
                .append(&[Event::new(Timestamp::ZERO, EventBody::Tick)])
                .await
        });
        leader_node
            .raft
            .raft
            .wait(Some(Duration::from_secs(20)))
            .metrics(
                |metrics| metrics.last_log_index > before,
                "the leader appends the write",
            )
            .await
            .expect("the write reaches the leader's log");

        tokio::time::timeout(Duration::from_secs(15), leader_node.shutdown())
            .await
            .expect("the last node stops within 15 s (its server drain is 5 s)")
            .expect("a clean shutdown");
        let outcome = tokio::time::timeout(Duration::from_secs(15), write)
            .await
            .expect("the writer hears back")
            .expect("the writer task");
        assert!(
            outcome.is_err(),
            "a write without a quorum is never acknowledged: {outcome:?}"
        );
    });
}
