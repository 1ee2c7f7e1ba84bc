//! docs/src/reference/api.md: Floodgate's gRPC API, from the compiled
//! protos (`floodgate_proto::FILE_DESCRIPTOR_SET`, which keeps the comments)
//! and from the server's table of served RPCs (`floodgate_server::grpc::rpc`).

use std::collections::BTreeMap;

use floodgate_server::grpc::rpc::{Caller, Rpc};
use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorProto, FileDescriptorSet, SourceCodeInfo};

use super::{cell, check_page, header};

const PAGE: &str = "docs/src/reference/api.md";

/// The services the server serves that other projects define, with the
/// page that documents them.
const OTHERS: &[(&str, &str, &str)] = &[
    (
        "envoy.service.ratelimit.v3.RateLimitService",
        "Envoy's rate limit service (RLS)",
        "https://www.envoyproxy.io/docs/envoy/latest/api-v3/service/ratelimit/v3/rls.proto",
    ),
    (
        "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
        "Envoy's rate limit quota service (RLQS)",
        "https://www.envoyproxy.io/docs/envoy/latest/api-v3/service/rate_limit_quota/v3/rlqs.proto",
    ),
    (
        "grpc.health.v1.Health",
        "gRPC health checking",
        "https://github.com/grpc/grpc/blob/master/doc/health-checking.md",
    ),
    (
        "grpc.reflection.v1.ServerReflection",
        "gRPC server reflection",
        "https://github.com/grpc/grpc/blob/master/doc/server-reflection.md",
    ),
    (
        "grpc.reflection.v1alpha.ServerReflection",
        "gRPC server reflection (the older version)",
        "https://github.com/grpc/grpc/blob/master/doc/server-reflection.md",
    ),
];

#[test]
fn api_reference_is_up_to_date() {
    check_page(PAGE, &render());
}

fn render() -> String {
    let set = FileDescriptorSet::decode(floodgate_proto::FILE_DESCRIPTOR_SET).expect("the descriptor set decodes");
    let ours: Vec<&FileDescriptorProto> =
        set.file.iter().filter(|f| f.package().split('.').next() == Some("floodgate")).collect();
    assert!(!ours.is_empty(), "no floodgate.* proto in the descriptor set");
    let mut out = header(
        "the comments of proto/floodgate/v1/*.proto and server/service/src/grpc/rpc.rs (tests/e2e/reference/api.rs)",
    );
    out.push_str("# gRPC API\n\n");
    out.push_str(
        "The gRPC port (`floodgate serve --listen`, 127.0.0.1:50051 by default) serves Floodgate's own \
         services, described on this page, and the services of other projects listed below. \
         The server has reflection turned on, so tools such as grpcurl need no proto file. \
         The HTTP port answers every unary call of Floodgate and Admin with JSON bodies too \
         (`POST /v1/acquire`, `/v1/admin/get-rules`, ...): see \
         [JSON over HTTP](../how-to/other-languages.md#json-over-http).\n\n",
    );
    served(&mut out);
    for file in ours {
        file_section(&mut out, file);
    }
    out
}

/// The table of every served method, from the server's own table.
fn served(out: &mut String) {
    out.push_str("## Served methods\n\n");
    out.push_str(
        "Every method the gRPC port serves, who may call it, and the largest request it \
         takes (a larger one is refused with RESOURCE_EXHAUSTED; for a stream, the largest \
         message). An Admin method needs a credential with the role shown when the server \
         has Admin tokens or client certificates (see [Secure Floodgate](../how-to/security.md)).\n\n",
    );
    out.push_str("| method | who may call | largest request |\n|---|---|---|\n");
    let mut others = BTreeMap::new();
    for rpc in Rpc::ALL {
        let path = rpc.path();
        let (service, method) = path.trim_start_matches('/').split_once('/').expect("a path is /service/method");
        let who = match rpc.caller() {
            Caller::Anyone => "anyone".to_string(),
            Caller::Admin(role) => format!("Admin, role `{}`", format!("{role:?}").to_lowercase()),
        };
        let name = match service.strip_prefix("floodgate.") {
            Some(_) => format!("[`{service}/{method}`](#{})", anchor(&format!("{}.{method}", short(service)))),
            None => {
                others.insert(service.to_string(), ());
                format!("`{service}/{method}`")
            }
        };
        out.push_str(&format!("| {name} | {who} | {} |\n", size(rpc.cap())));
    }
    out.push_str("\nThe services of other projects that the port serves:\n\n");
    for service in others.keys() {
        let (_, what, link) = OTHERS
            .iter()
            .find(|(name, _, _)| name == service)
            .unwrap_or_else(|| panic!("{service} is served: add it to OTHERS in tests/e2e/reference/api.rs"));
        out.push_str(&format!("- `{service}`: [{what}]({link}).\n"));
    }
    out.push('\n');
}

/// `floodgate.v1.Admin` without its package: `Admin`.
fn short(full: &str) -> &str {
    full.rsplit('.').next().unwrap_or(full)
}

fn size(bytes: usize) -> String {
    match bytes {
        b if b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

/// The id mdBook gives a heading: lower case, spaces as `-`, and only
/// letters, digits, `-` and `_` kept.
fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Comments by their location path (see `SourceCodeInfo` in descriptor.proto).
struct Comments(BTreeMap<Vec<i32>, String>);

impl Comments {
    fn new(info: Option<&SourceCodeInfo>) -> Self {
        let mut all = BTreeMap::new();
        for location in info.map(|i| i.location.as_slice()).unwrap_or_default() {
            if let Some(text) = &location.leading_comments {
                all.insert(location.path.clone(), text.clone());
            }
        }
        Comments(all)
    }

    /// The comment at `path` as Markdown lines (a `//` comment's lines lose
    /// their first space).
    fn block(&self, path: &[i32]) -> String {
        let Some(text) = self.0.get(path) else { return String::new() };
        let lines: Vec<String> =
            text.lines().map(|l| escape_html(l.strip_prefix(' ').unwrap_or(l).trim_end())).collect();
        let mut text = lines.join("\n").trim().to_string();
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        text
    }

    /// The comment at `path` on one line, for a table cell.
    fn cell(&self, path: &[i32]) -> String {
        self.0.get(path).map(|t| cell(t)).unwrap_or_default()
    }
}

/// `<` and `>` outside code spans, escaped so that the book does not read
/// them as HTML.
fn escape_html(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for c in line.chars() {
        match c {
            '`' => {
                in_code = !in_code;
                out.push(c);
            }
            '<' if !in_code => out.push_str("&lt;"),
            '>' if !in_code => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

// Field numbers in descriptor.proto, used in the location paths.
const FILE_SYNTAX: i32 = 12;
const FILE_MESSAGE: i32 = 4;
const FILE_ENUM: i32 = 5;
const FILE_SERVICE: i32 = 6;
const SERVICE_METHOD: i32 = 2;
const MESSAGE_FIELD: i32 = 2;
const MESSAGE_NESTED: i32 = 3;
const MESSAGE_ENUM: i32 = 4;
const ENUM_VALUE: i32 = 2;

fn file_section(out: &mut String, file: &FileDescriptorProto) {
    let comments = Comments::new(file.source_code_info.as_ref());
    let package = file.package();
    out.push_str(&format!("## Package {package}\n\n"));
    out.push_str(&format!("From `proto/{}`.\n\n", file.name()));
    out.push_str(&comments.block(&[FILE_SYNTAX]));

    // Every message and enum of the file, nested ones included, with the
    // name the page gives it (`Outer.Inner`), so that field types can link.
    let mut messages = Vec::new();
    let mut enums = Vec::new();
    for (i, m) in file.message_type.iter().enumerate() {
        collect(m, "", vec![FILE_MESSAGE, i as i32], &mut messages, &mut enums);
    }
    for (i, e) in file.enum_type.iter().enumerate() {
        enums.push((e.name().to_string(), e, vec![FILE_ENUM, i as i32]));
    }
    let maps: BTreeMap<String, &DescriptorProto> = messages
        .iter()
        .filter(|(_, m, _)| m.options.as_ref().is_some_and(|o| o.map_entry()))
        .map(|(name, m, _)| (format!(".{package}.{name}"), *m))
        .collect();
    let type_name = |full: &str| -> String {
        match full.strip_prefix(&format!(".{package}.")) {
            Some(name) => format!("[{name}](#{})", anchor(name)),
            None => format!("`{}`", full.trim_start_matches('.')),
        }
    };

    out.push_str("### Services\n\n");
    for (s, service) in file.service.iter().enumerate() {
        let path = [FILE_SERVICE, s as i32];
        out.push_str(&format!("#### {}\n\n", service.name()));
        out.push_str(&format!("`{package}.{}`\n\n", service.name()));
        out.push_str(&comments.block(&path));
        for (m, method) in service.method.iter().enumerate() {
            let stream = |yes: bool| if yes { "stream " } else { "" };
            out.push_str(&format!("##### {}.{}\n\n", service.name(), method.name()));
            out.push_str(&format!(
                "`rpc {}({}{}) returns ({}{})`\n\n",
                method.name(),
                stream(method.client_streaming()),
                short(method.input_type()),
                stream(method.server_streaming()),
                short(method.output_type()),
            ));
            out.push_str(&format!(
                "Request: {}. Response: {}.\n\n",
                type_name(method.input_type()),
                type_name(method.output_type())
            ));
            out.push_str(&comments.block(&[FILE_SERVICE, s as i32, SERVICE_METHOD, m as i32]));
        }
    }

    out.push_str("### Messages\n\n");
    for (name, message, path) in &messages {
        if message.options.as_ref().is_some_and(|o| o.map_entry()) {
            continue;
        }
        out.push_str(&format!("#### {name}\n\n"));
        out.push_str(&comments.block(path));
        if message.field.is_empty() {
            out.push_str("No fields.\n\n");
            continue;
        }
        out.push_str("| field | number | type | description |\n|---|---|---|---|\n");
        for (f, field) in message.field.iter().enumerate() {
            let mut field_path = path.clone();
            field_path.extend([MESSAGE_FIELD, f as i32]);
            let base = match field.r#type() {
                Type::Message | Type::Enum | Type::Group => type_name(field.type_name()),
                scalar => format!("`{}`", scalar.as_str_name().trim_start_matches("TYPE_").to_lowercase()),
            };
            let kind = match maps.get(field.type_name()) {
                Some(entry) => {
                    let kv: Vec<String> = entry
                        .field
                        .iter()
                        .map(|f| match f.r#type() {
                            Type::Message | Type::Enum => short(f.type_name()).to_string(),
                            scalar => scalar.as_str_name().trim_start_matches("TYPE_").to_lowercase(),
                        })
                        .collect();
                    format!("`map<{}>`", kv.join(", "))
                }
                None if field.label() == Label::Repeated => format!("repeated {base}"),
                None if field.proto3_optional() => format!("optional {base}"),
                None => base,
            };
            let mut description = comments.cell(&field_path);
            if let Some(oneof) = field.oneof_index.filter(|_| !field.proto3_optional()) {
                let name = message.oneof_decl[oneof as usize].name();
                description = format!("One of `{name}`. {description}").trim_end().to_string();
            }
            out.push_str(&format!("| `{}` | {} | {kind} | {description} |\n", field.name(), field.number()));
        }
        out.push('\n');
    }

    out.push_str("### Enums\n\n");
    for (name, e, path) in &enums {
        out.push_str(&format!("#### {name}\n\n"));
        out.push_str(&comments.block(path));
        out.push_str("| value | number | description |\n|---|---|---|\n");
        for (v, value) in e.value.iter().enumerate() {
            let mut value_path = path.clone();
            value_path.extend([ENUM_VALUE, v as i32]);
            out.push_str(&format!("| `{}` | {} | {} |\n", value.name(), value.number(), comments.cell(&value_path)));
        }
        out.push('\n');
    }
}

type Messages<'a> = Vec<(String, &'a DescriptorProto, Vec<i32>)>;
type Enums<'a> = Vec<(String, &'a EnumDescriptorProto, Vec<i32>)>;

/// A message and its nested messages and enums, in the order of the file.
fn collect<'a>(
    m: &'a DescriptorProto,
    outer: &str,
    path: Vec<i32>,
    messages: &mut Messages<'a>,
    enums: &mut Enums<'a>,
) {
    let name = if outer.is_empty() { m.name().to_string() } else { format!("{outer}.{}", m.name()) };
    messages.push((name.clone(), m, path.clone()));
    for (i, nested) in m.nested_type.iter().enumerate() {
        let mut p = path.clone();
        p.extend([MESSAGE_NESTED, i as i32]);
        collect(nested, &name, p, messages, enums);
    }
    for (i, e) in m.enum_type.iter().enumerate() {
        let mut p = path.clone();
        p.extend([MESSAGE_ENUM, i as i32]);
        enums.push((format!("{name}.{}", e.name()), e, p));
    }
}
