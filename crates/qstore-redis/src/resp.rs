//! RESP on the wire: requests (arrays of bulk strings, or inline commands as `redis-cli`
//! and telnet users type them) in, replies out in RESP2 or, after `HELLO 3`, RESP3.

use qstore_workload::kv::parse_int;

/// Most arguments in one request (Redis's own limit).
const MAX_ARGS: usize = 1024 * 1024;
/// Longest inline command line (Redis's own limit).
const MAX_INLINE: usize = 64 * 1024;
/// Longest line holding a count (`*N`, `$N`).
const MAX_COUNT_LINE: usize = 32;

/// A reply, in the protocol's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resp {
    Simple(&'static str),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    /// Nil: `$-1` in RESP2, `_` in RESP3.
    Nil,
    /// A nil array (EXEC of a transaction whose watched key changed): `*-1` / `_`.
    NilArray,
    Array(Vec<Resp>),
    /// A map (RESP3 `%`; in RESP2 a flat array of keys and values).
    Map(Vec<(Resp, Resp)>),
}

impl Resp {
    pub fn ok() -> Resp {
        Resp::Simple("OK")
    }

    pub fn err(msg: impl Into<String>) -> Resp {
        Resp::Error(msg.into())
    }

    pub fn bulk(s: impl AsRef<[u8]>) -> Resp {
        Resp::Bulk(s.as_ref().to_vec())
    }

    /// Appends the reply's encoding in protocol version `proto` (2 or 3).
    pub fn encode(&self, proto: u8, out: &mut Vec<u8>) {
        match self {
            Resp::Simple(s) => line(out, b'+', s.as_bytes()),
            Resp::Error(e) => {
                // An error is one line: a line break inside would end it early.
                let e: String = e
                    .chars()
                    .map(|c| if c == '\r' || c == '\n' { ' ' } else { c })
                    .collect();
                line(out, b'-', e.as_bytes())
            }
            Resp::Int(i) => line(out, b':', i.to_string().as_bytes()),
            Resp::Bulk(b) => {
                line(out, b'$', b.len().to_string().as_bytes());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Resp::Nil if proto >= 3 => out.extend_from_slice(b"_\r\n"),
            Resp::Nil => out.extend_from_slice(b"$-1\r\n"),
            Resp::NilArray if proto >= 3 => out.extend_from_slice(b"_\r\n"),
            Resp::NilArray => out.extend_from_slice(b"*-1\r\n"),
            Resp::Array(items) => {
                line(out, b'*', items.len().to_string().as_bytes());
                items.iter().for_each(|i| i.encode(proto, out));
            }
            Resp::Map(pairs) => {
                if proto >= 3 {
                    line(out, b'%', pairs.len().to_string().as_bytes());
                } else {
                    line(out, b'*', (2 * pairs.len()).to_string().as_bytes());
                }
                for (k, v) in pairs {
                    k.encode(proto, out);
                    v.encode(proto, out);
                }
            }
        }
    }
}

fn line(out: &mut Vec<u8>, tag: u8, body: &[u8]) {
    out.push(tag);
    out.extend_from_slice(body);
    out.extend_from_slice(b"\r\n");
}

/// A request that cannot be read: the connection answers it and closes, as Redis does.
#[derive(Debug, PartialEq, Eq)]
pub struct ProtocolError(pub String);

/// A request's arguments (borrowed from the input: nothing is copied until a command keeps
/// it), and the bytes it took.
pub type Request<'a> = (Vec<&'a [u8]>, usize);

/// What a request may hold: Redis's own limits once a client is authenticated, and far
/// smaller ones before (as Redis 7.2 has), so an unauthenticated client cannot make the
/// server hold much.
#[derive(Clone, Copy, Debug)]
pub struct RequestLimits {
    pub max_args: usize,
    pub max_bulk: usize,
    pub authenticated: bool,
}

impl RequestLimits {
    pub const AUTHENTICATED: RequestLimits = RequestLimits {
        max_args: MAX_ARGS,
        max_bulk: 1 << 20,
        authenticated: true,
    };
    pub const UNAUTHENTICATED: RequestLimits = RequestLimits {
        max_args: 10,
        max_bulk: 16 << 10,
        authenticated: false,
    };

    fn too_long(&self, what: &str) -> ProtocolError {
        match self.authenticated {
            true => invalid(what),
            false => ProtocolError(format!("Protocol error: unauthenticated {what}")),
        }
    }
}

/// The next complete request in `buf`: its arguments and the bytes it took; `None` if `buf`
/// holds only part of one. An empty request (a blank inline line, `*0`) has no arguments.
pub fn next_request(
    buf: &[u8],
    limits: RequestLimits,
) -> Result<Option<Request<'_>>, ProtocolError> {
    match buf.first() {
        None => Ok(None),
        Some(b'*') => multibulk(buf, limits),
        Some(_) => Ok(inline(buf)?),
    }
}

/// `*N` then N bulk strings `$len` (the only shape of request Redis takes besides inline
/// commands). Read here rather than by a general decoder: nothing nests, a count is checked
/// before it sizes anything, and a bulk string's bytes are skipped, not scanned, while the
/// request is incomplete.
fn multibulk(buf: &[u8], limits: RequestLimits) -> Result<Option<Request<'_>>, ProtocolError> {
    let Some((count, mut at)) = header(buf, 0, "mbulk")? else {
        return Ok(None);
    };
    let count = count.map_err(|()| invalid("multibulk length"))?;
    if count > limits.max_args as i64 {
        return Err(limits.too_long("multibulk length"));
    }
    let mut args = Vec::with_capacity(count.clamp(0, 64) as usize);
    for _ in 0..count.max(0) {
        match buf.get(at) {
            None => return Ok(None),
            Some(b'$') => {}
            Some(&c) => {
                return Err(ProtocolError(format!(
                    "Protocol error: expected '$', got '{}'",
                    c as char
                )))
            }
        }
        let Some((len, next)) = header(buf, at, "bulk")? else {
            return Ok(None);
        };
        let len = match len {
            Ok(n) if (0..=limits.max_bulk as i64).contains(&n) => n as usize,
            Ok(n) if n > limits.max_bulk as i64 => return Err(limits.too_long("bulk length")),
            _ => return Err(invalid("bulk length")),
        };
        if buf.len() < next + len + 2 {
            return Ok(None);
        }
        args.push(&buf[next..next + len]);
        at = next + len + 2;
    }
    Ok(Some((args, at)))
}

/// The number after the type byte at `at` and where its line ends; `None` if the line is
/// not complete yet; an error for a line too long to be a count.
#[allow(clippy::type_complexity)]
fn header(
    buf: &[u8],
    at: usize,
    what: &str,
) -> Result<Option<(Result<i64, ()>, usize)>, ProtocolError> {
    let line = &buf[at + 1..];
    let Some(end) = line.iter().take(MAX_COUNT_LINE).position(|&b| b == b'\n') else {
        if line.len() >= MAX_COUNT_LINE {
            return Err(ProtocolError(format!(
                "Protocol error: too big {what} count string"
            )));
        }
        return Ok(None);
    };
    let text = line[..end].strip_suffix(b"\r").unwrap_or(&line[..end]);
    // Read as Redis reads it (string2ll): no plus sign, no leading zeros.
    let n = parse_int(text).ok_or(());
    Ok(Some((n, at + 1 + end + 1)))
}

fn invalid(what: &str) -> ProtocolError {
    ProtocolError(format!("Protocol error: invalid {what}"))
}

/// An inline command: one line, arguments separated by spaces.
fn inline(buf: &[u8]) -> Result<Option<Request<'_>>, ProtocolError> {
    let Some(end) = buf.iter().position(|&b| b == b'\n') else {
        if buf.len() > MAX_INLINE {
            return Err(ProtocolError(
                "Protocol error: too big inline request".into(),
            ));
        }
        return Ok(None);
    };
    let text = buf[..end].strip_suffix(b"\r").unwrap_or(&buf[..end]);
    let args = text
        .split(|b| b.is_ascii_whitespace())
        .filter(|a| !a.is_empty())
        .collect();
    Ok(Some((args, end + 1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const AUTH: RequestLimits = RequestLimits::AUTHENTICATED;

    #[test]
    fn requests_are_read_whole_or_not_at_all() {
        let req = b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n";
        for cut in 0..req.len() {
            assert_eq!(next_request(&req[..cut], AUTH), Ok(None), "cut at {cut}");
        }
        let (args, used) = next_request(req, AUTH).unwrap().unwrap();
        assert_eq!((args, used), (vec![b"GET".as_slice(), b"a"], req.len()));
        let (args, used) = next_request(b"PING  hello\r\nGET", AUTH).unwrap().unwrap();
        assert_eq!((args, used), (vec![b"PING".as_slice(), b"hello"], 13));
    }

    #[test]
    fn hostile_requests_are_refused_without_allocating() {
        let unauth = RequestLimits::UNAUTHENTICATED;
        // (request, limits, the error), the last two before AUTH: small requests only.
        let refused: [(&[u8], _, &str); 6] = [
            (b"*99999999999\r\n", AUTH, "invalid multibulk length"),
            (b"*x\r\n", AUTH, "invalid multibulk length"),
            (b"*1\r\n:5\r\n", AUTH, "expected '$', got ':'"),
            (b"*1\r\n$-5\r\n", AUTH, "invalid bulk length"),
            (b"*11\r\n", unauth, "unauthenticated multibulk length"),
            (b"*1\r\n$20000\r\n", unauth, "unauthenticated bulk length"),
        ];
        for (request, limits, why) in refused {
            let err = next_request(request, limits).unwrap_err().0;
            assert_eq!(err, format!("Protocol error: {why}"));
        }
        assert!(next_request(&vec![b'a'; MAX_INLINE + 1], AUTH).is_err());
        assert!(next_request(&[b"*1".as_slice(), &[b'1'; 40]].concat(), AUTH).is_err());
        // Nesting is not a request: refused at once, whatever its depth.
        let nested = b"*1\r\n".repeat(100_000);
        assert!(next_request(&nested, AUTH).is_err());
        // A bulk string's bytes are not needed to know the request is incomplete.
        assert_eq!(next_request(b"*1\r\n$1000000\r\nabc", AUTH), Ok(None));
    }

    #[test]
    fn replies_in_both_protocols() {
        let enc = |r: Resp, p| {
            let mut out = Vec::new();
            r.encode(p, &mut out);
            String::from_utf8(out).unwrap()
        };
        assert_eq!(enc(Resp::Nil, 2), "$-1\r\n");
        assert_eq!(enc(Resp::Nil, 3), "_\r\n");
        assert_eq!(enc(Resp::NilArray, 2), "*-1\r\n");
        let map = Resp::Map(vec![(Resp::bulk("a"), Resp::Int(1))]);
        assert_eq!(enc(map.clone(), 2), "*2\r\n$1\r\na\r\n:1\r\n");
        assert_eq!(enc(map, 3), "%1\r\n$1\r\na\r\n:1\r\n");
        assert_eq!(enc(Resp::err("ERR a\r\nb"), 2), "-ERR a  b\r\n");
    }
}
