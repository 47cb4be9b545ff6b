//! `--admin-token-file`: with an admin token set, `/admin/*` answers only requests carrying
//! it, so an agent running commands next to its harness cannot open, close or reroute
//! executions; model calls are unaffected.

use gyre_proxy::server::ServerConfig;
use serde_json::json;

use crate::in_process::{proxy_with, recording};
use crate::support::http;

#[test]
fn admin_routes_need_the_admin_token_when_one_is_set() {
    let runtime = crate::support::runtime();
    let proxy = proxy_with(
        &runtime,
        recording(),
        ServerConfig {
            admin_token: Some("admin-s3cret".into()),
            ..ServerConfig::default()
        },
    );
    let admin = |path: &str, authorization: Option<&str>| {
        let headers: Vec<(&str, &str)> = authorization
            .map(|value| vec![("authorization", value)])
            .unwrap_or_default();
        http(&proxy.address, "POST", path, &headers, "{}")
    };
    for authorization in [
        None,
        Some("Bearer wrong"),
        Some("Bearer admin-s3cre"),
        Some("admin-s3cret"),
    ] {
        let (status, body) = admin("/admin/executions", authorization);
        assert_eq!(status, 401, "{authorization:?}: {body}");
        assert!(body.contains("admin token"), "{body}");
        let (status, _) = admin(
            &format!("/admin/executions/{}/close", proxy.token),
            authorization,
        );
        assert_eq!(status, 401, "{authorization:?}");
    }
    let (status, body) = admin("/admin/executions", Some("Bearer admin-s3cret"));
    assert_eq!(status, 200, "{body}");
    let opened: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert!(opened["token"].is_string(), "{body}");
    // The harness's own calls need only its credential.
    let (status, answer) = proxy.post(
        "/v1/messages",
        &json!({"model": "m", "max_tokens": 8,
                "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(status, 200, "{answer}");
    let (status, body) = admin(
        &format!("/admin/executions/{}/close", proxy.token),
        Some("Bearer admin-s3cret"),
    );
    assert_eq!(status, 200, "{body}");
}
