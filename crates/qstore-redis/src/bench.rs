//! A Redis client load: YCSB-16 as Redis transactions (`MULTI`, 8 `GET`s, 8 `INCR`s,
//! `EXEC`), sent as one pipeline per transaction by each client, against any server that
//! speaks RESP: qstore's Redis port or a real `redis-server`, so the two compare directly.
//! The same transaction can also run as a Lua script (`EVALSHA`), Redis's other way to run
//! several commands atomically, on servers that run scripts (qstore's port does not).

use crate::resp::Resp;
use redis_protocol::resp2::decode::decode;
use redis_protocol::resp2::types::OwnedFrame;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// What to run.
#[derive(Clone, Debug)]
pub struct Spec {
    pub addr: SocketAddr,
    pub password: Option<String>,
    pub clients: usize,
    pub duration: Duration,
    /// Keys `key:0` .. drawn uniformly.
    pub keys: u64,
    pub reads: usize,
    pub rmws: usize,
    pub form: Form,
}

/// How each transaction is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// `MULTI`, the commands, `EXEC`, in one write.
    Multi,
    /// `EVALSHA` of a script that runs the same commands.
    Lua,
}

impl Form {
    pub fn name(self) -> &'static str {
        match self {
            Form::Multi => "multi",
            Form::Lua => "lua",
        }
    }
}

/// The transaction as a script: `ARGV[1]` GETs, then INCRs of the remaining keys; it
/// answers every reply, as EXEC does.
const SCRIPT: &str = "local r = {} \
local reads = tonumber(ARGV[1]) \
for i = 1, #KEYS do \
  if i <= reads then r[i] = redis.call('GET', KEYS[i]) else r[i] = redis.call('INCR', KEYS[i]) end \
end \
return r";

/// What it measured.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub committed: u64,
    /// EXECs answered with an error (none expected).
    pub errors: u64,
    pub seconds: f64,
    pub p50_us: u64,
    pub p99_us: u64,
}

impl Outcome {
    pub fn txn_per_s(&self) -> f64 {
        self.committed as f64 / self.seconds
    }
}

/// Runs the load for `spec.duration` and reports.
pub fn run(spec: &Spec) -> io::Result<Outcome> {
    let began = Instant::now();
    let deadline = began + spec.duration;
    let threads: Vec<_> = (0..spec.clients)
        .map(|c| {
            let spec = spec.clone();
            std::thread::spawn(move || client(&spec, c as u64, deadline))
        })
        .collect();
    let mut out = Outcome::default();
    let mut latencies = Vec::new();
    for t in threads {
        let (committed, errors, mut lat) = t
            .join()
            .map_err(|_| io::Error::other("a client thread panicked"))??;
        out.committed += committed;
        out.errors += errors;
        latencies.append(&mut lat);
    }
    out.seconds = began.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    out.p50_us = at(0.5);
    out.p99_us = at(0.99);
    Ok(out)
}

type ClientResult = io::Result<(u64, u64, Vec<u64>)>;

fn client(spec: &Spec, seed: u64, deadline: Instant) -> ClientResult {
    let mut conn = Conn::open(spec.addr)?;
    if let Some(p) = &spec.password {
        let reply = conn.call(&[&[b"AUTH", p.as_bytes()]])?;
        if !matches!(reply[0], OwnedFrame::SimpleString(_)) {
            return Err(io::Error::other(format!("AUTH refused: {:?}", reply[0])));
        }
    }
    let sha = match spec.form {
        Form::Multi => None,
        Form::Lua => Some(conn.load_script()?),
    };
    let reads = spec.reads.to_string();
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        // xorshift: a different stream per client, no dependency for a load generator.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut committed, mut errors, mut latencies) = (0, 0, Vec::new());
    while Instant::now() < deadline {
        let keys: Vec<Vec<u8>> = (0..spec.reads + spec.rmws)
            .map(|_| format!("key:{}", next() % spec.keys.max(1)).into_bytes())
            .collect();
        let numkeys = keys.len().to_string();
        let cmds: Vec<Vec<&[u8]>> = match &sha {
            None => multi(&keys, spec.reads),
            Some(sha) => {
                let mut eval: Vec<&[u8]> = vec![b"EVALSHA", sha.as_bytes(), numkeys.as_bytes()];
                eval.extend(keys.iter().map(Vec::as_slice));
                eval.push(reads.as_bytes());
                vec![eval]
            }
        };
        let refs: Vec<&[&[u8]]> = cmds.iter().map(Vec::as_slice).collect();
        let sent = Instant::now();
        let replies = conn.call(&refs)?;
        latencies.push(sent.elapsed().as_micros() as u64);
        match replies.last() {
            Some(OwnedFrame::Array(items)) if items.len() == keys.len() => committed += 1,
            _ => errors += 1,
        }
    }
    Ok((committed, errors, latencies))
}

/// `MULTI`, a GET of each of the first `reads` keys and an INCR of each other key, `EXEC`.
fn multi(keys: &[Vec<u8>], reads: usize) -> Vec<Vec<&[u8]>> {
    let mut cmds: Vec<Vec<&[u8]>> = vec![vec![b"MULTI"]];
    for (i, k) in keys.iter().enumerate() {
        let verb: &[u8] = if i < reads { b"GET" } else { b"INCR" };
        cmds.push(vec![verb, k]);
    }
    cmds.push(vec![b"EXEC"]);
    cmds
}

/// A blocking RESP2 connection.
struct Conn {
    stream: TcpStream,
    input: Vec<u8>,
}

impl Conn {
    fn open(addr: SocketAddr) -> io::Result<Conn> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Conn {
            stream,
            input: Vec::new(),
        })
    }

    /// Loads the transaction's script and answers its SHA1, or says the server runs none.
    fn load_script(&mut self) -> io::Result<String> {
        let reply = self.call(&[&[b"SCRIPT", b"LOAD", SCRIPT.as_bytes()]])?;
        match &reply[0] {
            OwnedFrame::BulkString(sha) => Ok(String::from_utf8_lossy(sha).into_owned()),
            other => {
                // An unknown command's error quotes its arguments: the whole script.
                let said = match other {
                    OwnedFrame::Error(e) => e.split(", with args").next().unwrap_or(e).to_string(),
                    other => format!("{other:?}"),
                };
                Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("the server runs no Lua scripts (SCRIPT LOAD answered: {said})"),
                ))
            }
        }
    }

    /// Sends `cmds` in one write and reads one reply each.
    fn call(&mut self, cmds: &[&[&[u8]]]) -> io::Result<Vec<OwnedFrame>> {
        let mut req = Vec::new();
        for args in cmds {
            let array = Resp::Array(args.iter().map(Resp::bulk).collect());
            array.encode(2, &mut req);
        }
        self.stream.write_all(&req)?;
        let mut replies = Vec::with_capacity(cmds.len());
        let mut chunk = [0u8; 16 << 10];
        while replies.len() < cmds.len() {
            match decode(&self.input) {
                Ok(Some((frame, n))) => {
                    self.input.drain(..n);
                    replies.push(frame);
                    continue;
                }
                Ok(None) => {}
                Err(e) => return Err(io::Error::other(format!("bad reply: {e}"))),
            }
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(io::Error::other("the server closed the connection"));
            }
            self.input.extend_from_slice(&chunk[..n]);
        }
        Ok(replies)
    }
}
