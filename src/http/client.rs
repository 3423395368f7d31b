//! Whether a request's client is still connected. actix-web notices a client that closed
//! its connection only when it next writes to it, so a handler that waits (a long-poll
//! claim) would otherwise act for a client that is gone (issue 36: a disconnected worker's
//! claim took a job, charged its fee, and left it to the stale sweep).

use std::any::Any;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;

use actix_web::dev::Extensions;
use actix_web::HttpRequest;

/// The connection's socket, recorded when it is accepted.
#[derive(Clone, Copy)]
struct ClientSocket(RawFd);

/// `HttpServer::on_connect`: records each connection's socket for [`ClientPresence::of`].
pub fn record_socket(connection: &dyn Any, extensions: &mut Extensions) {
    if let Some(stream) = connection.downcast_ref::<actix_web::rt::net::TcpStream>() {
        extensions.insert(ClientSocket(stream.as_raw_fd()));
    }
}

/// A descriptor shared by a watch on it and whoever may shut its connection down.
struct SharedFd(Arc<OwnedFd>);

impl std::os::fd::AsRawFd for SharedFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// A client's connection watched by the reactor: readable (a FIN, a reset, or bytes) wakes
/// the task at once, and [`ClientWatch::poll_gone`] then tells which.
pub struct ClientWatch(tokio::io::unix::AsyncFd<SharedFd>);

/// Ends a client's connection from outside the task that serves it (a watchdog's).
#[derive(Clone)]
pub struct ClientCloser(Arc<OwnedFd>);

impl ClientCloser {
    /// Shuts the connection down both ways: a write blocked on it fails, and the client
    /// sees it end.
    pub fn close(&self) {
        let _ = socket2::SockRef::from(self.0.as_ref()).shutdown(std::net::Shutdown::Both);
    }
}

impl ClientWatch {
    /// A closer of the watched connection.
    pub fn closer(&self) -> ClientCloser {
        ClientCloser(self.0.get_ref().0.clone())
    }

    /// Whether the client has left; registers the task to be woken when the connection
    /// next becomes readable.
    pub fn poll_gone(&mut self, cx: &mut std::task::Context<'_>) -> bool {
        loop {
            let mut ready = match self.0.poll_read_ready(cx) {
                std::task::Poll::Pending => return false,
                std::task::Poll::Ready(Err(_)) => return false,
                std::task::Poll::Ready(Ok(ready)) => ready,
            };
            if peer_gone(&self.0.get_ref().0) {
                return true;
            }
            // Bytes (a pipelined request) or a spurious wake-up: wait for the next change.
            ready.clear_ready();
        }
    }
}

/// Whether the peer of `fd` closed or reset the connection.
fn peer_gone(fd: &OwnedFd) -> bool {
    let socket = socket2::SockRef::from(fd);
    let mut byte = [MaybeUninit::<u8>::uninit(); 1];
    // The socket is non-blocking (the connection's), so an open, quiet one answers
    // WouldBlock at once.
    match socket.peek(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(err) => !matches!(
            err.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
        ),
    }
}

/// Says whether the client of one request is still connected (a socket of its own, shared
/// with the connection's, kept as long as this is).
#[derive(Clone)]
pub struct ClientPresence(Option<Arc<OwnedFd>>);

impl ClientPresence {
    /// The presence of `req`'s client; one that cannot be told is taken as present.
    pub fn of(req: &HttpRequest) -> Self {
        let socket = req.conn_data::<ClientSocket>().and_then(|socket| {
            // SAFETY: the descriptor is the socket of the connection this request arrived
            // on, which stays open while the request is being handled, as it is now; it is
            // duplicated at once, so later checks never touch a descriptor reused since.
            #[allow(unsafe_code)]
            let fd = unsafe { BorrowedFd::borrow_raw(socket.0) };
            fd.try_clone_to_owned().ok()
        });
        Self(socket.map(Arc::new))
    }

    /// Whether the client has closed or reset its connection. Bytes it sent since
    /// (a pipelined request) mean it is still there.
    pub fn gone(&self) -> bool {
        self.0.as_deref().is_some_and(peer_gone)
    }

    /// A watch on the connection for the task that polls it (`None` when it cannot be
    /// watched: no socket recorded, or the reactor refuses it).
    pub fn watch(self) -> Option<ClientWatch> {
        let fd = SharedFd(self.0?);
        // SAFETY: the descriptor is owned (shared, never closed early: only `shutdown` is
        // called on it elsewhere) by what is registered, so it stays open and the same
        // while the `AsyncFd` lives.
        #[allow(unsafe_code)]
        let watched =
            unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) };
        watched.ok().map(ClientWatch)
    }
}
