//! Test support: a tiny HTTP/1.1 server on 127.0.0.1 with scripted behaviour per path, plus
//! helpers shared by the integration tests. Loopback only; every connection gets one answer.

#![allow(dead_code)] // each test binary uses a different subset

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use sha2::{Digest, Sha256};

/// How the server answers requests for one path.
#[derive(Clone, Copy, Debug)]
pub enum Mode {
    /// 200, or 206 for `Range: bytes=N-` (416 when N is past the end).
    HonourRange,
    /// Always 200 with the whole body, whatever the Range header says.
    IgnoreRange,
    /// Like `HonourRange`, but the connection closes after this many body bytes.
    CutAfter(usize),
    /// This status with an empty body.
    Status(u16),
}

/// One request as the server saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub path: String,
    pub range: Option<String>,
}

/// A path's body and how it is served.
type Route = (Arc<Vec<u8>>, Mode);

#[derive(Default)]
struct State {
    routes: Mutex<HashMap<String, Route>>,
    log: Mutex<Vec<Request>>,
}

/// The server; stops when dropped.
pub struct Server {
    addr: SocketAddr,
    state: Arc<State>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("local address");
        let state = Arc::new(State::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (state2, stop2) = (state.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(stream) = stream {
                    let state = state2.clone();
                    std::thread::spawn(move || handle(stream, &state));
                }
            }
        });
        Self {
            addr,
            state,
            stop,
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT<path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Serves `body` at `path` in the given mode (replacing an earlier route).
    pub fn serve(&self, path: &str, body: Vec<u8>, mode: Mode) {
        self.state
            .routes
            .lock()
            .unwrap()
            .insert(path.to_string(), (Arc::new(body), mode));
    }

    /// Changes how `path` is answered, keeping its body.
    pub fn set_mode(&self, path: &str, mode: Mode) {
        if let Some(route) = self.state.routes.lock().unwrap().get_mut(path) {
            route.1 = mode;
        }
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<Request> {
        self.state.log.lock().unwrap().clone()
    }

    /// Requests for one path.
    pub fn requests_for(&self, path: &str) -> Vec<Request> {
        self.requests()
            .into_iter()
            .filter(|r| r.path == path)
            .collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr); // wake the accept loop
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn handle(stream: TcpStream, state: &State) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return; // the wake-up connection of Drop, or a client that gave up
    }
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let mut range = None;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).unwrap_or(0) == 0 || header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.trim().eq_ignore_ascii_case("range") {
                range = Some(value.trim().to_string());
            }
        }
    }
    state.log.lock().unwrap().push(Request {
        path: path.clone(),
        range: range.clone(),
    });
    let route_key = path.split('?').next().unwrap_or_default();
    let route = state.routes.lock().unwrap().get(route_key).cloned();
    let _ = respond(stream, route, range.as_deref());
}

fn respond(mut s: TcpStream, route: Option<Route>, range: Option<&str>) -> std::io::Result<()> {
    let Some((body, mode)) = route else {
        return status(&mut s, 404, "Not Found");
    };
    let start = range.and_then(|r| {
        r.strip_prefix("bytes=")?
            .strip_suffix('-')?
            .parse::<usize>()
            .ok()
    });
    let len = body.len();
    let (head, slice, cut) = match (mode, start) {
        (Mode::Status(code), _) => return status(&mut s, code, "Scripted"),
        (Mode::IgnoreRange, _) | (Mode::HonourRange | Mode::CutAfter(_), None) => (
            format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n"),
            &body[..],
            mode,
        ),
        (_, Some(n)) if n >= len => {
            let head = format!("HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{len}\r\nContent-Length: 0\r\n");
            (head, &body[..0], mode)
        }
        (_, Some(n)) => {
            let head = format!(
                "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {n}-{}/{len}\r\nContent-Length: {}\r\n",
                len - 1,
                len - n
            );
            (head, &body[n..], mode)
        }
    };
    s.write_all(format!("{head}Connection: close\r\n\r\n").as_bytes())?;
    let sent = match cut {
        Mode::CutAfter(k) => &slice[..k.min(slice.len())],
        _ => slice,
    };
    s.write_all(sent)?;
    s.flush()?;
    s.shutdown(std::net::Shutdown::Both)
}

fn status(s: &mut TcpStream, code: u16, reason: &str) -> std::io::Result<()> {
    s.write_all(
        format!("HTTP/1.1 {code} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
}

/// `n` bytes of deterministic, incompressible-looking content (xorshift), distinct per `salt`.
pub fn body(n: usize, salt: u64) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ salt.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let mut v: Vec<u8> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect();
    // it starts like a GGUF file, as a model download must
    let magic = &b"GGUF"[..n.min(4)];
    v[..magic.len()].copy_from_slice(magic);
    v
}

/// sha256 as lowercase hex.
pub fn sha_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
