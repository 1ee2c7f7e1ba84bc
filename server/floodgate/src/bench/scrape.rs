//! Reads the server's own figures from its /metrics page.

use anyhow::Context;
use serde_json::{Value, json};

/// The server's keys and resident memory at one moment.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Figures {
    pub keys: f64,
    pub resident_bytes: f64,
}

pub async fn server_figures(url: &str) -> anyhow::Result<Figures> {
    let url = url.to_string();
    let page = tokio::task::spawn_blocking(move || get(&url)).await??;
    let value = |name: &str| {
        page.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.trim().parse::<f64>().ok()))
            .with_context(|| format!("no {name} on the metrics page"))
    };
    Ok(Figures { keys: value(crate::metrics::KEYS)?, resident_bytes: value(crate::metrics::RESIDENT_MEMORY)? })
}

/// What the run added on the server, and per key.
pub fn memory_per_key(before: &Figures, after: &Figures) -> Value {
    let keys = after.keys - before.keys;
    let bytes = after.resident_bytes - before.resident_bytes;
    json!({
        "keysBefore": before.keys,
        "keysAfter": after.keys,
        "residentBytesBefore": before.resident_bytes,
        "residentBytesAfter": after.resident_bytes,
        "bytesPerKey": if keys > 0.0 { Some((bytes / keys).round()) } else { None },
    })
}

/// A plain HTTP/1.1 GET of an `http://host:port/path` URL.
fn get(url: &str) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").context("the metrics URL must start with http://")?;
    let (host, path) = rest.split_once('/').map_or((rest, "/".to_string()), |(h, p)| (h, format!("/{p}")));
    let mut stream = std::net::TcpStream::connect(host).with_context(|| format!("connecting to {host}"))?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").context("a malformed HTTP answer")?;
    anyhow::ensure!(head.starts_with("HTTP/1.1 200"), "GET {url}: {}", head.lines().next().unwrap_or(""));
    Ok(body.to_string())
}
