//! Process tests of the `gyre` binary (one integration-test binary per crate) and the
//! workspace's tidy test.

mod admin_token;
mod arguments;
mod blank_text;
mod closed_stdout;
mod concurrent_calls;
mod context_window;
mod control;
mod deploy;
mod embedded_engine;
mod engine_output;
mod forwarding;
mod harness;
mod in_process;
mod message_threads;
mod proxy_cluster;
mod proxy_failover;
mod proxy_http;
mod proxy_restart;
mod replay;
mod response_store;
mod sampling;
mod shutdown;
mod simulate;
mod structured_output;
mod support;
mod tidy;
mod trajectory;
