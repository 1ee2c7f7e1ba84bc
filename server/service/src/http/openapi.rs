//! The HTTP API's OpenAPI 3.1 document, made from the protos' descriptors at
//! start, so it cannot differ from what the server decodes: every field a
//! request may carry, in the proto3 JSON mapping (64-bit integers as
//! strings, enums by name, durations as `"1.5s"`).

use std::collections::{BTreeMap, BTreeSet};

use prost_reflect::{DescriptorPool, FieldDescriptor, Kind, MessageDescriptor};
use serde_json::{Map, Value, json};

use crate::grpc::rpc::{Caller, Rpc};

/// The document for `calls` (a path after `/v1/` and its RPC), whose input
/// and output types `types` gives.
pub(super) fn document(
    pool: &DescriptorPool,
    calls: &[(String, Rpc)],
    types: impl Fn(Rpc) -> Option<(MessageDescriptor, MessageDescriptor)>,
) -> Value {
    let mut paths = Map::new();
    let mut wanted = BTreeSet::new();
    for (name, rpc) in calls {
        let Some((input, output)) = types(*rpc) else { continue };
        wanted.insert(input.full_name().to_string());
        wanted.insert(output.full_name().to_string());
        let who = match rpc.caller() {
            Caller::Anyone => "Anyone who reaches the port may call it.".to_string(),
            Caller::Admin(role) => format!("An Admin caller with the {role:?} role may call it (a bearer token)."),
        };
        let operation = json!({
            "operationId": name.replace(['/', '-'], "_"),
            "summary": format!("{} over JSON", rpc.label()),
            "description": format!("The gRPC call {} with a JSON body. {who}", rpc.path()),
            "requestBody": {
                "required": false,
                "content": { "application/json": { "schema": reference(input.full_name()) } }
            },
            "responses": {
                "200": {
                    "description": "The call's answer (a denial too: its verdict says so).",
                    "content": { "application/json": { "schema": reference(output.full_name()) } }
                },
                "default": {
                    "description": "An error: the gRPC code and its message.",
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } }
                }
            }
        });
        paths.insert(format!("/v1/{name}"), json!({ "post": operation }));
    }
    let mut schemas = BTreeMap::new();
    let mut todo: Vec<String> = wanted.into_iter().collect();
    while let Some(name) = todo.pop() {
        if schemas.contains_key(&name) {
            continue;
        }
        let Some(message) = pool.get_message_by_name(&name) else { continue };
        schemas.insert(name, message_schema(&message, &mut todo));
    }
    let mut components: Map<String, Value> = schemas.into_iter().collect();
    components.insert(
        "Error".into(),
        json!({
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": { "type": "string", "description": "The gRPC code, such as INVALID_ARGUMENT." },
                "message": { "type": "string" }
            }
        }),
    );
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Floodgate JSON API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Floodgate's gRPC calls with JSON bodies (the proto3 JSON mapping), on the HTTP port."
        },
        "paths": paths,
        "components": { "schemas": components }
    })
}

fn reference(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

/// A message's schema; the messages it refers to are pushed on `todo`.
fn message_schema(message: &MessageDescriptor, todo: &mut Vec<String>) -> Value {
    let mut properties = Map::new();
    for field in message.fields() {
        properties.insert(field.json_name().to_string(), field_schema(&field, todo));
    }
    json!({ "type": "object", "additionalProperties": false, "properties": properties })
}

fn field_schema(field: &FieldDescriptor, todo: &mut Vec<String>) -> Value {
    if field.is_map() {
        let Kind::Message(entry) = field.kind() else { return json!({}) };
        let value = entry.map_entry_value_field();
        return json!({ "type": "object", "additionalProperties": kind_schema(&value.kind(), todo) });
    }
    let one = kind_schema(&field.kind(), todo);
    match field.is_list() {
        true => json!({ "type": "array", "items": one }),
        false => one,
    }
}

fn kind_schema(kind: &Kind, todo: &mut Vec<String>) -> Value {
    match kind {
        Kind::Double | Kind::Float => json!({ "type": "number" }),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => json!({ "type": ["integer", "string"], "format": "int32" }),
        Kind::Uint32 | Kind::Fixed32 => json!({ "type": ["integer", "string"], "format": "uint32" }),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => {
            json!({ "type": ["string", "integer"], "format": "int64", "description": "A 64-bit integer: a string in answers." })
        }
        Kind::Uint64 | Kind::Fixed64 => {
            json!({ "type": ["string", "integer"], "format": "uint64", "description": "A 64-bit integer: a string in answers." })
        }
        Kind::Bool => json!({ "type": "boolean" }),
        Kind::String => json!({ "type": "string" }),
        Kind::Bytes => json!({ "type": "string", "contentEncoding": "base64" }),
        Kind::Enum(e) => {
            let names: Vec<String> = e.values().map(|v| v.name().to_string()).collect();
            json!({ "type": "string", "enum": names })
        }
        Kind::Message(m) => match m.full_name() {
            "google.protobuf.Duration" => {
                json!({ "type": "string", "pattern": "^-?[0-9]+(\\.[0-9]{1,9})?s$", "description": "Seconds, such as \"1.5s\"." })
            }
            "google.protobuf.Timestamp" => json!({ "type": "string", "format": "date-time" }),
            "google.protobuf.Struct" => json!({ "type": "object" }),
            "google.protobuf.Value" => json!({}),
            "google.protobuf.Empty" => json!({ "type": "object" }),
            name => {
                todo.push(name.to_string());
                reference(name)
            }
        },
    }
}
