//! One client connection: reads requests, runs them in order, writes the replies.

use crate::command::{self, Command, DataCommand, Shape, COMMANDS, MAX_TXN_OPS};
use crate::resp::{next_request, RequestLimits, Resp};
use crate::Shared;
use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError};
use qstore_core::txn::{ProcCall, TxnKey, TxnOutcome, TxnResponse};
use qstore_core::{NodeId, TxnId};
use qstore_engine::{wall_clock_us, TxnRequest};
use qstore_workload::kv::{parse_int, KvTxnBuilder, Op, Reply, WATCHED_KEY_CHANGED};
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Unparsed request bytes a connection may hold: a value larger than any bucket, plus room.
const MAX_PENDING_INPUT: usize = 64 << 20;
/// Replies are written once this many bytes wait (a large MGET's, or many pipelined ones).
const OUT_FLUSH: usize = 1 << 20;
/// A client that has not authenticated is let go after this long idle.
const UNAUTHENTICATED_IDLE: Duration = Duration::from_secs(10);
/// How often a reading thread looks at the stop flag and the idle deadline.
const TICK: Duration = Duration::from_millis(500);
/// Most attempts at a transaction that concurrency control keeps aborting.
const MAX_ATTEMPTS: u32 = 200;

/// Answers `why` and closes the connection (best effort: a fresh socket takes it).
pub(crate) fn refuse(mut stream: TcpStream, why: &str) {
    let mut out = Vec::new();
    Resp::err(why).encode(2, &mut out);
    let _ = stream.write_all(&out);
    let _ = stream.shutdown(Shutdown::Both);
}

/// The commands queued since MULTI.
#[derive(Default)]
struct Multi {
    queued: Vec<Command>,
    /// Their key operations.
    ops: usize,
    /// One was refused when queued: EXEC aborts.
    refused: bool,
}

/// How a transaction ended.
enum Ran {
    Committed(Vec<Reply>),
    /// A logic abort: why.
    Aborted(String),
}

/// What the connection's client has set up.
struct Session<'a> {
    shared: &'a Shared,
    number: u64,
    authed: bool,
    proto: u8,
    name: Vec<u8>,
    /// Inside MULTI: what is queued.
    multi: Option<Multi>,
    /// WATCHed keys and their buckets' versions when watched.
    watched: Vec<(Vec<u8>, u64)>,
    answers: Receiver<TxnResponse>,
    reply_to: crossbeam_channel::Sender<TxnResponse>,
    quit: bool,
}

/// Serves one connection until the client leaves, idles too long, or the port stops.
pub(crate) fn serve(shared: &Arc<Shared>, mut stream: TcpStream, number: u64) {
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let idle = shared.backend.limits.idle_timeout;
    let _ = stream.set_nodelay(true);
    // A client that does not read its replies is let go after the idle timeout.
    let timeouts = stream
        .set_read_timeout(Some(TICK))
        .and_then(|()| stream.set_write_timeout(Some(idle)));
    if let Err(e) = timeouts {
        tracing::warn!("redis client {peer}: {e}");
        return;
    }
    let (reply_to, answers) = unbounded();
    let mut s = Session {
        shared,
        number,
        authed: !shared.backend.auth.required(),
        proto: 2,
        name: Vec::new(),
        multi: None,
        watched: Vec::new(),
        answers,
        reply_to,
        quit: false,
    };
    let mut input = Vec::new();
    let mut out = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    let mut last_active = Instant::now();
    // Whether requests may wait in `input` unserved (the last round stopped to write).
    let mut more = false;
    while !shared.stop.load(Ordering::Acquire) && !s.quit {
        if !more {
            match stream.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => input.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    let limit = if s.authed {
                        idle
                    } else {
                        idle.min(UNAUTHENTICATED_IDLE)
                    };
                    if last_active.elapsed() > limit {
                        tracing::info!("redis client {peer}: closed after {limit:?} idle");
                        break;
                    }
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!("redis client {peer}: {e}");
                    break;
                }
            }
            last_active = Instant::now();
        }
        let round = s.run_requests(&input, &mut out);
        input.drain(..round.used);
        more = round.more;
        let closing = round.error.is_some() || input.len() > MAX_PENDING_INPUT;
        if let Some(why) = &round.error {
            tracing::info!("redis client {peer}: closed: {why}");
            Resp::err(why.clone()).encode(s.proto, &mut out);
        } else if input.len() > MAX_PENDING_INPUT {
            Resp::err("ERR Protocol error: request too large").encode(s.proto, &mut out);
        }
        if !out.is_empty() {
            if let Err(e) = stream.write_all(&out) {
                tracing::info!("redis client {peer}: closed: writing replies: {e}");
                break;
            }
            out.clear();
            out.shrink_to(OUT_FLUSH);
        }
        if closing {
            break;
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
}

/// What one round of serving buffered requests did.
struct Round {
    /// Bytes of input used.
    used: usize,
    /// It stopped early, with replies to write first: complete requests may remain.
    more: bool,
    /// A protocol error: answer it and close.
    error: Option<String>,
}

/// What running key commands together came to.
enum Together {
    /// One reply per command.
    Replies(Vec<Resp>),
    /// A watched key changed: EXEC answers nil.
    WatchedKeyChanged,
}

impl Session<'_> {
    /// Runs the complete requests in `input`, appending the replies to `out`, until none is
    /// left or `out` holds enough to write.
    ///
    /// Key commands that arrive together (a pipeline) run as one transaction: the same as
    /// running them one after another with nothing in between, which Redis allows, and one
    /// trip through the engine instead of one each.
    fn run_requests(&mut self, input: &[u8], out: &mut Vec<u8>) -> Round {
        let mut round = Round {
            used: 0,
            more: false,
            error: None,
        };
        let mut pipeline: Vec<DataCommand> = Vec::new();
        let mut ops = 0;
        while !self.quit {
            if out.len() >= OUT_FLUSH {
                round.more = true;
                break;
            }
            let limits = match self.authed {
                true => RequestLimits::AUTHENTICATED,
                false => RequestLimits::UNAUTHENTICATED,
            };
            let (args, n) = match next_request(&input[round.used..], limits) {
                Ok(Some(request)) => request,
                Ok(None) => break,
                Err(e) => {
                    round.error = Some(format!("ERR {}", e.0));
                    break;
                }
            };
            round.used += n;
            if args.is_empty() {
                continue;
            }
            self.shared
                .counters
                .commands
                .fetch_add(1, Ordering::Relaxed);
            match command::parse(&args) {
                // MSET is all or nothing: its abort must not take other commands with it.
                Ok(Command::Data(d))
                    if self.authed && self.multi.is_none() && d.shape != Shape::AllOk =>
                {
                    if ops + d.ops.len() > MAX_TXN_OPS {
                        self.run_pipeline(&mut pipeline, out);
                        ops = 0;
                    }
                    ops += d.ops.len();
                    pipeline.push(d);
                }
                parsed => {
                    self.run_pipeline(&mut pipeline, out);
                    ops = 0;
                    let reply = self.run(parsed);
                    reply.encode(self.proto, out);
                }
            }
        }
        self.run_pipeline(&mut pipeline, out);
        round
    }

    /// Runs pipelined key commands as one transaction, and appends their replies.
    fn run_pipeline(&mut self, pipeline: &mut Vec<DataCommand>, out: &mut Vec<u8>) {
        if pipeline.is_empty() {
            return;
        }
        let commands: Vec<&DataCommand> = pipeline.iter().collect();
        let replies = match self.run_together(&commands, &[]) {
            Together::Replies(r) => r,
            Together::WatchedKeyChanged => unreachable!("a pipeline checks no watched key"),
        };
        replies.iter().for_each(|r| r.encode(self.proto, out));
        pipeline.clear();
    }

    /// Runs `commands` as one transaction, after checks that the `watched` buckets kept
    /// their versions. A command too large for any bucket answers so and does not run.
    fn run_together(&mut self, commands: &[&DataCommand], watched: &[(Vec<u8>, u64)]) -> Together {
        let refused: Vec<Option<Resp>> = commands.iter().map(|d| self.too_large(&d.ops)).collect();
        let mut txn = self.shared.backend.kv.txn();
        for (k, v) in watched {
            txn.push(&Op::Check(k.clone(), *v));
        }
        let runs = commands.iter().zip(&refused).filter(|(_, r)| r.is_none());
        for (d, _) in runs {
            d.ops.iter().for_each(|op| txn.push(op));
        }
        let ran = if txn.is_empty() {
            Ok(Ran::Committed(Vec::new()))
        } else {
            self.transact(txn)
        };
        let mut replies = match ran {
            Ok(Ran::Committed(r)) => r.into_iter().skip(watched.len()),
            Ok(Ran::Aborted(why)) if why == WATCHED_KEY_CHANGED => {
                return Together::WatchedKeyChanged
            }
            Ok(Ran::Aborted(why)) => {
                return Together::Replies(vec![Resp::err(why); commands.len()])
            }
            Err(e) => return Together::Replies(vec![e; commands.len()]),
        };
        let answers = commands
            .iter()
            .zip(refused)
            .map(|(d, refused)| match refused {
                Some(e) => e,
                None => d.reply(replies.by_ref().take(d.ops.len()).collect()),
            })
            .collect();
        Together::Replies(answers)
    }

    fn run(&mut self, parsed: Result<Command, Resp>) -> Resp {
        let cmd = match parsed {
            Ok(c) => c,
            Err(e) => {
                if let Some(m) = &mut self.multi {
                    m.refused = true;
                }
                return e;
            }
        };
        if !self.authed && !matches!(cmd, Command::Auth(_) | Command::Hello(_) | Command::Quit) {
            return Resp::err("NOAUTH Authentication required.");
        }
        if let Some(m) = &mut self.multi {
            match cmd {
                Command::Data(_) | Command::Failed(_) | Command::Ping(_) | Command::Echo(_) => {
                    if m.ops + cmd.ops() > MAX_TXN_OPS {
                        m.refused = true;
                        return Resp::err(format!(
                            "ERR at most {MAX_TXN_OPS} key operations in one MULTI here"
                        ));
                    }
                    m.ops += cmd.ops();
                    m.queued.push(cmd);
                    return Resp::Simple("QUEUED");
                }
                Command::Multi => return Resp::err("ERR MULTI calls can not be nested"),
                Command::Watch(_) => return Resp::err("ERR WATCH inside MULTI is not allowed"),
                Command::Exec | Command::Discard | Command::Quit => {}
                _ => {
                    m.refused = true;
                    return Resp::err(
                        "ERR only key commands, PING and ECHO can be queued in MULTI here",
                    );
                }
            }
        }
        self.run_now(cmd)
    }

    fn run_now(&mut self, cmd: Command) -> Resp {
        match cmd {
            Command::Data(d) => self.data(&d),
            Command::Failed(e) => e,
            Command::Ping(None) => Resp::Simple("PONG"),
            Command::Ping(Some(m)) | Command::Echo(m) => Resp::Bulk(m),
            Command::Select(db) => match parse_int(&db) {
                Some(0) => Resp::ok(),
                Some(_) => Resp::err("ERR DB index is out of range"),
                None => Resp::err("ERR value is not an integer or out of range"),
            },
            Command::Auth(args) => self.auth(&args),
            Command::Hello(args) => self.hello(&args),
            Command::Multi => {
                self.multi = Some(Multi::default());
                Resp::ok()
            }
            Command::Exec => self.exec(),
            Command::Discard => match self.multi.take() {
                Some(_) => {
                    self.watched.clear();
                    Resp::ok()
                }
                None => Resp::err("ERR DISCARD without MULTI"),
            },
            Command::Watch(keys) => self.watch(keys),
            Command::Unwatch => {
                self.watched.clear();
                Resp::ok()
            }
            Command::ClientSetName(name) => {
                self.name = name;
                Resp::ok()
            }
            Command::ClientGetName if self.name.is_empty() => Resp::Nil,
            Command::ClientGetName => Resp::Bulk(self.name.clone()),
            Command::ClientId => Resp::Int(self.number as i64),
            Command::CommandInfo(sub) => command_info(sub.as_deref()),
            Command::Info => self.info(),
            Command::DbSize => Resp::err(
                "ERR DBSIZE is not supported here: counting keys would read every bucket of \
                 every partition in one transaction",
            ),
            Command::Quit => {
                self.quit = true;
                Resp::ok()
            }
        }
    }

    fn auth(&mut self, args: &[Vec<u8>]) -> Resp {
        let (user, password) = match args {
            [p] => (&b"default"[..], p),
            [u, p] => (&u[..], p),
            _ => return Resp::err("ERR syntax error"),
        };
        let auth = &self.shared.backend.auth;
        if !auth.required() {
            return Resp::err(
                "ERR AUTH <password> called without any password configured for the default \
                 user. Are you sure your configuration is correct?",
            );
        }
        if user != b"default" || !auth.accepts(password) {
            return Resp::err("WRONGPASS invalid username-password pair or user is disabled.");
        }
        self.authed = true;
        Resp::ok()
    }

    /// `HELLO [protover [AUTH user pass] [SETNAME name]]`.
    fn hello(&mut self, args: &[Vec<u8>]) -> Resp {
        let mut proto = self.proto;
        let mut new_name = None;
        let mut rest = args;
        if let Some((v, tail)) = args.split_first() {
            match parse_int(v) {
                Some(v @ 2..=3) => proto = v as u8,
                Some(_) => return Resp::err("NOPROTO unsupported protocol version"),
                None => return Resp::err("ERR Protocol version is not an integer or out of range"),
            }
            rest = tail;
        }
        while let Some((opt, tail)) = rest.split_first() {
            match (opt.to_ascii_uppercase().as_slice(), tail) {
                (b"AUTH", [user, pass, more @ ..]) => {
                    if let e @ Resp::Error(_) = self.auth(&[user.clone(), pass.clone()]) {
                        return e;
                    }
                    rest = more;
                }
                (b"SETNAME", [name, more @ ..]) => {
                    if let Err(e) = command::valid_client_name(name) {
                        return e;
                    }
                    new_name = Some(name.clone());
                    rest = more;
                }
                _ => {
                    return Resp::err(format!(
                        "ERR Syntax error in HELLO option '{}'",
                        String::from_utf8_lossy(opt)
                    ))
                }
            }
        }
        if !self.authed {
            return Resp::err(
                "NOAUTH HELLO must be called with the client already authenticated, otherwise \
                 the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the \
                 client and select the RESP protocol version at the same time",
            );
        }
        self.proto = proto;
        if let Some(name) = new_name {
            self.name = name;
        }
        Resp::Map(vec![
            (Resp::bulk("server"), Resp::bulk("redis")),
            (Resp::bulk("version"), Resp::bulk("7.0.0")),
            (Resp::bulk("proto"), Resp::Int(proto as i64)),
            (Resp::bulk("id"), Resp::Int(self.number as i64)),
            (Resp::bulk("mode"), Resp::bulk("standalone")),
            (Resp::bulk("role"), Resp::bulk("master")),
            (Resp::bulk("modules"), Resp::Array(Vec::new())),
        ])
    }

    fn info(&self) -> Resp {
        let b = &self.shared.backend;
        let ctx = b.cluster.ctx();
        let c = &self.shared.counters;
        let text = format!(
            "# Server\r\nredis_version:7.0.0\r\nqstore_protocol:{}\r\nqstore_node:{}\r\n\
             qstore_nodes:{}\r\nqstore_replicas:{}\r\n\r\n# Clients\r\nconnected_clients:{}\r\n\
             \r\n# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\n\
             qstore_transactions:{}\r\nqstore_retries:{}\r\n",
            ctx.cfg.protocol.name,
            b.me.0,
            ctx.nodes(),
            ctx.placement.replicas(),
            self.shared.open.load(Ordering::Relaxed),
            c.connections.load(Ordering::Relaxed),
            c.commands.load(Ordering::Relaxed),
            c.transactions.load(Ordering::Relaxed),
            c.retries.load(Ordering::Relaxed),
        );
        Resp::Bulk(text.into_bytes())
    }

    /// One data command outside MULTI: one transaction.
    fn data(&mut self, d: &DataCommand) -> Resp {
        match self.run_together(&[d], &[]) {
            Together::Replies(mut r) => r.pop().unwrap_or(Resp::Nil),
            Together::WatchedKeyChanged => unreachable!("no watched key is checked"),
        }
    }

    fn watch(&mut self, mut keys: Vec<Vec<u8>>) -> Resp {
        // A key watched already keeps the version it was first watched at (as in Redis).
        keys.sort();
        keys.dedup();
        keys.retain(|k| !self.watched.iter().any(|(w, _)| w == k));
        if self.watched.len() + keys.len() > MAX_TXN_OPS {
            return Resp::err(format!("ERR at most {MAX_TXN_OPS} watched keys here"));
        }
        if keys.is_empty() {
            return Resp::ok();
        }
        let mut txn = self.shared.backend.kv.txn();
        keys.iter().for_each(|k| txn.push(&Op::Version(k.clone())));
        match self.transact(txn) {
            Ok(Ran::Committed(replies)) => {
                for (k, r) in keys.into_iter().zip(replies) {
                    let Reply::Int(v) = r else {
                        return Resp::err("ERR WATCH could not read a version");
                    };
                    self.watched.push((k, v as u64));
                }
                Resp::ok()
            }
            Ok(Ran::Aborted(why)) => Resp::err(format!("ERR WATCH was aborted: {why}")),
            Err(e) => e,
        }
    }

    /// EXEC: the queued commands as one transaction, after checks of the watched keys.
    fn exec(&mut self) -> Resp {
        let Some(Multi {
            queued, refused, ..
        }) = self.multi.take()
        else {
            return Resp::err("ERR EXEC without MULTI");
        };
        let watched = std::mem::take(&mut self.watched);
        if refused {
            return Resp::err("EXECABORT Transaction discarded because of previous errors.");
        }
        let data: Vec<&DataCommand> = queued
            .iter()
            .filter_map(|c| match c {
                Command::Data(d) => Some(d),
                _ => None,
            })
            .collect();
        let mut replies = match self.run_together(&data, &watched) {
            Together::Replies(r) => r.into_iter(),
            Together::WatchedKeyChanged => return Resp::NilArray,
        };
        let answers = queued
            .into_iter()
            .map(|c| match c {
                Command::Data(_) => replies.next().unwrap_or(Resp::Nil),
                other => self.run_now(other),
            })
            .collect();
        Resp::Array(answers)
    }

    /// An error reply if an operation's key and value cannot fit in a bucket at all.
    fn too_large(&self, ops: &[Op]) -> Option<Resp> {
        let room = self.shared.backend.kv.entry_room();
        ops.iter().find_map(|op| {
            let value = match op {
                Op::Set { value, .. } | Op::Append(_, value) => value.len(),
                _ => 0,
            };
            (op.key().len() + value > room).then(|| {
                Resp::err(format!(
                    "ERR key and value are {} bytes; at most {room} fit in a bucket \
                     (workload.kv.bucket_bytes)",
                    op.key().len() + value
                ))
            })
        })
    }

    /// Runs a transaction to its end: the operations' replies, why it aborted (a watched key
    /// changed, an MSET did not fit), or an error reply. Retries what concurrency control
    /// aborts.
    fn transact(&mut self, txn: KvTxnBuilder<'_>) -> Result<Ran, Resp> {
        let b = &self.shared.backend;
        if let Some(why) = b.health.as_ref().and_then(|h| h.refusal()) {
            return Err(Resp::err(format!("ERR {why}")));
        }
        let (call, placed) = txn.finish();
        let call = Arc::new(call);
        let birth_us = wall_clock_us();
        self.shared
            .counters
            .transactions
            .fetch_add(1, Ordering::Relaxed);
        for attempt in 0..MAX_ATTEMPTS {
            match self.attempt(&call, birth_us)? {
                TxnOutcome::Committed(outputs) => {
                    return KvTxnBuilder::replies(&placed, &outputs)
                        .map(Ran::Committed)
                        .map_err(|e| Resp::err(format!("ERR {e}")));
                }
                TxnOutcome::LogicAbort(why) => return Ok(Ran::Aborted(why)),
                TxnOutcome::CcAbort(_) => {
                    self.shared.counters.retries.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_micros(10 << attempt.min(7)));
                }
                TxnOutcome::Rejected(why) | TxnOutcome::Unknown(why) => {
                    return Err(Resp::err(format!("ERR {why}")))
                }
                TxnOutcome::NotLeader { leader } => {
                    let at = leader.map_or("another server".into(), |l| format!("node {}", l.0));
                    return Err(Resp::err(format!(
                        "ERR this server does not lead its partition's replica group; \
                         connect to {at}'s Redis port"
                    )));
                }
            }
        }
        Err(Resp::err(format!(
            "ERR the transaction was aborted by concurrency control {MAX_ATTEMPTS} times; try \
             again"
        )))
    }

    fn attempt(&self, call: &Arc<ProcCall>, birth_us: u64) -> Result<TxnOutcome, Resp> {
        let b = &self.shared.backend;
        let id = b.ids.next();
        let req = TxnRequest {
            id,
            call: call.clone(),
            reply: self.reply_to.clone().into(),
            birth_us,
            // This thread has nothing else to do until the answer comes.
            inline: true,
            key: TxnKey::default(),
        };
        let home = b.cluster.ctx().placement.partition_of(b.me);
        b.cluster.submit(NodeId(home.0), req);
        self.wait(id)
    }

    fn wait(&self, id: TxnId) -> Result<TxnOutcome, Resp> {
        let limit = self.shared.backend.limits.answer_timeout;
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.answers.recv_timeout(left) {
                Ok(r) if r.id == id => return Ok(r.outcome),
                Ok(_) => {} // an answer to an attempt given up on
                Err(RecvTimeoutError::Timeout) => {
                    return Err(Resp::err(format!(
                        "ERR no answer from the cluster within {limit:?}; the transaction may \
                         still commit"
                    )))
                }
                Err(RecvTimeoutError::Disconnected) => unreachable!("the session holds a sender"),
            }
        }
    }
}

/// `COMMAND` (the list), `COMMAND COUNT`, and an empty answer to `COMMAND DOCS` (which
/// `redis-cli` asks for its hints).
fn command_info(sub: Option<&[u8]>) -> Resp {
    match sub {
        None => Resp::Array(
            COMMANDS
                .iter()
                .map(|&(name, arity, first, last, step)| {
                    Resp::Array(vec![
                        Resp::bulk(name),
                        Resp::Int(arity),
                        Resp::Array(Vec::new()),
                        Resp::Int(first),
                        Resp::Int(last),
                        Resp::Int(step),
                    ])
                })
                .collect(),
        ),
        Some(b"count") => Resp::Int(COMMANDS.len() as i64),
        Some(b"docs") => Resp::Map(Vec::new()),
        Some(other) => Resp::err(format!(
            "ERR unknown subcommand '{}'. Try COMMAND HELP.",
            String::from_utf8_lossy(other)
        )),
    }
}
