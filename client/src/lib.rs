pub use floodgate_proto as proto;
