//! The same-host way in and out of an adoption ([`Move`] for [`LocalLink`]): the client socket
//! arrives as the descriptor beside the `HandOff` (SCM_RIGHTS) and goes back beside the
//! `HandBack`. The dispatcher keeps its own descriptor all along, so nothing here can fail on
//! the way back.

use std::os::fd::OwnedFd;

use refract_handover::local::LocalLink;
use refract_handover::{Result, Socket, Transfer};
use tokio::net::TcpStream;

use crate::adopt::{to_tokio, Move};
use crate::options::LocalOptions;

impl Move for LocalLink {
    fn arrive(_: &Transfer, fd: Option<OwnedFd>, _: &LocalOptions) -> std::result::Result<TcpStream, String> {
        let fd = fd.ok_or("no descriptor beside the hand-off")?;
        to_tokio(fd).map_err(|e| format!("client socket: {e}"))
    }

    async fn leave(client: TcpStream, _: &Transfer, _: &LocalOptions) -> Result<(Socket, Option<OwnedFd>)> {
        Ok((Socket::Passed, Some(OwnedFd::from(client.into_std()?))))
    }
}
