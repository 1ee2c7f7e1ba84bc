//! JSON replies shared by the console's handlers and the site checks in
//! front of them: never cached, always `application/json`.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// `body` as the reply, with `status`.
pub(super) fn json_response(status: StatusCode, body: Value) -> Response {
    let mut r = (status, body.to_string()).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, "application/json".parse().expect("valid"));
    r.headers_mut().insert(header::CACHE_CONTROL, "no-store".parse().expect("valid"));
    r
}

/// `{"error": message}` with `status`.
pub(super) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    json_response(status, json!({ "error": message.into() }))
}
