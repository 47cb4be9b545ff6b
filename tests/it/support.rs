//! Helpers shared by the process tests: run the `gyre` binary and capture its output.

use std::io::{Read, Write};
use std::process::Command;

/// The runtime the in-process tests drive their clusters and proxies on: two workers, like
/// this host's two cores.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Run `gyre ARGS` and return (exit code, stdout, stderr).
pub fn gyre(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(args)
        .output()
        .expect("gyre runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8(output.stdout).expect("stdout is UTF-8"),
        String::from_utf8(output.stderr).expect("stderr is UTF-8"),
    )
}

/// A three-node control cluster of in-process `ControlNode`s on loopback, initialised and
/// serving (one `Tick` committed).
pub struct InProcessCluster {
    pub _dir: tempfile::TempDir,
    pub nodes: Vec<gyre_control::ControlNode>,
    /// Each node's address, in node-id order.
    pub addresses: Vec<String>,
    /// A client for all three, retrying for up to 30 s.
    pub client: gyre_control::ClusterClient,
    /// The log index of the first committed `Tick`.
    pub first_index: u64,
    /// What each node was started with (a restart reuses it: same data dir and address).
    pub options: Vec<gyre_control::NodeOptions>,
}

impl InProcessCluster {
    pub async fn start() -> InProcessCluster {
        Self::start_with(|_| {}).await
    }

    /// [`InProcessCluster::start`] with each node's options adjusted by `configure`.
    pub async fn start_with(
        configure: impl Fn(&mut gyre_control::NodeOptions),
    ) -> InProcessCluster {
        use gyre_control::{ClusterClient, ControlNode, NodeOptions};
        use gyre_event::{Event, EventBody, Timestamp};
        let free_port = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|listener| listener.local_addr())
                .expect("a free port")
                .port()
        };
        let dir = tempfile::tempdir().expect("temp dir");
        let options: Vec<NodeOptions> = (1..=3u64)
            .map(|id| {
                let listen = format!("127.0.0.1:{}", free_port())
                    .parse()
                    .expect("address");
                let mut options =
                    NodeOptions::new(id, dir.path().join(format!("node-{id}")), listen);
                configure(&mut options);
                options
            })
            .collect();
        let mut options = options;
        let mut nodes = Vec::new();
        for node in &mut options {
            // The free port was released before the node binds it: another process (or a
            // connection's ephemeral port) may take it meanwhile, so a bind failure picks again.
            let mut attempts = 0;
            let started = loop {
                match ControlNode::start(node.clone()).await {
                    Ok(started) => break started,
                    Err(error) if attempts < 5 => {
                        attempts += 1;
                        eprintln!(
                            "node {} could not start on {}: {error}; another port",
                            node.id, node.listen
                        );
                        node.listen = format!("127.0.0.1:{}", free_port())
                            .parse()
                            .expect("address");
                    }
                    Err(error) => panic!("node {} starts: {error}", node.id),
                }
            };
            nodes.push(started);
        }
        let addresses: Vec<String> = options.iter().map(|o| o.listen.to_string()).collect();
        let members = options
            .iter()
            .map(|o| (o.id, o.listen.to_string()))
            .collect();
        let mut client = ClusterClient::new(&addresses.join(",")).expect("client");
        client.retry_deadline = std::time::Duration::from_secs(30);
        client
            .initialize(&addresses[0], &members)
            .await
            .expect("cluster initialised");
        let (first, _) = client
            .append(&[Event::new(Timestamp::ZERO, EventBody::Tick)])
            .await
            .expect("the cluster serves");
        InProcessCluster {
            _dir: dir,
            nodes,
            addresses,
            client,
            first_index: first[0].index,
            options,
        }
    }

    /// Stops every node and starts each again on its data directory (each restores its newest
    /// snapshot, then replays the log after it).
    pub async fn restart_all(&mut self) {
        for node in std::mem::take(&mut self.nodes) {
            node.shutdown().await.expect("shutdown");
        }
        for options in &self.options {
            self.nodes.push(
                gyre_control::ControlNode::start(options.clone())
                    .await
                    .expect("node restarts"),
            );
        }
    }

    pub async fn shutdown(self) {
        for node in self.nodes {
            node.shutdown().await.expect("shutdown");
        }
    }

    /// The id of the node that is leader by its own account (polled for up to 30 s: right
    /// after the start a node can still be voting, or a loaded host can hold an election).
    pub async fn leader_id(&self) -> u64 {
        use gyre_log::raft::openraft::ServerState;
        tokio::time::timeout(std::time::Duration::from_secs(30), async {
            loop {
                for node in &self.nodes {
                    if node.raft.raft.metrics().borrow().state == ServerState::Leader {
                        return node.id;
                    }
                }
                let mut metrics = self.nodes[0].raft.raft.metrics();
                // Any change of node 1's view (a vote, a new leader) is a reason to look again;
                // the bound keeps a change on another node from being missed for long.
                let _ =
                    tokio::time::timeout(std::time::Duration::from_millis(50), metrics.changed())
                        .await;
            }
        })
        .await
        .expect("a node leads within 30 s")
    }

    /// Commits enough `Tick`s for nodes that snapshot every few entries (and keep none behind)
    /// to snapshot past `index`, and waits (up to 60 s) until every node has purged its log
    /// past it.
    pub async fn purge_past(&self, index: u64) {
        use gyre_event::{Event, EventBody, Timestamp};
        let mut client = self.client.clone();
        for _ in 0..12 {
            client
                .append(&[Event::new(Timestamp::ZERO, EventBody::Tick)])
                .await
                .expect("a tick commits");
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let purged: Vec<u64> = client
                .status_all()
                .await
                .into_iter()
                .map(|(_, reply)| reply.map_or(0, |reply| reply.purged_index))
                .collect();
            if purged.iter().all(|purged| *purged >= index) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the nodes did not purge past {index}: {purged:?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Commits a `Tick` and waits until every node has applied it (so each node's projection
    /// holds everything acknowledged before).
    pub async fn every_node_applied(&self) {
        use gyre_event::{Event, EventBody, Timestamp};
        let mut client = self.client.clone();
        let (last, _) = client
            .append(&[Event::new(Timestamp::ZERO, EventBody::Tick)])
            .await
            .expect("append");
        let last = last[0].index;
        for node in &self.nodes {
            let mut metrics = node.raft.raft.metrics();
            tokio::time::timeout(std::time::Duration::from_secs(60), async {
                while metrics.borrow().last_applied.map_or(0, |id| id.index) < last {
                    metrics.changed().await.expect("metrics");
                }
            })
            .await
            .expect("every node applies the records");
        }
    }
}

/// One HTTP/1.1 request, `Connection: close`; returns (status, body).
pub fn http(
    address: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(address).expect("proxy accepts");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {address}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("an HTTP response: {response}"));
    let body = response
        .split_once("\r\n\r\n")
        .map_or("", |(_, body)| body)
        .to_string();
    (status, body)
}

/// How long a `gyre proxy` may take to print its next line (startup, recovery from a log or a
/// quorum) before the test fails instead of hanging.
pub const PROXY_LINE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);

/// A `gyre proxy` process: the child, its stdout lines after the `listening` one (read on a
/// thread, so a stuck proxy fails the test at [`PROXY_LINE_DEADLINE`]), and the address it
/// listens on (`host:port`).
pub struct ProxyProcess {
    pub child: std::process::Child,
    lines: std::sync::mpsc::Receiver<std::io::Result<String>>,
    pub address: String,
}

impl ProxyProcess {
    /// Starts `gyre proxy ARGS` (stdout piped, stderr inherited) and reads its first line.
    pub fn start(args: &[&str]) -> ProxyProcess {
        use std::io::BufRead;
        let mut child = Command::new(env!("CARGO_BIN_EXE_gyre"))
            .arg("proxy")
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("gyre proxy starts");
        let stdout = child.stdout.take().expect("stdout");
        let (sender, lines) = std::sync::mpsc::channel();
        // Ends with the child's stdout (or when the test dropped the receiver).
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let mut proxy = ProxyProcess {
            child,
            lines,
            address: String::new(),
        };
        let line = proxy.next_line();
        let listening: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|_| panic!("a JSON line: {line}"));
        proxy.address = listening["listening"]
            .as_str()
            .unwrap_or_else(|| panic!("the first line says where it listens: {line}"))
            .trim_start_matches("http://")
            .to_string();
        proxy
    }

    /// The next stdout line; panics (killing the child on drop) if none comes in
    /// [`PROXY_LINE_DEADLINE`] or stdout closed.
    fn next_line(&mut self) -> String {
        match self.lines.recv_timeout(PROXY_LINE_DEADLINE) {
            Ok(line) => line.expect("stdout"),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!(
                "gyre proxy printed no line in {} s",
                PROXY_LINE_DEADLINE.as_secs()
            ),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                panic!(
                    "gyre proxy closed its stdout (exited: {:?})",
                    self.child.try_wait()
                )
            }
        }
    }

    /// The next stdout line, as JSON.
    pub fn next_json(&mut self) -> serde_json::Value {
        let line = self.next_line();
        serde_json::from_str(&line).unwrap_or_else(|_| panic!("a JSON line: {line}"))
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// SIGKILL: no graceful stop, nothing flushed that was not already durable.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `command` to its end like [`Command::output`], but kills it and fails the test if it
/// runs longer than `limit` (a harness CLI whose model stream stalled retries for many minutes
/// instead of failing). stdin is null, as with `output`; stdout and stderr are read on threads
/// so a chatty child cannot block.
pub fn output_within(command: &mut Command, limit: std::time::Duration) -> std::process::Output {
    use wait_timeout::ChildExt;
    let mut child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the command starts");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stdout.read_to_end(&mut bytes);
        bytes
    });
    let err = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stderr.read_to_end(&mut bytes);
        bytes
    });
    let status = match child.wait_timeout(limit).expect("waiting for the command") {
        Some(status) => status,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = err.join().unwrap_or_default();
            panic!(
                "{command:?} ran longer than {} s and was killed; stderr: {}",
                limit.as_secs(),
                String::from_utf8_lossy(&stderr)
            );
        }
    };
    std::process::Output {
        status,
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

/// A proxy's record sink that keeps the log in memory (in-process proxies).
#[derive(Default)]
pub struct MemorySink {
    pub events: std::sync::Mutex<Vec<gyre_event::Event>>,
    /// The next commit fails (as a full disk would), keeping nothing of its batch.
    pub fail_next: std::sync::atomic::AtomicBool,
    /// Stored responses and thread turns are read back from it, as from an event file (off:
    /// a sink that cannot read back).
    pub reads_back: std::sync::atomic::AtomicBool,
}

impl MemorySink {
    /// The model-call records committed so far, in order.
    pub fn records(&self) -> Vec<gyre_event::ModelCallRecord> {
        self.events
            .lock()
            .expect("sink lock")
            .iter()
            .filter_map(|event| match &event.body {
                gyre_event::EventBody::ModelCall(record) => Some((**record).clone()),
                _ => None,
            })
            .collect()
    }
}

impl gyre_proxy::server::RecordSink for MemorySink {
    fn commit(
        &self,
        events: Vec<gyre_event::Event>,
    ) -> futures_util::future::BoxFuture<'static, Result<(), gyre_proxy::server::CommitFailure>>
    {
        if self
            .fail_next
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            return Box::pin(async {
                Err(gyre_proxy::server::CommitFailure::of("the disk is full"))
            });
        }
        self.events.lock().expect("sink lock").extend(events);
        Box::pin(async { Ok(()) })
    }

    fn describe(&self) -> String {
        "memory".into()
    }

    fn stored_responses(
        &self,
        execution: u64,
        _holding: &str,
    ) -> futures_util::future::BoxFuture<
        'static,
        Result<Vec<gyre_event::StoredResponseRecord>, String>,
    > {
        let records = if self.reads_back.load(std::sync::atomic::Ordering::SeqCst) {
            self.events
                .lock()
                .expect("sink lock")
                .iter()
                .filter_map(|event| match &event.body {
                    gyre_event::EventBody::ResponseStored(record)
                        if record.execution.get() == execution =>
                    {
                        Some((**record).clone())
                    }
                    _ => None,
                })
                .collect()
        } else {
            Vec::new()
        };
        Box::pin(async move { Ok(records) })
    }
}
