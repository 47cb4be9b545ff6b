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

/// An event of `bytes` bytes as a log entry, about (an engine-down reason of that length).
fn event_of(bytes: usize) -> Event {
    Event::new(
        Timestamp::ZERO,
        EventBody::EngineDown {
            engine: gyre_event::EngineId(0),
            reason: "x".repeat(bytes),
        },
    )
}

/// One Raft entry must fit one AppendEntries message. An append larger than that is refused
/// before it is proposed, naming its size and the limit (an entry no follower can take was
/// re-sent on every heartbeat until the followers elected another leader, and the client's
/// retry carried it there: an election storm). The largest accepted append replicates.
#[test]
fn an_append_too_large_for_one_replication_message_is_refused_and_the_largest_replicates() {
    use gyre_control::ENTRY_BYTES_MAX;
    let runtime = crate::support::runtime();
    runtime.block_on(async {
        let mut cluster = InProcessCluster::start().await;
        match cluster
            .client
            .append(&[event_of(ENTRY_BYTES_MAX + 1)])
            .await
        {
            Err(gyre_control::ControlError::BadRequest(message)) => {
                assert!(
                    message.contains(&format!("at most {ENTRY_BYTES_MAX}")),
                    "{message}"
                );
            }
            other => panic!("expected a refusal naming the limit, got {other:?}"),
        }
        let (sequences, _) = cluster
            .client
            .append(&[event_of(ENTRY_BYTES_MAX - 1024)])
            .await
            .expect("the largest append commits");
        let index = sequences[0].index;
        // Committed on a quorum; every node applies it (a follower that could not take the
        // entry would never get there).
        for node in &cluster.nodes {
            let mut metrics = node.raft.raft.metrics();
            tokio::time::timeout(
                std::time::Duration::from_secs(60),
                metrics.wait_for(|metrics| {
                    metrics
                        .last_applied
                        .is_some_and(|applied| applied.index >= index)
                }),
            )
            .await
            .expect("every node applies the largest entry")
            .expect("metrics");
        }
        cluster.shutdown().await;
    });
}

/// The proposer coalesces appends that arrive together into one entry, but never past
/// `ENTRY_BYTES_MAX`: an append that would take the entry over it opens the next one.
#[test]
fn appends_arriving_together_are_split_where_one_entry_would_be_too_large() {
    use gyre_control::ENTRY_BYTES_MAX;
    let runtime = crate::support::runtime();
    runtime.block_on(async {
        let cluster = InProcessCluster::start_with(|options| {
            // Everything that arrives within 2 s joins one entry, up to any size.
            options.proposer.window = std::time::Duration::from_secs(2);
            options.proposer.bytes_max = usize::MAX;
        })
        .await;
        let half = ENTRY_BYTES_MAX / 2 + 1024;
        let mut first = cluster.client.clone();
        let mut second = cluster.client.clone();
        let (events_one, events_two) = ([event_of(half)], [event_of(half)]);
        let (one, two) = tokio::join!(first.append(&events_one), second.append(&events_two));
        let (one, two) = (one.expect("first commits"), two.expect("second commits"));
        assert_ne!(
            one.0[0].index, two.0[0].index,
            "two halves over the limit together are two entries"
        );
        cluster.shutdown().await;
    });
}

/// `--from INDEX.POSITION` skips the first POSITION events of entry INDEX only. When INDEX
/// holds no events (the leader's blank entry, a membership change), the entries after it are
/// streamed whole.
#[test]
fn a_subscription_position_counts_within_the_named_entry_only() {
    use gyre_control::pb;
    let runtime = crate::support::runtime();
    runtime.block_on(async {
        let mut cluster = InProcessCluster::start().await;
        let events: Vec<Event> = (0..3)
            .map(|_| Event::new(Timestamp::ZERO, EventBody::Tick))
            .collect();
        let (sequences, _) = cluster.client.append(&events).await.expect("appends");
        let index = sequences[0].index;
        // Entry 1 is the cluster's first membership: no events.
        let stream = cluster
            .client
            .subscribe(
                gyre_control::Sequence {
                    index: 1,
                    position: 2,
                },
                true,
            )
            .await
            .expect("subscribes");
        let entries = collect(stream).await;
        assert!(
            entries
                .iter()
                .any(|entry| entry.index == cluster.first_index),
            "the first appended entry is streamed"
        );
        for entry in &entries {
            assert_eq!(
                entry.first_position, 0,
                "entry {} follows the named one: streamed whole",
                entry.index
            );
        }
        // Within the named entry, the position skips events.
        let stream = cluster
            .client
            .subscribe(gyre_control::Sequence { index, position: 2 }, true)
            .await
            .expect("subscribes");
        let entries = collect(stream).await;
        assert_eq!(entries[0].index, index);
        assert_eq!(entries[0].first_position, 2);
        let events = gyre_log::decode_batch(&entries[0].batch).expect("decodes");
        assert_eq!(events.len(), 1, "the third of three events");
        cluster.shutdown().await;
    });

    async fn collect(mut stream: tonic::Streaming<pb::CommittedEntry>) -> Vec<pb::CommittedEntry> {
        let mut entries = Vec::new();
        while let Some(entry) = stream.message().await.expect("streams") {
            entries.push(entry);
        }
        entries
    }
}
