//! A TCP proxy in front of a server that can stop forwarding without a word ([`Proxy::cut`]:
//! a host gone, a cut link, a NAT entry dropped) and heal ([`Proxy::heal`]).
//!
//! A cut kills every connection open at that moment, and every one accepted while cut, *silently*
//! and for good: bytes either way are read and dropped, nothing is closed or reset (the proxy's
//! kernel still answers TCP keepalive probes, so keepalive notices nothing), and a close by one
//! side is not passed on. After [`Proxy::heal`], new connections forward normally; the dead ones
//! stay dead (their streams lost bytes). Dropping the proxy closes every socket.
//!
//! A slow link ([`Proxy::delay`]): every connection accepted from then on gets the server's
//! bytes that much later (in order; the client's bytes go through at once), as over a link
//! whose answers lag.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// A connection's cut generation when it was accepted during a cut: dead from the start.
const BORN_DEAD: u64 = u64::MAX;

#[derive(Default)]
struct State {
    /// Set while cut: connections accepted now are dead.
    cut: AtomicBool,
    /// Cuts so far: a connection accepted under an earlier count is dead.
    cuts: AtomicU64,
    stopped: AtomicBool,
    /// How long the server's bytes are held back on connections accepted now (ms).
    delay_ms: AtomicU64,
    /// Every socket, to close them all on drop.
    sockets: Mutex<Vec<TcpStream>>,
}

impl State {
    fn alive(&self, born: u64) -> bool {
        born == self.cuts.load(Ordering::SeqCst) && !self.cut.load(Ordering::SeqCst)
    }
}

/// A proxy on a free loopback port in front of `127.0.0.1:<server port>`.
pub struct Proxy {
    port: u16,
    state: Arc<State>,
}

impl Proxy {
    /// Starts forwarding to the server at `server_port`.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    #[must_use]
    pub fn start(server_port: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("the proxy's address").port();
        let state = Arc::new(State::default());
        let accepting = Arc::clone(&state);
        thread::spawn(move || {
            for client in listener.incoming() {
                if accepting.stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", server_port)) else {
                    continue; // the server is down: the client sees its connection closed
                };
                let born = if accepting.cut.load(Ordering::SeqCst) {
                    BORN_DEAD
                } else {
                    accepting.cuts.load(Ordering::SeqCst)
                };
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else { continue };
                if let (Ok(c3), Ok(s3)) = (client.try_clone(), server.try_clone()) {
                    accepting.sockets.lock().expect("sockets").extend([c3, s3]);
                }
                let (up, down) = (Arc::clone(&accepting), Arc::clone(&accepting));
                let lag = Duration::from_millis(accepting.delay_ms.load(Ordering::SeqCst));
                thread::spawn(move || pump(client, server, born, &up));
                if lag.is_zero() {
                    thread::spawn(move || pump(s2, c2, born, &down));
                } else {
                    thread::spawn(move || pump_late(s2, c2, lag, born, &down));
                }
            }
        });
        Self { port, state }
    }

    /// The proxy's port.
    #[must_use]
    pub const fn port(&self) -> u16 {
        self.port
    }

    /// The proxy's URL (`redis://127.0.0.1:<port>/`).
    #[must_use]
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Stops forwarding silently: every connection open now or accepted until [`Self::heal`]
    /// is dead for good.
    pub fn cut(&self) {
        self.state.cut.store(true, Ordering::SeqCst);
        self.state.cuts.fetch_add(1, Ordering::SeqCst);
    }

    /// New connections forward again (the dead ones stay dead).
    pub fn heal(&self) {
        self.state.cut.store(false, Ordering::SeqCst);
    }

    /// A slow link for every connection accepted from now on: the server's bytes reach the
    /// client `lag` after they came (in order); the client's reach the server at once.
    /// Connections open now keep their pace. `Duration::ZERO` ends it for new connections.
    pub fn delay(&self, lag: Duration) {
        let ms = u64::try_from(lag.as_millis()).unwrap_or(u64::MAX);
        self.state.delay_ms.store(ms, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port)); // wakes the accept loop
        for socket in self.state.sockets.lock().expect("sockets").drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }
}

/// Copies `from` to `to` while the connection is alive; once dead, reads and drops. A close
/// is passed on only while alive.
fn pump(mut from: TcpStream, mut to: TcpStream, born: u64, state: &State) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if state.alive(born) && to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    if state.alive(born) || state.stopped.load(Ordering::SeqCst) {
        let _ = to.shutdown(Shutdown::Both);
    }
}

/// As [`pump`], each chunk passed on `lag` after it was read (in order, by a writer thread).
fn pump_late(mut from: TcpStream, mut to: TcpStream, lag: Duration, born: u64, state: &Arc<State>) {
    let (late, due) = mpsc::channel::<(Instant, Vec<u8>)>();
    let writing = Arc::clone(state);
    let writer = thread::spawn(move || {
        for (at, bytes) in due {
            thread::sleep(at.saturating_duration_since(Instant::now()));
            if writing.alive(born) && to.write_all(&bytes).is_err() {
                return;
            }
        }
        if writing.alive(born) || writing.stopped.load(Ordering::SeqCst) {
            let _ = to.shutdown(Shutdown::Both);
        }
    });
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if late.send((Instant::now() + lag, buf[..n].to_vec())).is_err() {
            break;
        }
    }
    drop(late);
    let _ = writer.join();
}
