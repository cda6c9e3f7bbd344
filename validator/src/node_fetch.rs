//! `node`'s one HTTP/1.1 GET of the agent's `/debug/node`, over the agent's unix socket or TCP:
//! a few lines here rather than an HTTP client linked into a static probe, and bounded as an
//! answer from anyone must be. The answer is bytes until it is whole: its head is read line by
//! line (at most [`MAX_HEAD`]), its body by its length, its chunks or to its end, never past
//! [`MAX_ANSWER`] (refused as soon as it would exceed it, nothing more read), then made text once
//! (not UTF-8: refused, naming the byte). Connecting, writing the request and reading the answer
//! share one deadline, [`DEADLINE`], however slowly the bytes come.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use redirect_program::logging::escape;

/// The largest body read: the view of a full node is tens of KiB (a few hundred bytes a pod),
/// and `redirect-validate` runs in containers of 64 MiB.
pub const MAX_ANSWER: usize = 16 << 20;
/// How the cap is said.
pub const MAX_ANSWER_TEXT: &str = "16 MiB";
/// The largest head (status line and headers).
const MAX_HEAD: usize = 64 << 10;
/// The largest chunk-size line.
const MAX_CHUNK_LINE: usize = 1024;
/// How much of an error answer's body is quoted.
const MAX_ERROR_BODY: usize = 4096;
/// The whole fetch's deadline: connecting, writing the request, reading the answer.
pub const DEADLINE: Duration = Duration::from_secs(15);

/// Where the agent is.
pub enum Target {
    /// Its unix socket (`<CNI_AGENT_RUN_DIR>/debug.sock`).
    Socket(PathBuf),
    /// `HOST:PORT` of its monitoring port, as `http://HOST:PORT` was given.
    Tcp { url: String, host: String },
}

impl Target {
    /// How messages name it.
    fn name(&self) -> String {
        match self {
            Target::Socket(p) => p.display().to_string(),
            Target::Tcp { url, .. } => url.clone(),
        }
    }
}

/// A connection that can bound its next read or write.
trait Conn: Read + Write + Send + 'static {
    fn bound(&self, t: Duration) -> io::Result<()>;
}

impl Conn for TcpStream {
    fn bound(&self, t: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(t))?;
        self.set_write_timeout(Some(t))
    }
}

impl Conn for UnixStream {
    fn bound(&self, t: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(t))?;
        self.set_write_timeout(Some(t))
    }
}

/// A connection whose every read and write is bounded by what is left until `until`.
struct Timed {
    conn: Box<dyn Conn>,
    until: Instant,
}

impl Timed {
    fn left(&self) -> io::Result<Duration> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.conn.bound(left)?;
        Ok(left)
    }
}

/// SO_RCVTIMEO and SO_SNDTIMEO end a call with EAGAIN.
fn timed_out(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::WouldBlock {
        io::ErrorKind::TimedOut.into()
    } else {
        e
    }
}

impl Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.left()?;
        self.conn.read(buf).map_err(timed_out)
    }
}

impl Write for Timed {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.left()?;
        self.conn.write(buf).map_err(timed_out)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.conn.flush()
    }
}

/// What went wrong, before it is said with the agent's name.
enum Failure {
    Io(io::Error),
    /// The body would exceed the cap (what showed it).
    TooBig(String),
    /// Not an answer the agent gives (why).
    Bad(String),
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure::Io(e)
    }
}

/// `GET path` from `target`: the body of a 200 answer, as text.
pub fn get(target: &Target, path: &str) -> Result<String, String> {
    let start = Instant::now();
    let until = start + DEADLINE;
    let name = target.name();
    let said = |f: Failure| match f {
        Failure::Io(e) if e.kind() == io::ErrorKind::TimedOut => format!(
            "{name}: no whole answer within the fetch's deadline of {} s (gave up after {:.1} s): \
             is the agent stalled, or is something else listening there?",
            DEADLINE.as_secs(),
            start.elapsed().as_secs_f64()
        ),
        Failure::Io(e) => format!("{name}: {e}"),
        Failure::TooBig(what) => format!(
            "{name}: the answer exceeds {MAX_ANSWER_TEXT} ({what}): no node's view is that \
             large; is this the agent's {}?",
            match target {
                Target::Socket(_) => "socket",
                Target::Tcp { .. } => "address",
            }
        ),
        Failure::Bad(why) => format!("{name}: {why}"),
    };
    let conn = connect(target, until).map_err(|e| match e.kind() {
        io::ErrorKind::TimedOut => said(Failure::Io(e)),
        _ => unreachable_agent(target, &e),
    })?;
    let host = match target {
        Target::Socket(_) => "localhost",
        Target::Tcp { host, .. } => host,
    };
    let mut conn = Timed { conn, until };
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| said(e.into()))?;
    let mut reader = BufReader::new(conn);
    let head = read_head(&mut reader).map_err(&said)?;
    if head.status != 200 {
        let body = read_body(&mut reader, &head, MAX_ERROR_BODY).unwrap_or_default();
        let body = String::from_utf8_lossy(&body);
        let body = body.trim();
        return Err(format!(
            "{name}{path} answered {}{}",
            escape(&head.status_line),
            if body.is_empty() {
                String::new()
            } else {
                format!(": {}", escape(body))
            }
        ));
    }
    let body = read_body(&mut reader, &head, MAX_ANSWER).map_err(&said)?;
    String::from_utf8(body).map_err(|e| {
        format!(
            "{name}: the answer is not UTF-8 text at byte {} of its body: is this the agent's \
             /debug/node?",
            e.utf8_error().valid_up_to()
        )
    })
}

/// The agent cannot be reached: where, why, and what to check.
fn unreachable_agent(target: &Target, e: &io::Error) -> String {
    match target {
        Target::Socket(p) => {
            let hint = match e.kind() {
                io::ErrorKind::PermissionDenied => {
                    "the node view is root's alone (mode 0600): run this as root on the node"
                }
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => {
                    "is redirect-cni-node running on this node, and CNI_AGENT_RUN_DIR this \
                     folder? Run this on the node, or in the agent's pod"
                }
                _ => "run this as root on the node, or in the agent's pod",
            };
            format!(
                "cannot reach the node agent at {}: {e} ({hint}: kubectl -n istio-system exec \
                 ds/istio-cni-node -- redirect-validate node; --socket PATH for another run \
                 directory)",
                p.display()
            )
        }
        Target::Tcp { url, .. } => format!(
            "cannot reach the node agent at {url}: {e} (is redirect-cni-node running, and its \
             MONITORING_PORT this one? Its node view is served on its socket, --socket)"
        ),
    }
}

/// Connects to `target` by `until` (name resolution included), in a thread of its own: a
/// connect that hangs is given up at the deadline.
fn connect(target: &Target, until: Instant) -> io::Result<Box<dyn Conn>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let target = match target {
        Target::Socket(p) => Target::Socket(p.clone()),
        Target::Tcp { url, host } => Target::Tcp {
            url: url.clone(),
            host: host.clone(),
        },
    };
    std::thread::spawn(move || {
        let conn = match target {
            Target::Socket(p) => UnixStream::connect(p).map(|c| Box::new(c) as Box<dyn Conn>),
            Target::Tcp { host, .. } => host.to_socket_addrs().and_then(|mut addrs| {
                let addr = addrs
                    .next()
                    .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address"))?;
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                TcpStream::connect_timeout(&addr, left).map(|c| Box::new(c) as Box<dyn Conn>)
            }),
        };
        let _ = tx.send(conn);
    });
    rx.recv_timeout(until.saturating_duration_since(Instant::now()))
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?
}

/// An answer's status and how its body is framed.
#[derive(Debug)]
struct Head {
    status_line: String,
    status: u16,
    length: Option<usize>,
    chunked: bool,
}

/// One line of at most `max` bytes (its CRLF or LF dropped); `None` at the end of the stream.
fn line(r: &mut impl BufRead, max: usize, what: &str) -> Result<Option<Vec<u8>>, Failure> {
    let mut l = Vec::new();
    (&mut *r).take(max as u64 + 1).read_until(b'\n', &mut l)?;
    if l.is_empty() {
        return Ok(None);
    }
    if l.last() != Some(&b'\n') {
        return Err(Failure::Bad(if l.len() > max {
            format!("{what} longer than {max} bytes: not an answer of the agent")
        } else {
            format!("the answer ended inside its {what}")
        }));
    }
    l.pop();
    if l.last() == Some(&b'\r') {
        l.pop();
    }
    Ok(Some(l))
}

fn read_head(r: &mut impl BufRead) -> Result<Head, Failure> {
    let first = line(r, MAX_HEAD, "status line")?
        .ok_or_else(|| Failure::Bad("closed without an answer".into()))?;
    let status_line = String::from_utf8_lossy(&first).into_owned();
    let status = first
        .strip_prefix(b"HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|code| std::str::from_utf8(code).ok())
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| {
            let shown: String = status_line.chars().take(80).collect();
            Failure::Bad(format!(
                "an answer that is not HTTP/1 ({:?}...)",
                escape(&shown)
            ))
        })?;
    let mut head = Head {
        status_line,
        status,
        length: None,
        chunked: false,
    };
    let mut used = first.len();
    loop {
        let l = line(r, MAX_HEAD.saturating_sub(used), "head")?
            .ok_or_else(|| Failure::Bad("the answer ended inside its head".into()))?;
        used += l.len() + 2;
        if l.is_empty() {
            return Ok(head);
        }
        let Some(colon) = l.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&l[..colon], String::from_utf8_lossy(&l[colon + 1..]));
        let value = value.trim();
        if name.eq_ignore_ascii_case(b"content-length") {
            head.length = Some(value.parse().map_err(|_| {
                Failure::Bad(format!(
                    "a Content-Length that is no length ({:?})",
                    escape(value)
                ))
            })?);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            head.chunked = value
                .rsplit(',')
                .next()
                .is_some_and(|c| c.trim().eq_ignore_ascii_case("chunked"));
        }
    }
}

/// The body as `head` frames it, at most `cap` bytes.
fn read_body(r: &mut impl BufRead, head: &Head, cap: usize) -> Result<Vec<u8>, Failure> {
    if head.chunked {
        return unchunk(r, cap);
    }
    if let Some(n) = head.length {
        if n > cap {
            return Err(Failure::TooBig(format!("Content-Length {n}")));
        }
        let mut body = Vec::with_capacity(n);
        (&mut *r).take(n as u64).read_to_end(&mut body)?;
        if body.len() < n {
            return Err(Failure::Bad(format!(
                "the answer ended after {} of its {n} bytes",
                body.len()
            )));
        }
        return Ok(body);
    }
    // To its end: the room for the cap is reserved (address space, not memory), so that
    // growing never copies.
    let mut body = Vec::with_capacity(cap + 1);
    (&mut *r).take(cap as u64 + 1).read_to_end(&mut body)?;
    if body.len() > cap {
        return Err(Failure::TooBig(format!(
            "more than {cap} bytes and no end yet"
        )));
    }
    Ok(body)
}

/// A chunked body, joined on bytes (a chunk may end inside a character).
fn unchunk(r: &mut impl BufRead, cap: usize) -> Result<Vec<u8>, Failure> {
    let mut body = Vec::new();
    loop {
        let l = line(r, MAX_CHUNK_LINE, "chunk size")?
            .ok_or_else(|| Failure::Bad("the answer ended before its last chunk".into()))?;
        let size = String::from_utf8_lossy(&l);
        let size = size.split(';').next().unwrap_or("").trim();
        let n = usize::from_str_radix(size, 16).map_err(|_| {
            Failure::Bad(format!(
                "a chunk size that is no hexadecimal number ({:?})",
                escape(size)
            ))
        })?;
        if n == 0 {
            return Ok(body);
        }
        let total = body.len().saturating_add(n);
        if total > cap {
            return Err(Failure::TooBig(format!(
                "{total} bytes in its chunks so far"
            )));
        }
        if body.capacity() < total {
            body.reserve(total.max(body.len() * 2).min(cap) - body.len());
        }
        let before = body.len();
        (&mut *r).take(n as u64).read_to_end(&mut body)?;
        if body.len() - before < n {
            return Err(Failure::Bad("the answer ended inside a chunk".into()));
        }
        match line(r, 2, "chunk's end")? {
            Some(l) if l.is_empty() => {}
            _ => return Err(Failure::Bad("a chunk longer than its size".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head_and_body(raw: &[u8], cap: usize) -> Result<(Head, Vec<u8>), Failure> {
        let mut r = BufReader::new(raw);
        let head = read_head(&mut r)?;
        let body = read_body(&mut r, &head, cap)?;
        Ok((head, body))
    }

    fn failure(f: Failure) -> String {
        match f {
            Failure::Io(e) => format!("io: {e}"),
            Failure::TooBig(w) => format!("too big: {w}"),
            Failure::Bad(w) => format!("bad: {w}"),
        }
    }

    #[test]
    fn chunked_bodies_are_joined_on_bytes() {
        let (head, body) = head_and_body(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nwiki\r\n5;x=y\r\npedia\r\n0\r\n\r\n",
            100,
        )
        .map_err(failure)
        .unwrap();
        assert_eq!(head.status, 200);
        assert_eq!(body, b"wikipedia");
        // "é" is C3 A9: a chunk ends after C3.
        let (_, body) = head_and_body(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\ncq\xc3\r\n2\r\n\xa9!\r\n0\r\n\r\n",
            100,
        )
        .map_err(failure)
        .unwrap();
        assert_eq!(String::from_utf8(body).unwrap(), "cqé!");
    }

    #[test]
    fn the_cap_holds_for_every_framing() {
        for raw in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world"[..],
            b"HTTP/1.1 200 OK\r\n\r\nhello world",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nhello \r\n5\r\nworld\r\n0\r\n\r\n",
        ] {
            let e = failure(head_and_body(raw, 10).map(|_| ()).unwrap_err());
            assert!(e.starts_with("too big"), "{e}");
            let (_, body) = head_and_body(raw, 11).map_err(failure).unwrap();
            assert_eq!(body, b"hello world");
        }
    }

    #[test]
    fn broken_answers_are_named() {
        for (raw, want) in [
            (&b""[..], "closed without an answer"),
            (b"SSH-2.0-OpenSSH\r\n\r\n", "not HTTP/1"),
            (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", "no length"),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab",
                "after 2 of its 5",
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                "no hexadecimal",
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n",
                "longer than its size",
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
                "inside a chunk",
            ),
            (b"HTTP/1.1 200 OK\r\nX: y", "inside its head"),
        ] {
            let e = failure(head_and_body(raw, 100).map(|_| ()).unwrap_err());
            assert!(e.contains(want), "{:?}: {e}", String::from_utf8_lossy(raw));
        }
    }
}
