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
        }
    }

    pub async fn shutdown(self) {
        for node in self.nodes {
            node.shutdown().await.expect("shutdown");
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

/// A `gyre proxy` process: the child, its stdout lines after the `listening` one, and the
/// address it listens on (`host:port`).
pub struct ProxyProcess {
    pub child: std::process::Child,
    pub lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
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
        let mut lines = std::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        let line = lines
            .next()
            .expect("a line from gyre proxy")
            .expect("stdout");
        let listening: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|_| panic!("a JSON line: {line}"));
        let address = listening["listening"]
            .as_str()
            .unwrap_or_else(|| panic!("the first line says where it listens: {line}"))
            .trim_start_matches("http://")
            .to_string();
        ProxyProcess {
            child,
            lines,
            address,
        }
    }

    /// The next stdout line, as JSON.
    pub fn next_json(&mut self) -> serde_json::Value {
        let line = self
            .lines
            .next()
            .expect("a line from gyre proxy")
            .expect("stdout");
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
