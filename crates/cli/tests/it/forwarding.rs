//! Any node accepts appends: a follower forwards them to the leader (the request is decoded
//! from its own bytes on the follower, then re-sent whole), and the writer gets the sequence
//! numbers the leader assigned.

use std::time::Duration;

use gyre_control::{ClusterClient, ControlNode, NodeOptions};
use gyre_event::{Event, EventBody, Timestamp};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

#[test]
fn a_follower_forwards_appends_to_the_leader() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut options = Vec::new();
        for id in 1..=3u64 {
            let listen = format!("127.0.0.1:{}", free_port())
                .parse()
                .expect("address");
            options.push(NodeOptions::new(
                id,
                dir.path().join(format!("node-{id}")),
                listen,
            ));
        }
        let mut nodes = Vec::new();
        for node in &options {
            nodes.push(ControlNode::start(node.clone()).await.expect("node starts"));
        }
        let addresses: Vec<String> = options.iter().map(|o| o.listen.to_string()).collect();
        let members = options
            .iter()
            .map(|o| (o.id, o.listen.to_string()))
            .collect();
        let mut client = ClusterClient::new(&addresses.join(",")).expect("client");
        client.retry_deadline = Duration::from_secs(30);
        client
            .initialize(&addresses[0], &members)
            .await
            .expect("cluster initialised");
        let (first, _) = client
            .append(&[Event::new(Timestamp::ZERO, EventBody::Tick)])
            .await
            .expect("the cluster serves");

        let status = client.status_of(&addresses[0]).await.expect("status");
        assert!(
            addresses.contains(&status.leader_address),
            "the leader {:?} is one of {addresses:?}",
            status.leader_address
        );
        let follower = addresses
            .iter()
            .find(|address| **address != status.leader_address)
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
        assert!(index > first[0].index, "committed after the first append");
        for (position, sequence) in sequences.iter().enumerate() {
            assert_eq!(sequence.index, index, "one batch, one entry");
            assert_eq!(sequence.position as usize, position);
        }
        for node in nodes {
            node.shutdown().await.expect("shutdown");
        }
    });
}
