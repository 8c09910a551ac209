//! The dashboard's side of a connection: [`TelemetryClient`] connects to a publisher's socket
//! and reads checked frames through [`crate::FrameReader`]. Only dashboards build it (the
//! `client` feature); a program that publishes never links it.

use std::io::{self, BufReader, Read};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::{Frame, FrameReader, TelemetryAddr, TelemetryError};

/// The socket of a client connection.
enum ClientConn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Read for ClientConn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ClientConn::Unix(s) => s.read(buf),
            ClientConn::Tcp(s) => s.read(buf),
        }
    }
}

/// The dashboard's side of a connection: connects to a publisher and reads checked frames.
/// What a publisher can make it hold is bounded ([`crate::wire::CLIENT_BUFFER_BYTES`] for a
/// snapshot, its history and the table additions after it; one frame at a time besides): a
/// publisher that breaks the protocol or the bound ends the connection with an error that
/// says why.
pub struct TelemetryClient {
    addr: TelemetryAddr,
    frames: FrameReader<BufReader<ClientConn>>,
}

impl TelemetryClient {
    /// Connects to the publisher at `addr`. Reads time out after ten seconds without a byte (a
    /// live publisher sends statistics ten times a second).
    pub fn connect(addr: &TelemetryAddr) -> Result<TelemetryClient, TelemetryError> {
        let timeout = Some(Duration::from_secs(10));
        let conn = match addr {
            TelemetryAddr::Unix(path) => {
                let s = UnixStream::connect(path)?;
                s.set_read_timeout(timeout)?;
                ClientConn::Unix(s)
            }
            TelemetryAddr::Tcp(a) => {
                let s = TcpStream::connect_timeout(a, Duration::from_secs(5))?;
                s.set_read_timeout(timeout)?;
                s.set_nodelay(true)?;
                ClientConn::Tcp(s)
            }
        };
        Ok(TelemetryClient {
            addr: addr.clone(),
            frames: FrameReader::new(BufReader::with_capacity(1 << 20, conn)),
        })
    }

    /// The address this client is connected to.
    pub fn addr(&self) -> &TelemetryAddr {
        &self.addr
    }

    /// Changes how long a read may wait for the next byte (`None`: forever).
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self.frames.get_ref().get_ref() {
            ClientConn::Unix(s) => s.set_read_timeout(timeout),
            ClientConn::Tcp(s) => s.set_read_timeout(timeout),
        }
    }

    /// Reads the next frame. Any error ends the connection's usefulness: reconnect.
    pub fn next_frame(&mut self) -> Result<Frame, TelemetryError> {
        self.frames.next_frame()
    }
}
