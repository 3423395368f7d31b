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
            let fd = unsafe { BorrowedFd::borrow_raw(socket.0) };
            fd.try_clone_to_owned().ok()
        });
        Self(socket.map(Arc::new))
    }

    /// Whether the client has closed or reset its connection. Bytes it sent since
    /// (a pipelined request) mean it is still there.
    pub fn gone(&self) -> bool {
        let Some(fd) = &self.0 else {
            return false;
        };
        let socket = socket2::SockRef::from(fd.as_ref());
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
}
