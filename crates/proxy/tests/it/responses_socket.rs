//! The Responses WebSocket on a real socket, in process: a server bound to a port and a small
//! RFC 6455 client (text frames, masked as a client must), so an answer's events arrive as a
//! harness reads them. An answer whose engine fails midway ends with an error in the socket's
//! own shape, as every other error on the socket.

use std::sync::Arc;

use gyre_proxy::engine::{DeterministicEngine, DeterministicOptions, Fault};
use gyre_proxy::output::OutputFormat;
use gyre_proxy::server::{AppState, ServerConfig};
use gyre_proxy::{ChatModel, ToolArgumentsForm};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::NoSink;

/// A proxy over the test model whose one engine dies after `tokens` tokens of every answer,
/// and which tries one engine per call: the harness gets the failure mid-answer.
fn failing_state(tokens: u32) -> Arc<AppState> {
    let model = Arc::new(
        ChatModel::load(
            &gyre_proxy::test_model::directory(),
            ToolArgumentsForm::RawText,
        )
        .expect("the test model loads"),
    );
    let engine = DeterministicEngine::new(DeterministicOptions {
        output_tokens: 25,
        end_token_id: model.token_id("<|im_end|>"),
        fault: Some(Fault::DieAfterTokens(tokens)),
        ..DeterministicOptions::default()
    });
    let config = ServerConfig {
        engine_attempts_max: 1,
        ..ServerConfig::default()
    };
    AppState::new(
        config,
        model,
        OutputFormat::test_model(),
        vec![Arc::new(engine)],
        Arc::new(NoSink),
    )
    .expect("state")
}

/// The client side of a WebSocket: text frames out (masked), text frames in.
struct Socket {
    stream: TcpStream,
    /// Bytes read past the last frame taken.
    pending: Vec<u8>,
}

impl Socket {
    async fn connect(address: std::net::SocketAddr, path: &str) -> Self {
        let mut stream = TcpStream::connect(address).await.expect("connect");
        let handshake = format!(
            "GET {path} HTTP/1.1\r\nHost: {address}\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\n\r\n"
        );
        stream
            .write_all(handshake.as_bytes())
            .await
            .expect("handshake sent");
        let mut socket = Self {
            stream,
            pending: Vec::new(),
        };
        let head_end = loop {
            if let Some(end) = socket
                .pending
                .windows(4)
                .position(|four| four == b"\r\n\r\n")
            {
                break end + 4;
            }
            socket.read_more().await;
        };
        let head: Vec<u8> = socket.pending.drain(..head_end).collect();
        let head = String::from_utf8_lossy(&head);
        assert!(head.starts_with("HTTP/1.1 101"), "not upgraded: {head}");
        socket
    }

    async fn read_more(&mut self) {
        let mut buffer = [0u8; 8192];
        let read = self.stream.read(&mut buffer).await.expect("read");
        assert!(read > 0, "the proxy closed the connection");
        self.pending.extend_from_slice(&buffer[..read]);
    }

    async fn take(&mut self, count: usize) -> Vec<u8> {
        while self.pending.len() < count {
            self.read_more().await;
        }
        self.pending.drain(..count).collect()
    }

    async fn send_text(&mut self, text: &str) {
        let payload = text.as_bytes();
        let mut frame = vec![0x81];
        match payload.len() {
            short @ 0..=125 => frame.push(0x80 | short as u8),
            medium @ 126..=0xFFFF => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(medium as u16).to_be_bytes());
            }
            long => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&(long as u64).to_be_bytes());
            }
        }
        let mask = [0x37, 0xfa, 0x21, 0x3d];
        frame.extend_from_slice(&mask);
        frame.extend(
            payload
                .iter()
                .enumerate()
                .map(|(index, byte)| byte ^ mask[index % 4]),
        );
        self.stream.write_all(&frame).await.expect("frame sent");
    }

    /// The next text message as JSON (pings and pongs skipped).
    async fn next_event(&mut self) -> Value {
        loop {
            let head = self.take(2).await;
            assert_eq!(head[0] & 0x80, 0x80, "a fragmented message");
            assert_eq!(head[1] & 0x80, 0, "a server frame is never masked");
            let length = match head[1] & 0x7f {
                126 => u16::from_be_bytes(self.take(2).await.try_into().expect("2")) as usize,
                127 => u64::from_be_bytes(self.take(8).await.try_into().expect("8")) as usize,
                short => short as usize,
            };
            let payload = self.take(length).await;
            match head[0] & 0x0f {
                0x1 => return serde_json::from_slice(&payload).expect("a JSON event"),
                0x9 | 0xA => continue,
                opcode => panic!("frame {opcode:#x}: {}", String::from_utf8_lossy(&payload)),
            }
        }
    }

    /// Every event of one answer, up to its last (`response.completed` or `error`).
    async fn answer(&mut self, create: &Value) -> Vec<Value> {
        self.send_text(&create.to_string()).await;
        let mut events = Vec::new();
        loop {
            let event = self.next_event().await;
            let last = matches!(
                event["type"].as_str(),
                Some("response.completed" | "response.incomplete" | "error")
            );
            events.push(event);
            if last {
                return events;
            }
        }
    }
}

/// A failure after the answer's stream started (no engine could finish it) reaches the socket
/// as `{"type":"error","status","error":{type,code,message,param}}`, the shape of every other
/// error there, numbered after the events before it and on the message's lane; the socket
/// stays open. Before, it went out in the SSE stream's shape (`{"type":"error","code",…}`, no
/// status).
#[tokio::test]
async fn an_answer_failing_midway_ends_with_an_error_in_the_sockets_shape() {
    let state = failing_state(3);
    let (_, token) = state.open_execution(None, None).expect("open");
    let (address, _server) = gyre_proxy::server::serve(
        state,
        "127.0.0.1:0".parse().expect("address"),
        std::future::pending(),
    )
    .await
    .expect("serving");
    let run = async {
        let mut socket = Socket::connect(address, &format!("/x/{token}/v1/responses")).await;
        for lane in [None, Some(json!("lane-a"))] {
            let mut create = json!({
                "type": "response.create", "model": "m", "max_output_tokens": 64,
                "input": [{"role": "user", "content": "Say something long."}],
            });
            if let Some(lane) = &lane {
                create["stream_id"] = lane.clone();
            }
            let events = socket.answer(&create).await;
            assert_eq!(events[0]["type"], "response.created", "{events:?}");
            let error = events.last().expect("events");
            assert_eq!(error["type"], "error", "{events:?}");
            assert_eq!(error["status"], 503, "{error}");
            assert_eq!(error["error"]["type"], "server_error", "{error}");
            assert_eq!(error["error"]["code"], "overloaded", "{error}");
            assert_eq!(error["error"]["param"], Value::Null, "{error}");
            assert!(
                error["error"]["message"]
                    .as_str()
                    .is_some_and(|message| message.contains("no engine could finish the call")),
                "{error}"
            );
            assert!(error.get("code").is_none(), "the SSE shape: {error}");
            let before = &events[events.len() - 2];
            assert_eq!(
                error["sequence_number"].as_u64(),
                before["sequence_number"].as_u64().map(|number| number + 1),
                "{events:?}"
            );
            match &lane {
                Some(lane) => assert!(
                    events.iter().all(|event| &event["stream_id"] == lane),
                    "{events:?}"
                ),
                None => assert!(error.get("stream_id").is_none(), "{error}"),
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), run)
        .await
        .expect("answered within 60 s");
}
