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
