//! A TCP proxy that delays every byte by a fixed time in each direction, as a network hop
//! between keel and its database would: each chunk read is written on after `delay`, in
//! order, without holding up the chunks behind it (a pipe, not a stop-and-wait).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Listens on a free local port and forwards each connection to `upstream` with `delay`
/// each way; answers the port's address. Runs until the process ends.
pub async fn start(upstream: SocketAddr, delay: Duration) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(outbound) = TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = inbound.set_nodelay(true);
                let _ = outbound.set_nodelay(true);
                let (in_read, in_write) = inbound.into_split();
                let (out_read, out_write) = outbound.into_split();
                tokio::spawn(pipe(in_read, out_write, delay));
                tokio::spawn(pipe(out_read, in_write, delay));
            });
        }
    });
    Ok(addr)
}

/// Copies `from` to `to`, each chunk `delay` after it was read.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    let (sender, mut receiver) = mpsc::unbounded_channel::<(Instant, Bytes)>();
    let writer = tokio::spawn(async move {
        while let Some((due, chunk)) = receiver.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let due = Instant::now() + delay;
                if sender.send((due, Bytes::copy_from_slice(&buffer[..n]))).is_err() {
                    break;
                }
            }
        }
    }
    drop(sender);
    let _ = writer.await;
}
