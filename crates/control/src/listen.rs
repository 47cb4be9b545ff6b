//! TCP listeners for Gyre's servers (the control node's gRPC, the proxy, the engine fakes).
//!
//! `std` and mio (`tokio::net::TcpListener::bind`) listen with a backlog of 128 pending
//! connections. A burst of hundreds of clients connecting at once (384 harnesses reaching the
//! proxy, 256 writers reaching a control node) overflowed it while the runtime was busy: the
//! kernel then answers with SYN cookies, and a connection whose handshake completes while the
//! accept queue is still full is reset on its first data ("Connection reset by peer", with
//! "Possible SYN flooding" in the kernel log). Gyre's listeners ask for [`LISTEN_BACKLOG`]; the
//! kernel caps it at `net.core.somaxconn` (4096 on current Linux).

use std::io;
use std::net::SocketAddr;

/// Pending connections a Gyre listener queues before it accepts them.
pub const LISTEN_BACKLOG: u32 = 4096;

/// Binds `address` (port 0: any free port) with address reuse and [`LISTEN_BACKLOG`]. Must be
/// called inside a tokio runtime.
pub fn bind_listener(address: SocketAddr) -> io::Result<tokio::net::TcpListener> {
    let socket = match address {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(LISTEN_BACKLOG)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// More simultaneous connections than std's backlog of 128 (600), none accepted until all
    /// have connected and written: every one is accepted and its bytes arrive.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_beyond_std_backlog_is_queued_not_reset() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = bind_listener("127.0.0.1:0".parse().expect("address")).expect("binds");
        let address = listener.local_addr().expect("address");
        // The kernel caps the backlog at `net.core.somaxconn` (4096 on current Linux).
        let cap = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|text| text.trim().parse::<u32>().ok())
            .unwrap_or(4096);
        let count = 600.min(cap.saturating_sub(8));
        // With a backlog of 128 the handshakes past it stall or never reach `accept`: bounded,
        // so that is a failure and not a hang.
        let burst = async {
            let mut clients = Vec::new();
            for index in 0..count {
                let mut stream = tokio::net::TcpStream::connect(address)
                    .await
                    .expect("connects");
                stream
                    .write_all(&index.to_le_bytes())
                    .await
                    .expect("writes");
                clients.push(stream);
            }
            let mut seen = Vec::new();
            for _ in 0..count {
                let (mut stream, _) = listener.accept().await.expect("accepts");
                let mut bytes = [0u8; 4];
                stream.read_exact(&mut bytes).await.expect("reads");
                seen.push(u32::from_le_bytes(bytes));
            }
            drop(clients);
            seen
        };
        let mut seen = tokio::time::timeout(std::time::Duration::from_secs(30), burst)
            .await
            .expect("the burst is queued and accepted within 30 s");
        seen.sort_unstable();
        assert_eq!(seen, (0..count).collect::<Vec<_>>());
    }
}
