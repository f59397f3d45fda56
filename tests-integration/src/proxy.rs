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
//!
//! Held connections ([`Proxy::hold`]): the bytes of every connection open then are held back,
//! both ways, until the test lets one direction of one connection go
//! ([`Proxy::release_to_server`], [`Proxy::release`]) or closes it ([`Proxy::sever`]): an
//! interleaving of replies and commands across connections, the same every run.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
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
    /// Every connection forwarded without lag, in the order accepted (its id is its index).
    links: Mutex<Vec<Arc<Link>>>,
    /// The port of the server new connections go to.
    target: AtomicU16,
}

/// One forwarded connection's two directions (0: client to server, 1: server to client).
struct Link {
    /// Bytes held back in each direction while `Some`.
    held: [Mutex<Option<Vec<u8>>>; 2],
    /// Where each direction writes (the server's socket, the client's).
    to: [TcpStream; 2],
}

impl Link {
    /// Passes `bytes` on in direction `dir`, or keeps them while that direction is held.
    /// False when the write failed.
    fn pass(&self, dir: usize, bytes: &[u8], alive: bool) -> bool {
        let mut held = self.held[dir].lock().expect("held bytes");
        if let Some(queue) = held.as_mut() {
            queue.extend_from_slice(bytes);
            return true;
        }
        // Written under the lock: a release's flush and later bytes keep their order.
        !alive || (&self.to[dir]).write_all(bytes).is_ok()
    }

    /// Stops holding direction `dir`, passing on what was held.
    fn release(&self, dir: usize) {
        let mut held = self.held[dir].lock().expect("held bytes");
        if let Some(bytes) = held.take() {
            let _ = (&self.to[dir]).write_all(&bytes);
        }
    }
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
        state.target.store(server_port, Ordering::SeqCst);
        let accepting = Arc::clone(&state);
        thread::spawn(move || {
            for client in listener.incoming() {
                if accepting.stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                let target = accepting.target.load(Ordering::SeqCst);
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
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
                let link = match (server.try_clone(), client.try_clone()) {
                    (Ok(to_server), Ok(to_client)) if lag.is_zero() => Some(Arc::new(Link {
                        held: [Mutex::new(None), Mutex::new(None)],
                        to: [to_server, to_client],
                    })),
                    _ => None,
                };
                if let Some(link) = &link {
                    accepting.links.lock().expect("links").push(Arc::clone(link));
                }
                let (link_up, link_down) = (link.clone(), link);
                thread::spawn(move || pump(client, server, born, &up, link_up.map(|l| (l, 0))));
                if lag.is_zero() {
                    thread::spawn(move || pump(s2, c2, born, &down, link_down.map(|l| (l, 1))));
                } else {
                    thread::spawn(move || pump_late(s2, c2, lag, born, &down));
                }
            }
        });
        Self { port, state }
    }

    /// Sends new connections to the server at `port` from now on (open ones stay where they
    /// are): the client's way to whichever server is the master now.
    pub fn retarget(&self, port: u16) {
        self.state.target.store(port, Ordering::SeqCst);
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

    /// Holds back the bytes of every connection open now (forwarded without lag), both ways,
    /// until [`Self::release_to_server`], [`Self::release`] or [`Self::sever`]; returns their
    /// ids, in the order they were accepted (the newest last). Connections accepted later
    /// forward normally.
    pub fn hold(&self) -> Vec<usize> {
        let links = self.state.links.lock().expect("links");
        for link in links.iter() {
            for dir in &link.held {
                dir.lock().expect("held bytes").get_or_insert_with(Vec::new);
            }
        }
        (0..links.len()).collect()
    }

    /// How many bytes from the client connection `id` holds back (sent, not passed on).
    #[must_use]
    pub fn held_from_client(&self, id: usize) -> usize {
        self.link(id).held[0].lock().expect("held bytes").as_ref().map_or(0, Vec::len)
    }

    /// Passes on what the client sent on connection `id`, and forwards it from then on (the
    /// server's bytes stay held).
    pub fn release_to_server(&self, id: usize) {
        self.link(id).release(0);
    }

    /// Passes on what connection `id` held, both ways, and forwards it from then on.
    pub fn release(&self, id: usize) {
        let link = self.link(id);
        link.release(0);
        link.release(1);
    }

    /// Closes connection `id` at both ends, dropping what it held: the client sees its
    /// connection closed (a reply it waits for never comes).
    pub fn sever(&self, id: usize) {
        let link = self.link(id);
        for (dir, to) in link.to.iter().enumerate() {
            *link.held[dir].lock().expect("held bytes") = Some(Vec::new()); // nothing more
            let _ = to.shutdown(Shutdown::Both);
        }
    }

    fn link(&self, id: usize) -> Arc<Link> {
        Arc::clone(&self.state.links.lock().expect("links")[id])
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
/// With a link: in its direction, held while the test holds it.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    born: u64,
    state: &State,
    link: Option<(Arc<Link>, usize)>,
) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let passed = match &link {
            Some((link, dir)) => link.pass(*dir, &buf[..n], state.alive(born)),
            None => !state.alive(born) || to.write_all(&buf[..n]).is_ok(),
        };
        if !passed {
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
