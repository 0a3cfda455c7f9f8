//! The built-in web page's routes: served (or not, with `--no-webui`), public, and the
//! `/v1/monitor` feed behind the API key like every other API route.

use strata::server::webui::{WebUi, serve_app};
use strata::server::{AppState, ServerConfig};

async fn start(api_key: Option<&str>, web_ui: bool) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    // No model: the server answers while "loading", which is all these routes need.
    let state = AppState::new(ServerConfig {
        api_key: api_key.map(str::to_string),
        ..ServerConfig::default()
    });
    let web_ui = web_ui.then_some(WebUi { demo_model: true });
    tokio::spawn(serve_app(listener, state, web_ui));
    format!("http://{address}")
}

async fn get(url: &str, key: Option<&str>) -> (u16, String, String) {
    let mut request = reqwest::Client::new().get(url);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    (status, content_type, response.text().await.expect("body"))
}

#[tokio::test]
async fn the_page_and_its_assets_are_served() {
    let base = start(None, true).await;
    let (status, content_type, index) = get(&format!("{base}/"), None).await;
    assert_eq!(status, 200);
    assert!(content_type.starts_with("text/html"), "{content_type}");
    assert!(index.contains("<title>strata</title>"));
    assert!(index.contains(r#"<body data-demo="true">"#), "{index}");
    for (path, kind) in [
        ("/app.js", "text/javascript"),
        ("/chat.js", "text/javascript"),
        ("/markdown.js", "text/javascript"),
        ("/chart.js", "text/javascript"),
        ("/monitor.js", "text/javascript"),
        ("/style.css", "text/css"),
    ] {
        let (status, content_type, body) = get(&format!("{base}{path}"), None).await;
        assert_eq!(status, 200, "{path}");
        assert!(content_type.starts_with(kind), "{path}: {content_type}");
        assert!(!body.is_empty(), "{path}");
        assert!(index.contains(path), "index.html must load {path}");
    }
}

#[tokio::test]
async fn no_webui_keeps_the_root_a_json_404() {
    let base = start(None, false).await;
    let (status, content_type, body) = get(&format!("{base}/"), None).await;
    assert_eq!(status, 404);
    assert!(
        content_type.starts_with("application/json"),
        "{content_type}"
    );
    assert!(body.contains("no route"), "{body}");
    assert_eq!(get(&format!("{base}/health"), None).await.0, 503);
}

#[tokio::test]
async fn monitor_reports_loading_with_nulls_for_what_is_unknown() {
    let base = start(None, true).await;
    let (status, _, body) = get(&format!("{base}/v1/monitor"), None).await;
    assert_eq!(status, 200);
    let json: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(json["status"], "loading");
    assert!(json["model"].is_null() && json["memory"].is_null());
    assert!(json["expert_cache"].is_null() && json["ple"].is_null());
    assert_eq!(json["queue"]["waiting"], 0);
    assert_eq!(json["throughput"]["generated_tokens_total"], 0);
    assert_eq!(json["api_key_required"], false);
}

#[tokio::test]
async fn with_a_key_the_page_is_public_and_the_monitor_is_not() {
    let base = start(Some("k"), true).await;
    assert_eq!(get(&format!("{base}/"), None).await.0, 200);
    assert_eq!(get(&format!("{base}/app.js"), None).await.0, 200);
    assert_eq!(get(&format!("{base}/v1/monitor"), None).await.0, 401);
    assert_eq!(get(&format!("{base}/v1/monitor"), Some("bad")).await.0, 401);
    let (status, _, body) = get(&format!("{base}/v1/monitor"), Some("k")).await;
    assert_eq!(status, 200);
    assert!(body.contains("\"api_key_required\":true"), "{body}");
}
