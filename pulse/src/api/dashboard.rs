//! The dashboard page at `/`: plain HTML, CSS and JavaScript compiled into the binary,
//! so it works on a machine with no network and needs no build step. The page polls
//! the JSON API once a second.
//!
//! Every response carries a Content-Security-Policy that allows only this origin, so
//! the page cannot load anything from another host even by mistake.

use axum::http::header;
use axum::response::IntoResponse;

const INDEX_HTML: &str = include_str!("../../assets/dashboard/index.html");
const DASHBOARD_CSS: &str = include_str!("../../assets/dashboard/dashboard.css");
const DASHBOARD_JS: &str = include_str!("../../assets/dashboard/dashboard.js");

/// Only this origin; no inline script; `data:` images for the empty favicon.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// The page's URLs and what they serve: (path, content type, body).
pub(super) const ASSETS: [(&str, &str, &str); 3] = [
    ("/", "text/html; charset=utf-8", INDEX_HTML),
    (
        "/assets/dashboard.css",
        "text/css; charset=utf-8",
        DASHBOARD_CSS,
    ),
    (
        "/assets/dashboard.js",
        "text/javascript; charset=utf-8",
        DASHBOARD_JS,
    ),
];

/// A handler that serves one embedded asset. `no-cache` makes the browser revalidate,
/// so a new pulse binary's page is picked up at once.
pub(super) fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode, header};
    use tower::ServiceExt;

    use super::ASSETS;
    use crate::api::app;

    #[tokio::test]
    async fn the_page_and_its_assets_are_served_from_the_binary() {
        let app = app(super::super::tests::state());
        for (path, content_type, body) in ASSETS {
            let response = app
                .clone()
                .oneshot(Request::get(path).body(Body::empty()).unwrap())
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::OK, "{path}");
            let headers = response.headers();
            assert_eq!(headers[header::CONTENT_TYPE], content_type, "{path}");
            let csp = headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
            assert!(csp.contains("default-src 'none'"), "{path}: {csp}");
            let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
                .await
                .unwrap();
            assert_eq!(bytes, body.as_bytes(), "{path}");
        }
    }

    /// The page names only its own assets and API: no other host, so it works offline.
    #[test]
    fn the_page_links_to_no_other_host() {
        for (path, _, body) in ASSETS {
            // The one URL that is a name, not a link: SVG's namespace.
            let body = body.replace("http://www.w3.org/2000/svg", "");
            for needle in ["http://", "https://", "//cdn", "@import"] {
                assert!(!body.contains(needle), "{path} mentions {needle}");
            }
        }
        let html = ASSETS[0].2;
        for (path, _, _) in &ASSETS[1..] {
            assert!(html.contains(path), "index.html does not load {path}");
        }
        let js = ASSETS[2].2;
        for endpoint in [
            "/api/tenants",
            "/api/heatmap",
            "/api/rates",
            "/api/edges",
            "/api/predictions",
            "/api/model",
            "/api/warm",
        ] {
            assert!(
                js.contains(endpoint),
                "dashboard.js does not call {endpoint}"
            );
        }
    }
}
