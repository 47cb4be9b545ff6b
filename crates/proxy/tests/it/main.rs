//! gyre-proxy's one integration-test binary (STYLE.md rule 15).

mod anthropic;
mod builders;
mod engine_fake_chat;
mod engine_rollout;
mod engine_scripted;
mod engine_sglang;
mod engine_suite;
mod engine_support;
mod engine_vllm;
mod hostile_requests;
mod incremental_body;
mod model_dir;
mod openai_chat;
mod openai_responses;
mod output_parser;
mod prefill;
mod python_values;
mod responses_socket;
mod server_requests;
mod session;
mod smollm2;
mod stream_clients;
mod support;
mod template_cases;
mod template_values;
mod test_model;
