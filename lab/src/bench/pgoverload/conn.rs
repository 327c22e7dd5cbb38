//! [`PgConn`]: the smallest async PostgreSQL client the open loop needs, made of refract-pg's
//! codec: log in (SCRAM, md5 or trust) and run a simple Query, returning its SQLSTATE if it
//! failed.

use anyhow::{anyhow, bail, Context, Result};
use bytes::BytesMut;
use refract_pg::auth::{ClientAuth, ClientStep};
use refract_pg::startup::PROTOCOL_3_0;
use refract_pg::{BackendMessage, FrontendMessage, Limits, Startup, StartupPacket};
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One logged-in client connection.
#[derive(Debug)]
pub struct PgConn {
    stream: TcpStream,
    buf: BytesMut,
}

impl PgConn {
    /// Connects to `addr` and logs in as `user` to `database`.
    pub async fn connect(addr: SocketAddr, user: &str, password: &str, database: &str) -> Result<PgConn> {
        let stream = TcpStream::connect(addr).await.with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        let mut c = PgConn { stream, buf: BytesMut::with_capacity(8192) };
        let params = vec![("user".into(), user.into()), ("database".into(), database.into())];
        let mut out = BytesMut::new();
        StartupPacket::Startup(Startup { protocol: PROTOCOL_3_0, params }).encode(&mut out);
        c.stream.write_all(&out).await?;
        let mut auth = ClientAuth::new(user, Some(password));
        loop {
            match c.recv().await? {
                BackendMessage::Authentication(a) => {
                    if let ClientStep::Send(b) = auth.step(&a).map_err(|e| anyhow!("login: {e}"))? {
                        c.stream.write_all(&b).await?;
                    }
                }
                BackendMessage::ErrorResponse(e) => bail!("login refused: {}", e.message().unwrap_or("?")),
                BackendMessage::ReadyForQuery(_) => return Ok(c),
                _ => {}
            }
        }
    }

    /// Runs `sql`: `Ok(None)` when it succeeded, `Ok(Some(sqlstate))` when it failed.
    pub async fn query(&mut self, sql: &str) -> Result<Option<String>> {
        let mut out = BytesMut::new();
        FrontendMessage::Query(sql.into()).encode(&mut out);
        self.stream.write_all(&out).await?;
        let mut code = None;
        loop {
            match self.recv().await? {
                BackendMessage::ErrorResponse(e) => code = Some(e.code().unwrap_or("?").to_owned()),
                BackendMessage::ReadyForQuery(_) => return Ok(code),
                _ => {}
            }
        }
    }

    async fn recv(&mut self) -> Result<BackendMessage> {
        loop {
            if let Some((msg, n)) = BackendMessage::parse(&self.buf, &Limits::default())? {
                let _ = self.buf.split_to(n);
                return Ok(msg);
            }
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                bail!("the server closed the connection");
            }
        }
    }
}
