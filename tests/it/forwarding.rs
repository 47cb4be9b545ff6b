//! Any node accepts appends: a follower forwards them to the leader (the request is decoded
//! from its own bytes on the follower, then re-sent whole), and the writer gets the sequence
//! numbers the leader assigned.

use gyre_control::ClusterClient;
use gyre_event::{Event, EventBody, Timestamp};

use crate::support::InProcessCluster;

#[test]
fn a_follower_forwards_appends_to_the_leader() {
    let runtime = crate::support::runtime();
    runtime.block_on(async {
        let cluster = InProcessCluster::start().await;
        let addresses = &cluster.addresses;
        let leader = cluster.leader_id().await;
        let leader_address = &addresses[usize::try_from(leader - 1).expect("id")];
        let follower = addresses
            .iter()
            .find(|address| *address != leader_address)
            .expect("a follower")
            .clone();
        // A client that knows only the follower.
        let mut through_follower = ClusterClient::new(&follower).expect("client");
        let events: Vec<Event> = (0..5)
            .map(|_| Event::new(Timestamp::ZERO, EventBody::Tick))
            .collect();
        let (sequences, refused) = through_follower
            .append(&events)
            .await
            .expect("the follower forwards to the leader");
        assert_eq!(sequences.len(), 5, "one sequence per event");
        assert!(refused.iter().all(String::is_empty), "{refused:?}");
        let index = sequences[0].index;
        assert!(
            index > cluster.first_index,
            "committed after the first append"
        );
        for (position, sequence) in sequences.iter().enumerate() {
            assert_eq!(sequence.index, index, "one batch, one entry");
            assert_eq!(sequence.position as usize, position);
        }
        cluster.shutdown().await;
    });
}

/// Reading "everything committed so far" (`gyre log tail` without `--follow`) is a
/// linearizable read: a follower refuses it (it can be a heartbeat behind what was
/// acknowledged, and a deposed leader cannot tell it was deposed without asking a quorum), the
/// leader serves it up to every entry committed before the request, and a client that knows
/// only a follower still gets the whole log from the leader.
#[test]
fn a_read_to_the_end_of_the_log_is_served_by_a_confirmed_leader_only() {
    use gyre_control::pb;
    use gyre_control::Sequence;

    let runtime = crate::support::runtime();
    runtime.block_on(async {
        let mut cluster = InProcessCluster::start().await;
        let leader = cluster.leader_id().await;
        let leader_address = cluster.addresses[usize::try_from(leader - 1).expect("id")].clone();
        let follower = cluster
            .addresses
            .iter()
            .find(|address| **address != leader_address)
            .expect("a follower")
            .clone();
        let events: Vec<Event> = (0..3)
            .map(|_| Event::new(Timestamp::ZERO, EventBody::Tick))
            .collect();
        let (sequences, _) = cluster.client.append(&events).await.expect("appends");
        let acknowledged = sequences[0].index;

        let request = pb::SubscribeRequest {
            from_index: 0,
            from_position: 0,
            stop_at_end: true,
        };
        let mut raw = pb::control_client::ControlClient::connect(format!("http://{follower}"))
            .await
            .expect("connects to the follower");
        let refused = raw
            .subscribe(request)
            .await
            .expect_err("a follower does not vouch for the end of the log");
        assert!(
            refused.message().contains("leader"),
            "the refusal names the reason: {refused:?}"
        );

        let mut raw =
            pb::control_client::ControlClient::connect(format!("http://{leader_address}"))
                .await
                .expect("connects to the leader");
        let stream = raw
            .subscribe(request)
            .await
            .expect("the leader serves it")
            .into_inner();
        let last = last_index(stream).await;
        assert!(
            last >= acknowledged,
            "ends at or after the acknowledged entry ({last} < {acknowledged})"
        );

        let mut through_follower = ClusterClient::new(&follower).expect("client");
        let stream = through_follower
            .subscribe(
                Sequence {
                    index: 0,
                    position: 0,
                },
                true,
            )
            .await
            .expect("the client finds the leader");
        let last = last_index(stream).await;
        assert!(
            last >= acknowledged,
            "ends at or after the acknowledged entry ({last} < {acknowledged})"
        );
        cluster.shutdown().await;
    });
}

/// The index of the last entry a subscription streams before it ends.
async fn last_index(mut stream: tonic::Streaming<gyre_control::pb::CommittedEntry>) -> u64 {
    let mut last = 0;
    while let Some(entry) = stream.message().await.expect("streams") {
        last = entry.index;
    }
    last
}
