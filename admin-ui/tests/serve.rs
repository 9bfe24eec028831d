//! The UI as a browser sees it: the router served over real HTTP on a free port.

use tokio::net::TcpListener;

/// Serves `admin_ui::router()` on `127.0.0.1:0`; returns its base URL.
async fn serve() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, admin_ui::router()).await });
    format!("http://{addr}")
}

async fn get(url: &str) -> (u16, String, String) {
    let resp = reqwest::get(url).await.expect("request");
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .map(|v| v.to_str().expect("ascii content type").to_string())
        .unwrap_or_default();
    (status, content_type, resp.text().await.expect("body"))
}

/// Every `href="…"` and `src="…"` value in `html`.
fn links(html: &str) -> Vec<&str> {
    ["href=\"", "src=\""]
        .iter()
        .flat_map(|attr| html.split(attr).skip(1))
        .map(|rest| rest.split('"').next().unwrap_or(""))
        .collect()
}

#[tokio::test]
async fn page_is_served_at_ui_with_and_without_slash() {
    let base = serve().await;
    for path in ["/ui", "/ui/"] {
        let (status, content_type, body) = get(&format!("{base}{path}")).await;
        assert_eq!(status, 200, "{path}");
        assert_eq!(content_type, "text/html; charset=utf-8", "{path}");
        assert!(body.starts_with("<!doctype html>"), "{path}: {body}");
        assert!(body.contains(r#"<html lang="en">"#), "{path}: {body}");
        assert!(
            body.contains("<title>fencegate admin</title>"),
            "{path}: {body}"
        );
        assert!(body.contains("<main"), "{path}: {body}");
    }
}

#[tokio::test]
async fn page_loads_nothing_from_other_origins_and_its_assets_exist() {
    let base = serve().await;
    let (_, _, body) = get(&format!("{base}/ui")).await;
    let links = links(&body);
    assert!(links.contains(&"/ui/assets/style.css"), "{links:?}");
    assert!(links.contains(&"/ui/assets/app.js"), "{links:?}");
    // In-page links (the views) and inline data (the empty favicon) need no request at all.
    for link in links
        .into_iter()
        .filter(|l| !l.starts_with('#') && !l.starts_with("data:"))
    {
        // A same-origin absolute path: resolves the same from `/ui` and `/ui/`, and an
        // operator's browser needs no network beyond the node.
        assert!(
            link.starts_with('/') && !link.starts_with("//"),
            "{link} is not a same-origin path"
        );
        if let Some(file) = link.strip_prefix("/ui/assets/") {
            let (status, content_type, _) = get(&format!("{base}{link}")).await;
            assert_eq!(status, 200, "{file}");
            if file.ends_with(".css") {
                assert_eq!(content_type, "text/css; charset=utf-8", "{file}");
            }
            if file.ends_with(".js") {
                assert_eq!(content_type, "text/javascript; charset=utf-8", "{file}");
            }
        }
    }
}

#[tokio::test]
async fn unknown_asset_is_404() {
    let base = serve().await;
    let (status, _, _) = get(&format!("{base}/ui/assets/nope.js")).await;
    assert_eq!(status, 404);
}
