//! RESP on the wire: requests (arrays of bulk strings, or inline commands as `redis-cli`
//! and telnet users type them) in, replies out in RESP2 or, after `HELLO 3`, RESP3.

use redis_protocol::resp2::decode::decode;
use redis_protocol::resp2::types::OwnedFrame;

/// Most arguments in one request (Redis's own limit).
const MAX_ARGS: usize = 1024 * 1024;
/// Longest inline command line (Redis's own limit).
const MAX_INLINE: usize = 64 * 1024;

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

/// A request's arguments, and the bytes it took.
pub type Request = (Vec<Vec<u8>>, usize);

/// The next complete request in `buf`: its arguments and the bytes it took; `None` if `buf`
/// holds only part of one. An empty request (a blank inline line, `*0`) has no arguments.
pub fn next_request(buf: &[u8]) -> Result<Option<Request>, ProtocolError> {
    match buf.first() {
        None => Ok(None),
        Some(b'*') => multibulk(buf),
        Some(_) => Ok(inline(buf)?),
    }
}

fn multibulk(buf: &[u8]) -> Result<Option<Request>, ProtocolError> {
    // The count is checked before the decoder sees it: a hostile one must not size anything.
    let Some(end) = buf.iter().position(|&b| b == b'\n') else {
        return Ok(None);
    };
    let count = std::str::from_utf8(&buf[1..end])
        .ok()
        .map(str::trim_end)
        .and_then(|s| s.parse::<i64>().ok());
    match count {
        Some(n) if n > MAX_ARGS as i64 => return Err(invalid("multibulk length")),
        Some(_) => {}
        None => return Err(invalid("multibulk length")),
    }
    let (frame, used) = match decode(buf) {
        Ok(Some(found)) => found,
        Ok(None) => return Ok(None),
        Err(e) => return Err(ProtocolError(format!("Protocol error: {e}"))),
    };
    let OwnedFrame::Array(items) = frame else {
        return Ok(Some((Vec::new(), used))); // `*-1`: nothing to run
    };
    let args = items
        .into_iter()
        .map(|f| match f {
            OwnedFrame::BulkString(b) => Ok(b),
            _ => Err(ProtocolError(
                "Protocol error: expected '$', got something else".into(),
            )),
        })
        .collect::<Result<_, _>>()?;
    Ok(Some((args, used)))
}

fn invalid(what: &str) -> ProtocolError {
    ProtocolError(format!("Protocol error: invalid {what}"))
}

/// An inline command: one line, arguments separated by spaces.
fn inline(buf: &[u8]) -> Result<Option<Request>, ProtocolError> {
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
        .map(<[u8]>::to_vec)
        .collect();
    Ok(Some((args, end + 1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_read_whole_or_not_at_all() {
        let req = b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n";
        for cut in 0..req.len() {
            assert_eq!(next_request(&req[..cut]), Ok(None), "cut at {cut}");
        }
        let (args, used) = next_request(req).unwrap().unwrap();
        assert_eq!(
            (args, used),
            (vec![b"GET".to_vec(), b"a".to_vec()], req.len())
        );
        let (args, used) = next_request(b"PING  hello\r\nGET").unwrap().unwrap();
        assert_eq!(
            (args, used),
            (vec![b"PING".to_vec(), b"hello".to_vec()], 13)
        );
    }

    #[test]
    fn hostile_requests_are_refused_without_allocating() {
        assert!(next_request(b"*99999999999\r\n").is_err());
        assert!(next_request(b"*x\r\n").is_err());
        assert!(next_request(b"*1\r\n:5\r\n").is_err());
        assert!(next_request(&vec![b'a'; MAX_INLINE + 1]).is_err());
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
