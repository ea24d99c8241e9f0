//! Commands: what a request asks for, checked as Redis checks it (the same error words, so
//! client libraries raise their usual exceptions).

use crate::resp::Resp;
use qstore_workload::kv::{parse_int, Op, Reply, MAX_KEY};

/// A data command: the single-key operations it runs in one transaction, and how their
/// replies make its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataCommand {
    pub ops: Vec<Op>,
    pub shape: Shape,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// The one operation's reply (GET, SET, INCR, ...).
    One,
    /// The sum of the operations' integer replies (DEL, EXISTS).
    Sum,
    /// An array of the replies (MGET).
    Array,
    /// OK, unless an operation failed (MSET).
    AllOk,
}

impl DataCommand {
    /// The command's reply from its operations' replies (in order).
    pub fn reply(&self, replies: Vec<Reply>) -> Resp {
        if let Some(Reply::Err(e)) = replies.iter().find(|r| matches!(r, Reply::Err(_))) {
            if self.shape != Shape::Array {
                return Resp::err(e.clone());
            }
        }
        match self.shape {
            Shape::One => replies.into_iter().next().map_or(Resp::Nil, to_resp),
            Shape::Sum => Resp::Int(
                replies
                    .iter()
                    .map(|r| if let Reply::Int(n) = r { *n } else { 0 })
                    .sum(),
            ),
            Shape::Array => Resp::Array(replies.into_iter().map(to_resp).collect()),
            Shape::AllOk => Resp::ok(),
        }
    }
}

fn to_resp(r: Reply) -> Resp {
    match r {
        Reply::Nil => Resp::Nil,
        Reply::Ok => Resp::ok(),
        Reply::Int(n) => Resp::Int(n),
        Reply::Bulk(b) => Resp::Bulk(b),
        Reply::Err(e) => Resp::Error(e),
    }
}

/// What a request asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Data(DataCommand),
    /// A command Redis accepts when queued but that fails when it runs (a syntax error, a
    /// number that is not one): its error.
    Failed(Resp),
    Ping(Option<Vec<u8>>),
    Echo(Vec<u8>),
    Select(Vec<u8>),
    Auth(Vec<Vec<u8>>),
    Hello(Vec<Vec<u8>>),
    Multi,
    Exec,
    Discard,
    Watch(Vec<Vec<u8>>),
    Unwatch,
    ClientSetName(Vec<u8>),
    ClientGetName,
    ClientId,
    /// `COMMAND`, `COMMAND COUNT`, `COMMAND DOCS ...`: enough for clients to start.
    CommandInfo(Option<Vec<u8>>),
    Info,
    DbSize,
    Quit,
}

impl Command {
    /// Key operations the command runs.
    pub fn ops(&self) -> usize {
        match self {
            Command::Data(d) => d.ops.len(),
            _ => 0,
        }
    }
}

/// Commands in `COMMAND`'s list: (name, arity as Redis counts it, first key, last key, step).
pub const COMMANDS: &[(&str, i64, i64, i64, i64)] = &[
    ("get", 2, 1, 1, 1),
    ("set", -3, 1, 1, 1),
    ("del", -2, 1, -1, 1),
    ("exists", -2, 1, -1, 1),
    ("incr", 2, 1, 1, 1),
    ("decr", 2, 1, 1, 1),
    ("incrby", 3, 1, 1, 1),
    ("decrby", 3, 1, 1, 1),
    ("append", 3, 1, 1, 1),
    ("strlen", 2, 1, 1, 1),
    ("mget", -2, 1, -1, 1),
    ("mset", -3, 1, -1, 2),
    ("ping", -1, 0, 0, 0),
    ("echo", 2, 0, 0, 0),
    ("select", 2, 0, 0, 0),
    ("auth", -2, 0, 0, 0),
    ("hello", -1, 0, 0, 0),
    ("multi", 1, 0, 0, 0),
    ("exec", 1, 0, 0, 0),
    ("discard", 1, 0, 0, 0),
    ("watch", -2, 1, -1, 1),
    ("unwatch", 1, 0, 0, 0),
    ("client", -2, 0, 0, 0),
    ("command", -1, 0, 0, 0),
    ("info", -1, 0, 0, 0),
    ("dbsize", 1, 0, 0, 0),
    ("quit", -1, 0, 0, 0),
];

/// Most key operations one transaction runs (a command, a pipeline's, or a MULTI's).
pub const MAX_TXN_OPS: usize = 16_384;

/// Reads a request's arguments as a command. An unknown command or a wrong number of
/// arguments is an error (in MULTI, Redis refuses those when queued, and EXEC then aborts);
/// any other mistake is a [`Command::Failed`] that answers its error when it runs (in MULTI,
/// inside EXEC's array), as Redis does.
pub fn parse(args: &[&[u8]]) -> Result<Command, Resp> {
    let Some(&(name, arity, ..)) = COMMANDS
        .iter()
        .find(|c| c.0.as_bytes().eq_ignore_ascii_case(args[0]))
    else {
        return Err(unknown(args[0], &args[1..]));
    };
    let n = args.len() as i64;
    if (arity > 0 && n != arity) || (arity < 0 && n < -arity) {
        return Err(Resp::err(format!(
            "ERR wrong number of arguments for '{name}' command"
        )));
    }
    Ok(checked(name, &args[1..]).unwrap_or_else(Command::Failed))
}

/// The command `name` with arguments `rest` (of the right number).
fn checked(name: &str, rest: &[&[u8]]) -> Result<Command, Resp> {
    let (names, step) = keys_of(name, rest);
    let mut keys = names.iter().step_by(step);
    if keys.len() > MAX_TXN_OPS {
        return Err(Resp::err(format!(
            "ERR at most {MAX_TXN_OPS} keys in one command here"
        )));
    }
    if keys.any(|k| k.len() > MAX_KEY) {
        return Err(Resp::err(format!(
            "ERR keys are at most {MAX_KEY} bytes here"
        )));
    }
    Ok(match name {
        "get" => one(Op::Get(rest[0].to_vec())),
        "set" => set(rest)?,
        "del" => many(rest, Shape::Sum, |k| Op::Del(k.to_vec())),
        "exists" => many(rest, Shape::Sum, |k| Op::Exists(k.to_vec())),
        "mget" => many(rest, Shape::Array, |k| Op::Get(k.to_vec())),
        "incr" => one(Op::IncrBy(rest[0].to_vec(), 1)),
        "decr" => one(Op::IncrBy(rest[0].to_vec(), -1)),
        "incrby" => one(Op::IncrBy(rest[0].to_vec(), int(rest[1])?)),
        "decrby" => {
            let by = int(rest[1])?;
            let neg = by
                .checked_neg()
                .ok_or_else(|| Resp::err("ERR decrement would overflow"))?;
            one(Op::IncrBy(rest[0].to_vec(), neg))
        }
        "append" => one(Op::Append(rest[0].to_vec(), rest[1].to_vec())),
        "strlen" => one(Op::Strlen(rest[0].to_vec())),
        "mset" => mset(rest)?,
        "ping" if rest.len() > 1 => {
            return Err(Resp::err(
                "ERR wrong number of arguments for 'ping' command",
            ))
        }
        "ping" => Command::Ping(rest.first().map(|m| m.to_vec())),
        "echo" => Command::Echo(rest[0].to_vec()),
        "select" => Command::Select(rest[0].to_vec()),
        "auth" if rest.len() > 2 => return Err(Resp::err("ERR syntax error")),
        "auth" => Command::Auth(owned(rest)),
        "hello" => Command::Hello(owned(rest)),
        "multi" => Command::Multi,
        "exec" => Command::Exec,
        "discard" => Command::Discard,
        "watch" => Command::Watch(owned(rest)),
        "unwatch" => Command::Unwatch,
        "client" => client(rest)?,
        "command" => Command::CommandInfo(rest.first().map(|s| s.to_ascii_lowercase())),
        "info" => Command::Info,
        "dbsize" => Command::DbSize,
        "quit" => Command::Quit,
        _ => unreachable!("every listed command is parsed"),
    })
}

/// The keys a command names (checked for length before anything runs): every `step`th
/// argument of the slice.
fn keys_of<'a, 'b>(name: &str, rest: &'a [&'b [u8]]) -> (&'a [&'b [u8]], usize) {
    match name {
        "mset" => (rest, 2),
        "del" | "exists" | "mget" | "watch" => (rest, 1),
        "get" | "set" | "incr" | "decr" | "incrby" | "decrby" | "append" | "strlen" => {
            (&rest[..1], 1)
        }
        _ => (&[], 1),
    }
}

fn owned(args: &[&[u8]]) -> Vec<Vec<u8>> {
    args.iter().map(|a| a.to_vec()).collect()
}

/// Redis's words for a command it does not know.
fn unknown(name: &[u8], args: &[&[u8]]) -> Resp {
    let shown: String = args
        .iter()
        .take(16)
        .map(|a| format!("'{}' ", clip(a)))
        .collect();
    Resp::err(format!(
        "ERR unknown command '{}', with args beginning with: {shown}",
        clip(name)
    ))
}

fn clip(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(128)]).into_owned()
}

fn one(op: Op) -> Command {
    Command::Data(DataCommand {
        ops: vec![op],
        shape: Shape::One,
    })
}

fn many(keys: &[&[u8]], shape: Shape, op: impl Fn(&[u8]) -> Op) -> Command {
    Command::Data(DataCommand {
        ops: keys.iter().map(|k| op(k)).collect(),
        shape,
    })
}

fn int(b: &[u8]) -> Result<i64, Resp> {
    parse_int(b).ok_or_else(|| Resp::err("ERR value is not an integer or out of range"))
}

fn set(rest: &[&[u8]]) -> Result<Command, Resp> {
    let (mut nx, mut xx) = (false, false);
    for opt in &rest[2..] {
        match opt.to_ascii_uppercase().as_slice() {
            b"NX" if !xx => nx = true,
            b"XX" if !nx => xx = true,
            b"EX" | b"PX" | b"EXAT" | b"PXAT" | b"KEEPTTL" | b"GET" => {
                return Err(Resp::err(format!(
                    "ERR SET {} is not supported: keys here do not expire, and SET does not \
                     return the old value",
                    String::from_utf8_lossy(opt).to_ascii_uppercase()
                )))
            }
            _ => return Err(Resp::err("ERR syntax error")),
        }
    }
    Ok(one(Op::Set {
        key: rest[0].to_vec(),
        value: rest[1].to_vec(),
        nx,
        xx,
        whole: false,
    }))
}

fn mset(rest: &[&[u8]]) -> Result<Command, Resp> {
    if !rest.len().is_multiple_of(2) {
        return Err(Resp::err(
            "ERR wrong number of arguments for 'mset' command",
        ));
    }
    let ops = rest
        .chunks(2)
        .map(|kv| Op::Set {
            key: kv[0].to_vec(),
            value: kv[1].to_vec(),
            nx: false,
            xx: false,
            // MSET sets every key or none: a pair that does not fit aborts the transaction.
            whole: true,
        })
        .collect();
    Ok(Command::Data(DataCommand {
        ops,
        shape: Shape::AllOk,
    }))
}

/// A client name as Redis allows one (CLIENT SETNAME, HELLO … SETNAME).
pub fn valid_client_name(name: &[u8]) -> Result<(), Resp> {
    if name.iter().any(|&b| b <= b' ' || b > b'~') {
        return Err(Resp::err(
            "ERR Client names cannot contain spaces, newlines or special characters.",
        ));
    }
    Ok(())
}

fn client(rest: &[&[u8]]) -> Result<Command, Resp> {
    let sub = rest[0].to_ascii_lowercase();
    let arity = |n: usize| {
        if rest.len() == n {
            Ok(())
        } else {
            Err(Resp::err(format!(
                "ERR wrong number of arguments for 'client|{}' command",
                String::from_utf8_lossy(&sub)
            )))
        }
    };
    match sub.as_slice() {
        b"setname" => {
            arity(2)?;
            valid_client_name(rest[1])?;
            Ok(Command::ClientSetName(rest[1].to_vec()))
        }
        b"getname" => arity(1).map(|()| Command::ClientGetName),
        b"id" => arity(1).map(|()| Command::ClientId),
        _ => Err(Resp::err(format!(
            "ERR unknown subcommand '{}'. Try CLIENT HELP.",
            clip(rest[0])
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<&[u8]> {
        s.split(' ').map(str::as_bytes).collect()
    }

    #[test]
    fn errors_are_worded_as_redis_words_them() {
        let err = |s| match parse(&args(s)) {
            Err(Resp::Error(e)) | Ok(Command::Failed(Resp::Error(e))) => e,
            other => panic!("{s}: {other:?}"),
        };
        assert_eq!(
            err("GET"),
            "ERR wrong number of arguments for 'get' command"
        );
        assert_eq!(
            err("FOO a b"),
            "ERR unknown command 'FOO', with args beginning with: 'a' 'b' "
        );
        assert_eq!(err("SET a b NX XX"), "ERR syntax error");
        assert_eq!(
            err("INCRBY a x"),
            "ERR value is not an integer or out of range"
        );
        assert_eq!(
            err("MSET a b c"),
            "ERR wrong number of arguments for 'mset' command"
        );
    }

    #[test]
    fn commands_become_operations() {
        let Ok(Command::Data(d)) = parse(&args("mset a 1 b 2")) else {
            panic!()
        };
        assert_eq!(d.ops.len(), 2);
        assert_eq!(d.reply(vec![Reply::Ok, Reply::Ok]), Resp::ok());
        let Ok(Command::Data(d)) = parse(&args("del a b a")) else {
            panic!()
        };
        assert_eq!(
            d.reply(vec![Reply::Int(1), Reply::Int(1), Reply::Int(0)]),
            Resp::Int(2)
        );
    }
}
