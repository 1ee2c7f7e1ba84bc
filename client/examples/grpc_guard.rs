//! A tonic service protected by Floodgate: here the standard health service,
//! asked of Floodgate under its method path with the caller's `x-tenant`.
//!
//! ```sh
//! floodgate serve &
//! cargo run -p floodgate-client --example grpc_guard -- --floodgate http://127.0.0.1:50051
//! grpcurl -plaintext -H 'x-tenant: acme' 127.0.0.1:50061 grpc.health.v1.Health/Check
//! ```

use std::net::SocketAddr;

use clap::Parser;
use floodgate_client::Client;
use floodgate_client::grpc::FloodgateGrpcLayer;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    floodgate: String,
    #[arg(long, default_value = "127.0.0.1:50061")]
    listen: SocketAddr,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter("info").init();
    let args = Args::parse();
    let floodgate = Client::connect(args.floodgate)?;
    let (_reporter, health) = tonic_health::server::health_reporter();
    tracing::info!(listen = %args.listen, "grpc_guard serving");
    tonic::transport::Server::builder()
        .layer(FloodgateGrpcLayer::new(floodgate).descriptor_metadata("x-tenant", "tenant")?)
        .add_service(health)
        .serve(args.listen)
        .await?;
    Ok(())
}
