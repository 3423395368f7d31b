//! Black-box tests: each test spawns keel on port 0 with a fresh database and talks HTTP.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fakes;
mod helpers;
mod imports;

mod architecture;
mod auth;
mod billing;
mod bounds;
mod browser;
mod chaos;
mod cli;
mod cluster;
mod console;
mod contract;
mod errors;
mod export;
mod flash;
mod grants;
mod keys;
mod logs;
mod operator;
mod projects;
mod proxy;
mod queue;
mod queue_claims;
mod queue_rounds;
mod relay;
mod runs;
mod serving;
mod streams;
mod system;
mod trace_browse;
mod traces;
mod validation;
mod webhooks;
