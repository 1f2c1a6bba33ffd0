//! A TCP proxy in front of the runtime that loses the connection at a chosen moment.
//!
//! It forwards the HTTP/2 connection both ways and reads the frames the client sends. Once the
//! client opens its `n`th request stream, the proxy still forwards that request to the runtime
//! but withholds everything the runtime answers, until [`LossyProxy::cut`] closes both sides:
//! a runtime that received (and may have carried out) a request whose answer never arrived.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The client connection preface of HTTP/2.
const PREFACE: usize = 24;
/// The HTTP/2 `HEADERS` frame type: a client opens a request stream with it.
const HEADERS: u8 = 0x1;

/// The proxy; see the module docs. Dropping it cuts the connections.
#[derive(Debug)]
pub struct LossyProxy {
    addr: String,
    held: Arc<AtomicBool>,
    sockets: Arc<Mutex<Vec<TcpStream>>>,
}

impl LossyProxy {
    /// Listens on a free local port and forwards each connection to `upstream`, holding the
    /// runtime's answers back from the client's `nth` request (1-based) on.
    ///
    /// # Panics
    /// When it cannot listen.
    #[must_use]
    pub fn start(upstream: &str, nth: u32) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
        let addr = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|e| panic!("local addr: {e}"));
        let held = Arc::new(AtomicBool::new(false));
        let sockets = Arc::new(Mutex::new(Vec::new()));
        let upstream = upstream.to_owned();
        let (h, s) = (Arc::clone(&held), Arc::clone(&sockets));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(&upstream) else {
                    return;
                };
                let clones = (client.try_clone(), server.try_clone());
                let (Ok(client_out), Ok(server_in)) = clones else {
                    return;
                };
                if let (Ok(a), Ok(b)) = (client.try_clone(), server.try_clone())
                    && let Ok(mut list) = s.lock()
                {
                    list.extend([a, b]);
                }
                let first_held = 2 * nth - 1;
                let held_up = Arc::clone(&h);
                std::thread::spawn(move || forward_requests(client, server, first_held, &held_up));
                let held_down = Arc::clone(&h);
                std::thread::spawn(move || forward_answers(server_in, client_out, &held_down));
            }
        });
        Self {
            addr,
            held,
            sockets,
        }
    }

    /// The address to point the client at.
    #[must_use]
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Whether the client has sent the request whose answer is held back.
    #[must_use]
    pub fn holding(&self) -> bool {
        self.held.load(Ordering::SeqCst)
    }

    /// Closes every connection, both ways.
    pub fn cut(&self) {
        if let Ok(list) = self.sockets.lock() {
            for socket in list.iter() {
                let _ = socket.shutdown(Shutdown::Both);
            }
        }
    }
}

impl Drop for LossyProxy {
    fn drop(&mut self) {
        self.cut();
    }
}

/// Client → runtime, frame by frame; sets `held` before forwarding the `HEADERS` frame that
/// opens stream `first_held` or a later one.
fn forward_requests(
    mut client: TcpStream,
    mut server: TcpStream,
    first_held: u32,
    held: &AtomicBool,
) {
    let mut preface = [0_u8; PREFACE];
    if client.read_exact(&mut preface).is_err() || server.write_all(&preface).is_err() {
        return;
    }
    loop {
        let mut header = [0_u8; 9];
        if client.read_exact(&mut header).is_err() {
            break;
        }
        let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
        if header[3] == HEADERS && stream >= first_held {
            held.store(true, Ordering::SeqCst);
        }
        let mut payload = vec![0_u8; length];
        if client.read_exact(&mut payload).is_err()
            || server.write_all(&header).is_err()
            || server.write_all(&payload).is_err()
        {
            break;
        }
    }
    let _ = server.shutdown(Shutdown::Write);
}

/// Runtime → client, dropping everything once `held` is set.
fn forward_answers(mut server: TcpStream, mut client: TcpStream, held: &AtomicBool) {
    let mut buf = [0_u8; 16 * 1024];
    loop {
        match server.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if held.load(Ordering::SeqCst) {
                    continue;
                }
                if client.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = client.shutdown(Shutdown::Both);
}
