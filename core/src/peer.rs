//! Outbound calls to keel's peers (the serving layer, the hub, the tracker) and how they fail.

/// An outbound call (serving layer, hub, tracker) that gave no usable answer. Its message
/// names the peer, never a URL or a credential; its source keeps the cause for the log.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("{}", .failure.describe(.peer))]
    Call {
        peer: &'static str,
        failure: CallFailure,
        #[source]
        source: reqwest::Error,
    },
    #[error("{peer} answered {status}")]
    Status {
        peer: &'static str,
        status: reqwest::StatusCode,
    },
    #[error("{peer} answered a body that is not JSON")]
    NotJson {
        peer: &'static str,
        #[source]
        source: reqwest::Error,
    },
    #[error("{peer}'s URL cannot take the path of this call")]
    BadUrl { peer: &'static str },
}

impl PeerError {
    /// A call that failed before an answer (connecting, sending, reading).
    pub fn call(peer: &'static str, source: reqwest::Error) -> Self {
        Self::Call {
            peer,
            failure: CallFailure::of(&source),
            source,
        }
    }
}

/// An error and its sources, outermost first ("client error (SendRequest): connection
/// closed before message completed").
pub fn causes(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(err) = source {
        text.push_str(": ");
        text.push_str(&err.to_string());
        source = err.source();
    }
    text
}

/// How an outbound call failed, as far as an answer says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallFailure {
    /// The peer stayed silent longer than a timeout (connecting or reading).
    Timeout,
    /// No connection could be made.
    Unreachable,
    /// The connection broke, or the answer was not HTTP.
    Failed,
}

impl CallFailure {
    pub fn of(err: &reqwest::Error) -> Self {
        if err.is_timeout() {
            Self::Timeout
        } else if err.is_connect() {
            Self::Unreachable
        } else {
            Self::Failed
        }
    }

    /// The failure in words naming `peer`.
    pub fn describe(self, peer: &str) -> String {
        match self {
            Self::Timeout => format!("{peer} did not answer in time"),
            Self::Unreachable => format!("{peer} is unreachable"),
            Self::Failed => format!("calling {peer} failed"),
        }
    }
}

impl std::fmt::Display for CallFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe("the peer"))
    }
}

impl std::error::Error for CallFailure {}
