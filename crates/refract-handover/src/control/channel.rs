//! `ControlChannel`: one authenticated control connection over TCP, with heartbeats; the
//! cross-host [`Carrier`].

use std::convert::Infallible;
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{sleep_until, timeout, Instant};

use super::auth::{nonce, ControlKey, NonceCache};
use crate::carrier::{tcp_may_carry, Carrier};
use crate::error::{Error, Result};
use crate::msg::{encode, parse, Msg, VERSION};

/// Longest frame accepted before the peer is authenticated (a Challenge is 69 bytes): an
/// unauthenticated peer cannot make us buffer a large frame.
const HANDSHAKE_MAX_FRAME: usize = 128;

/// Timing of a control channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelOptions {
    /// A heartbeat is sent when nothing else was sent for this long (while `recv` runs).
    pub heartbeat: Duration,
    /// The peer is declared dead when nothing arrived from it for this long.
    pub dead_after: Duration,
    /// Bound on connecting and authenticating.
    pub handshake_timeout: Duration,
}

impl Default for ChannelOptions {
    /// Heartbeat every second, dead after three seconds of silence, handshake within five.
    fn default() -> Self {
        ChannelOptions {
            heartbeat: Duration::from_secs(1),
            dead_after: Duration::from_secs(3),
            handshake_timeout: Duration::from_secs(5),
        }
    }
}

/// An authenticated control connection between a dispatcher (the connector) and an agent (the
/// acceptor). Both sides send heartbeats while [`ControlChannel::recv`] runs and declare the peer
/// dead after [`ChannelOptions::dead_after`] of silence.
///
/// `send` and `recv` are cancel-safe in the sense `select!` needs: bytes read stay buffered and
/// a partly written frame is completed by the next call, so the stream is never corrupted.
#[derive(Debug)]
pub struct ControlChannel {
    stream: TcpStream,
    peer: SocketAddr,
    rbuf: BytesMut,
    wbuf: BytesMut,
    opts: ChannelOptions,
    last_rx: Instant,
    last_tx: Instant,
}

impl ControlChannel {
    fn new(stream: TcpStream, opts: ChannelOptions) -> Result<Self> {
        stream.set_nodelay(true)?;
        let peer = stream.peer_addr()?;
        let now = Instant::now();
        Ok(ControlChannel {
            stream,
            peer,
            rbuf: BytesMut::with_capacity(8192),
            wbuf: BytesMut::new(),
            opts,
            last_rx: now,
            last_tx: now,
        })
    }

    /// Connects to an agent at `addr` and authenticates both ways with `key`.
    pub async fn connect(addr: SocketAddr, key: &ControlKey, opts: ChannelOptions) -> Result<Self> {
        let bound = opts.handshake_timeout;
        let stream = timeout(bound, TcpStream::connect(addr)).await.map_err(|_| Error::PeerDead(bound))??;
        let mut ch = Self::new(stream, opts)?;
        timeout(bound, ch.connector_handshake(key)).await.map_err(|_| Error::PeerDead(bound))??;
        ch.last_rx = Instant::now();
        Ok(ch)
    }

    /// Authenticates an accepted connection with `key`; `nonces` (shared by every connection of
    /// the listener) refuses a replayed handshake.
    pub async fn accept(
        stream: TcpStream,
        key: &ControlKey,
        nonces: &NonceCache,
        opts: ChannelOptions,
    ) -> Result<Self> {
        let bound = opts.handshake_timeout;
        let mut ch = Self::new(stream, opts)?;
        timeout(bound, ch.acceptor_handshake(key, nonces)).await.map_err(|_| Error::PeerDead(bound))??;
        ch.last_rx = Instant::now();
        Ok(ch)
    }

    async fn connector_handshake(&mut self, key: &ControlKey) -> Result<()> {
        let nc = nonce()?;
        self.send(&Msg::Hello { version: VERSION, nonce: nc }).await?;
        let Msg::Challenge { nonce: na, proof } = self.handshake_msg().await? else {
            return Err(Error::Auth);
        };
        if na == nc {
            return Err(Error::Auth); // our own nonce reflected back
        }
        key.verify_acceptor(&nc, &na, &proof)?;
        self.send(&Msg::Proof { proof: key.connector_proof(&na, &nc) }).await
    }

    async fn acceptor_handshake(&mut self, key: &ControlKey, nonces: &NonceCache) -> Result<()> {
        let Msg::Hello { version, nonce: nc } = self.handshake_msg().await? else {
            return Err(Error::Auth);
        };
        if version != VERSION {
            return Err(Error::Codec("unsupported control protocol version"));
        }
        let na = nonce()?;
        if nc == na || !nonces.insert(nc) {
            return Err(Error::Auth); // a replayed Hello
        }
        self.send(&Msg::Challenge { nonce: na, proof: key.acceptor_proof(&nc, &na) }).await?;
        let Msg::Proof { proof } = self.handshake_msg().await? else {
            return Err(Error::Auth);
        };
        key.verify_connector(&na, &nc, &proof)
    }

    /// Reads one handshake frame, refusing anything longer than a handshake message.
    async fn handshake_msg(&mut self) -> Result<Msg> {
        loop {
            if let Some(prefix) = self.rbuf.get(..4) {
                if u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize > HANDSHAKE_MAX_FRAME {
                    return Err(Error::Auth);
                }
            }
            if let Some((msg, n)) = parse(&self.rbuf)? {
                self.rbuf.advance(n);
                return Ok(msg);
            }
            if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                return Err(Error::Closed);
            }
        }
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// Sends one message (waits until it is written to the socket). A transfer whose socket
    /// would travel beside the frame is refused: no descriptor crosses hosts.
    pub async fn send(&mut self, msg: &Msg) -> Result<()> {
        tcp_may_carry(msg)?;
        encode(msg, &mut self.wbuf);
        self.flush().await
    }

    async fn flush(&mut self) -> Result<()> {
        while self.wbuf.has_remaining() {
            if self.stream.write_buf(&mut self.wbuf).await? == 0 {
                return Err(Error::Closed);
            }
        }
        self.last_tx = Instant::now();
        Ok(())
    }

    /// The next message from the peer. Heartbeats are consumed here; while waiting, this sends
    /// our own heartbeats. Fails with [`Error::PeerDead`] after `dead_after` of silence, with
    /// [`Error::Closed`] when the peer closes, and with [`Error::Codec`] on a malformed frame or
    /// a handshake message after authentication or a passed socket (the channel is then
    /// unusable: drop it).
    pub async fn recv(&mut self) -> Result<Msg> {
        loop {
            if let Some((msg, n)) = parse(&self.rbuf)? {
                self.rbuf.advance(n);
                match msg {
                    Msg::Heartbeat => continue,
                    m if m.is_handshake() => return Err(Error::Codec("handshake message after authentication")),
                    m => return tcp_may_carry(&m).map(|()| m),
                }
            }
            self.wait_for_bytes().await?;
        }
    }

    /// Sends a heartbeat whenever one is due, until a write fails (it never returns `Ok`): for
    /// a side busy elsewhere and not in [`ControlChannel::recv`] (the agent serving a request),
    /// so that its peer does not declare it dead. Cancel-safe like `send`.
    pub async fn heartbeats(&mut self) -> Result<Infallible> {
        let dead_after = self.opts.dead_after;
        loop {
            sleep_until(self.last_tx + self.opts.heartbeat.max(Duration::from_millis(1))).await;
            encode(&Msg::Heartbeat, &mut self.wbuf);
            timeout(dead_after, self.flush()).await.map_err(|_| Error::PeerDead(dead_after))??;
        }
    }

    /// Checks, without waiting, that a channel kept idle can carry another exchange: consumes
    /// the heartbeats that arrived meanwhile and fails if the peer closed, sent anything else
    /// (nobody asked), was silent for `dead_after`, or may have declared *us* dead (nothing
    /// sent for half of `dead_after`: its bound runs from our last bytes). Then drop the channel
    /// and connect a new one.
    pub fn refresh(&mut self) -> Result<()> {
        loop {
            self.rbuf.reserve(8192);
            match self.stream.try_read_buf(&mut self.rbuf) {
                Ok(0) => return Err(Error::Closed),
                Ok(_) => self.last_rx = Instant::now(),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e.into()),
            }
        }
        while let Some((msg, n)) = parse(&self.rbuf)? {
            self.rbuf.advance(n);
            if msg != Msg::Heartbeat {
                return Err(Error::Codec("unexpected message on an idle channel"));
            }
        }
        let dead_after = self.opts.dead_after;
        if self.last_rx.elapsed() >= dead_after || self.last_tx.elapsed() >= dead_after / 2 {
            return Err(Error::PeerDead(dead_after));
        }
        Ok(())
    }

    /// Reads more bytes, sending a heartbeat when one is due; fails when the peer is silent.
    async fn wait_for_bytes(&mut self) -> Result<()> {
        let dead_after = self.opts.dead_after;
        let dead_at = self.last_rx + dead_after;
        let beat_at = self.last_tx + self.opts.heartbeat.max(Duration::from_millis(1));
        self.rbuf.reserve(8192);
        tokio::select! {
            // Bytes that arrived count even when a deadline passed meanwhile.
            biased;
            n = self.stream.read_buf(&mut self.rbuf) => {
                if n? == 0 {
                    return Err(Error::Closed);
                }
                self.last_rx = Instant::now();
            }
            () = sleep_until(beat_at) => {
                encode(&Msg::Heartbeat, &mut self.wbuf);
                // A peer that stops reading is as dead as one that stops writing.
                timeout(dead_after, self.flush()).await.map_err(|_| Error::PeerDead(dead_after))??;
            }
            () = sleep_until(dead_at) => return Err(Error::PeerDead(dead_after)),
        }
        Ok(())
    }
}

impl Carrier for ControlChannel {
    const SAME_HOST: bool = false;

    async fn send(&mut self, msg: &Msg, fd: Option<BorrowedFd<'_>>) -> Result<()> {
        if fd.is_some() {
            return Err(Error::Codec("a descriptor on a TCP channel"));
        }
        ControlChannel::send(self, msg).await
    }

    async fn recv(&mut self) -> Result<(Msg, Option<OwnedFd>)> {
        Ok((ControlChannel::recv(self).await?, None))
    }

    async fn beat(&mut self) -> Result<Infallible> {
        self.heartbeats().await
    }
}
