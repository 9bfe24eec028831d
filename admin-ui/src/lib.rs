//! The operator web UI, served by every node on its public API port under `/ui`.
//!
//! The pages and their assets are compiled into the binary, so a node serves its UI without a
//! file tree next to it and an operator's browser never reaches out to a CDN. The crate is a
//! leaf: it knows nothing of the node and only hands out routes, which the node merges into
//! its own router (whatever that router's state is):
//!
//! ```
//! let app: axum::Router = axum::Router::new().merge(admin_ui::router());
//! ```

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;

const INDEX: &str = include_str!("../assets/index.html");

/// Files under `/ui/assets/`: name, content type, bytes.
const ASSETS: &[(&str, &str, &[u8])] = &[
    (
        "style.css",
        "text/css; charset=utf-8",
        include_bytes!("../assets/style.css"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../assets/app.js"),
    ),
];

/// The UI's routes: the page at `/ui` and `/ui/`, its assets at `/ui/assets/{file}`.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/ui", get(index))
        .route("/ui/", get(index))
        .route("/ui/assets/{file}", get(asset))
}

async fn index() -> Html<&'static str> {
    Html(INDEX)
}

async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|(name, ..)| *name == file) {
        Some((_, content_type, bytes)) => {
            ([(header::CONTENT_TYPE, *content_type)], *bytes).into_response()
        }
        None => (StatusCode::NOT_FOUND, "no such asset\n").into_response(),
    }
}
