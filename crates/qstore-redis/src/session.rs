//! One client connection's session: parses its requests, runs them in order and encodes
//! the replies. It never blocks: a request that needs a transaction hands it back
//! ([`Pending`]) to the event loop, which submits it and gives the session its answer.

use crate::command::{self, Command, DataCommand, Shape, COMMANDS, MAX_TXN_OPS};
use crate::resp::{next_request, RequestLimits, Resp};
use crate::Shared;
use qstore_core::txn::{ProcCall, TxnOutcome};
use qstore_engine::wall_clock_us;
use qstore_workload::kv::{parse_int, KvTxnBuilder, Op, Reply, WATCHED_KEY_CHANGED};
use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Replies are written before more requests are served once this many bytes wait (a large
/// MGET's, or many pipelined ones).
pub(crate) const OUT_FLUSH: usize = 1 << 20;
/// Most attempts at a transaction that concurrency control keeps aborting.
const MAX_ATTEMPTS: u32 = 200;

/// Answers `why` to a connection about to be closed (best effort: a fresh socket takes it).
pub(crate) fn refuse(mut stream: impl Write, why: &str) {
    let mut out = Vec::new();
    Resp::err(why).encode(2, &mut out);
    let _ = stream.write_all(&out);
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

/// What a request came to: replies now, or a transaction to run first.
pub(crate) enum Step {
    Now(Vec<Resp>),
    Txn(Pending),
}

/// A transaction a session waits for, and what its answer becomes.
pub(crate) struct Pending {
    pub(crate) call: Arc<ProcCall>,
    /// Where each operation's reply is among the call's outputs.
    placed: Vec<usize>,
    pub(crate) birth_us: u64,
    /// Attempts made (concurrency control aborts are retried).
    pub(crate) attempts: u32,
    then: Then,
}

/// What a transaction's end is turned into.
enum Then {
    /// Pipelined key commands (or one alone): one reply each.
    Pipeline {
        commands: Vec<DataCommand>,
        refused: Vec<Option<Resp>>,
    },
    /// EXEC: one array of the queued commands' replies. The transaction's first `watched`
    /// operations check the watched buckets.
    Exec {
        queued: Vec<Command>,
        refused: Vec<Option<Resp>>,
        watched: usize,
    },
    /// WATCH: the versions of the newly watched keys' buckets.
    Watch(Vec<Vec<u8>>),
    /// DBSIZE: the keys of every bucket, summed.
    DbSize,
}

impl Then {
    /// Key operations its transaction runs, at most (refused commands' are left out).
    fn ops(&self) -> usize {
        match self {
            Then::Pipeline { commands, .. } => commands.iter().map(|d| d.ops.len()).sum(),
            Then::Exec { queued, .. } => queued.iter().map(Command::ops).sum(),
            Then::Watch(keys) => keys.len(),
            // Every bucket: the builder grows as it goes.
            Then::DbSize => 0,
        }
    }
}

/// What the connection's client has set up.
pub(crate) struct Session<'a> {
    shared: &'a Shared,
    number: u64,
    authed: bool,
    proto: u8,
    name: Vec<u8>,
    /// Inside MULTI: what is queued.
    multi: Option<Multi>,
    /// WATCHed keys and their buckets' versions when watched.
    watched: Vec<(Vec<u8>, u64)>,
    pub(crate) quit: bool,
}

/// What one round of serving buffered requests did.
#[derive(Default)]
pub(crate) struct Round {
    /// Bytes of input used.
    pub(crate) used: usize,
    /// It stopped early, with replies to write first: complete requests may remain.
    pub(crate) more: bool,
    /// A protocol error: answer it and close.
    pub(crate) error: Option<String>,
    /// A transaction to run before anything else: the round stopped there.
    pub(crate) txn: Option<Pending>,
}

/// What running key commands together came to.
enum Together {
    /// One reply per command.
    Replies(Vec<Resp>),
    /// A watched key changed: EXEC answers nil.
    WatchedKeyChanged,
}

impl<'a> Session<'a> {
    pub(crate) fn new(shared: &'a Shared, number: u64) -> Self {
        Session {
            shared,
            number,
            authed: !shared.backend.auth.required(),
            proto: 2,
            name: Vec::new(),
            multi: None,
            watched: Vec::new(),
            quit: false,
        }
    }

    pub(crate) fn authed(&self) -> bool {
        self.authed
    }

    pub(crate) fn proto(&self) -> u8 {
        self.proto
    }

    /// Serves the complete requests in `input`, appending the replies to `out`, until none
    /// is left, `out` holds enough to write, or a transaction must run first.
    ///
    /// Key commands that arrive together (a pipeline) run as one transaction: the same as
    /// running them one after another with nothing in between, which Redis allows, and one
    /// trip through the engine instead of one each.
    pub(crate) fn run_requests(&mut self, input: &[u8], out: &mut Vec<u8>) -> Round {
        let mut round = Round::default();
        let mut pipeline: Vec<DataCommand> = Vec::new();
        let mut ops = 0;
        while !self.quit && round.txn.is_none() {
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
                // The pipeline runs first; the error comes again in the next round.
                Err(_) if !pipeline.is_empty() => break,
                Err(e) => {
                    round.error = Some(format!("ERR {}", e.0));
                    break;
                }
            };
            if args.is_empty() {
                round.used += n;
                continue;
            }
            // A request not taken now (the pipeline runs first) is parsed again next round.
            match command::parse(&args) {
                // MSET is all or nothing: its abort must not take other commands with it.
                Ok(Command::Data(d))
                    if self.authed && self.multi.is_none() && d.shape != Shape::AllOk =>
                {
                    if ops + d.ops.len() > MAX_TXN_OPS && !pipeline.is_empty() {
                        break;
                    }
                    round.used += n;
                    self.counted();
                    ops += d.ops.len();
                    pipeline.push(d);
                }
                _ if !pipeline.is_empty() => break,
                parsed => {
                    round.used += n;
                    self.counted();
                    match self.run(parsed) {
                        Step::Now(replies) => self.encode(&replies, out),
                        Step::Txn(p) => round.txn = Some(p),
                    }
                }
            }
        }
        if !pipeline.is_empty() {
            let refused = self.refusals(pipeline.iter());
            let then = Then::Pipeline {
                commands: pipeline,
                refused,
            };
            match self.start(then, &[]) {
                Step::Now(replies) => self.encode(&replies, out),
                Step::Txn(p) => round.txn = Some(p),
            }
        }
        round
    }

    fn counted(&self) {
        self.shared
            .counters
            .commands
            .fetch_add(1, Ordering::Relaxed);
    }

    fn encode(&self, replies: &[Resp], out: &mut Vec<u8>) {
        replies.iter().for_each(|r| r.encode(self.proto, out));
    }

    /// Per command, an error reply if one of its operations cannot fit in a bucket at all
    /// (it does not run).
    fn refusals<'c>(&self, commands: impl Iterator<Item = &'c DataCommand>) -> Vec<Option<Resp>> {
        commands.map(|d| self.too_large(&d.ops)).collect()
    }

    /// The transaction of `then`'s commands that were not refused, after checks that the
    /// `watched` buckets kept their versions; or its replies at once if there is nothing to
    /// run, or the cluster refuses new transactions now.
    fn start(&mut self, then: Then, watched: &[(Vec<u8>, u64)]) -> Step {
        let mut txn = self.shared.backend.kv.txn();
        txn.reserve(watched.len() + then.ops());
        for (k, v) in watched {
            txn.push(&Op::Check(k.clone(), *v));
        }
        match &then {
            Then::Pipeline { commands, refused } => push_runs(&mut txn, commands.iter(), refused),
            Then::Exec {
                queued, refused, ..
            } => push_runs(&mut txn, data_of(queued), refused),
            Then::Watch(keys) => keys.iter().for_each(|k| txn.push(&Op::Version(k.clone()))),
            Then::DbSize => txn.count_all(),
        }
        if txn.is_empty() {
            return Step::Now(self.conclude(then, Ok(Ran::Committed(Vec::new()))));
        }
        let b = &self.shared.backend;
        if let Some(why) = b.health.as_ref().and_then(|h| h.refusal()) {
            return Step::Now(self.conclude(then, Err(Resp::err(format!("ERR {why}")))));
        }
        let (call, placed) = txn.finish();
        self.shared
            .counters
            .transactions
            .fetch_add(1, Ordering::Relaxed);
        Step::Txn(Pending {
            call: Arc::new(call),
            placed,
            birth_us: wall_clock_us(),
            attempts: 0,
            then,
        })
    }

    /// The answer to an attempt at `p`: its replies are appended to `out`, or it comes back
    /// to be tried again (concurrency control aborted it).
    pub(crate) fn answered(
        &mut self,
        mut p: Pending,
        outcome: TxnOutcome,
        out: &mut Vec<u8>,
    ) -> Option<Pending> {
        p.attempts += 1;
        let ran = match outcome {
            TxnOutcome::Committed(outputs) => KvTxnBuilder::replies(&p.placed, &outputs)
                .map(Ran::Committed)
                .map_err(|e| Resp::err(format!("ERR {e}"))),
            TxnOutcome::LogicAbort(why) => Ok(Ran::Aborted(why)),
            TxnOutcome::CcAbort(_) if p.attempts < MAX_ATTEMPTS => {
                self.shared.counters.retries.fetch_add(1, Ordering::Relaxed);
                return Some(p);
            }
            TxnOutcome::CcAbort(_) => Err(Resp::err(format!(
                "ERR the transaction was aborted by concurrency control {MAX_ATTEMPTS} times; \
                 try again"
            ))),
            TxnOutcome::Rejected(why) | TxnOutcome::Unknown(why) => {
                Err(Resp::err(format!("ERR {why}")))
            }
            TxnOutcome::NotLeader { leader } => {
                let at = leader.map_or("another server".into(), |l| format!("node {}", l.0));
                Err(Resp::err(format!(
                    "ERR this server does not lead its partition's replica group; connect \
                     to {at}'s Redis port"
                )))
            }
        };
        let replies = self.conclude(p.then, ran);
        self.encode(&replies, out);
        None
    }

    /// `p` got no answer: `why` is the reply of each command it ran.
    pub(crate) fn gave_up(&mut self, p: Pending, why: Resp, out: &mut Vec<u8>) {
        let replies = self.conclude(p.then, Err(why));
        self.encode(&replies, out);
    }

    /// The replies `then` makes of how its transaction ended.
    fn conclude(&mut self, then: Then, ran: Result<Ran, Resp>) -> Vec<Resp> {
        match then {
            Then::Pipeline { commands, refused } => {
                match data_replies(commands.iter(), refused, ran, 0) {
                    Together::Replies(r) => r,
                    // Not with nothing watched; answered as the abort it is all the same.
                    Together::WatchedKeyChanged => {
                        vec![Resp::err(WATCHED_KEY_CHANGED); commands.len()]
                    }
                }
            }
            Then::Exec {
                queued,
                refused,
                watched,
            } => {
                let mut replies = match data_replies(data_of(&queued), refused, ran, watched) {
                    Together::Replies(r) => r.into_iter(),
                    Together::WatchedKeyChanged => return vec![Resp::NilArray],
                };
                let answers = queued
                    .into_iter()
                    .map(|c| match c {
                        Command::Data(_) => replies.next().unwrap_or(Resp::Nil),
                        other => queued_reply(other),
                    })
                    .collect();
                vec![Resp::Array(answers)]
            }
            Then::Watch(keys) => vec![self.watched(keys, ran)],
            Then::DbSize => vec![summed_counts(ran)],
        }
    }

    fn run(&mut self, parsed: Result<Command, Resp>) -> Step {
        let cmd = match parsed {
            Ok(c) => c,
            Err(e) => {
                if let Some(m) = &mut self.multi {
                    m.refused = true;
                }
                return Step::Now(vec![e]);
            }
        };
        if !self.authed && !matches!(cmd, Command::Auth(_) | Command::Hello(_) | Command::Quit) {
            return Step::Now(vec![Resp::err("NOAUTH Authentication required.")]);
        }
        let refused = |m: &mut Multi, e: Resp| {
            m.refused = true;
            Step::Now(vec![e])
        };
        if let Some(m) = &mut self.multi {
            match cmd {
                Command::Data(_) | Command::Failed(_) | Command::Ping(_) | Command::Echo(_) => {
                    if m.ops + cmd.ops() > MAX_TXN_OPS {
                        let e =
                            format!("ERR at most {MAX_TXN_OPS} key operations in one MULTI here");
                        return refused(m, Resp::err(e));
                    }
                    m.ops += cmd.ops();
                    m.queued.push(cmd);
                    return Step::Now(vec![Resp::Simple("QUEUED")]);
                }
                Command::Multi => {
                    return Step::Now(vec![Resp::err("ERR MULTI calls can not be nested")])
                }
                Command::Watch(_) => {
                    return Step::Now(vec![Resp::err("ERR WATCH inside MULTI is not allowed")])
                }
                Command::Exec | Command::Discard | Command::Quit => {}
                _ => {
                    let e = "ERR only key commands, PING and ECHO can be queued in MULTI here";
                    return refused(m, Resp::err(e));
                }
            }
        }
        self.run_now(cmd)
    }

    fn run_now(&mut self, cmd: Command) -> Step {
        let reply = match cmd {
            Command::Data(d) => {
                let refused = self.refusals(std::iter::once(&d));
                let then = Then::Pipeline {
                    commands: vec![d],
                    refused,
                };
                return self.start(then, &[]);
            }
            Command::Exec => return self.exec(),
            Command::Watch(keys) => return self.watch(keys),
            c @ (Command::Failed(_) | Command::Ping(_) | Command::Echo(_)) => queued_reply(c),
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
            Command::Discard => match self.multi.take() {
                Some(_) => {
                    self.watched.clear();
                    Resp::ok()
                }
                None => Resp::err("ERR DISCARD without MULTI"),
            },
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
            Command::DbSize => return self.db_size(),
            Command::Quit => {
                self.quit = true;
                Resp::ok()
            }
        };
        Step::Now(vec![reply])
    }

    /// DBSIZE reads every bucket in one transaction, so the count is of one state of the
    /// database (Redis's is of the moment it runs), at the cost of a transaction that
    /// conflicts with every write in flight: it is for inspection, not for a hot path.
    fn db_size(&mut self) -> Step {
        let buckets = self.shared.backend.kv.keys().total();
        if buckets > u64::from(u16::MAX) {
            return Step::Now(vec![Resp::err(format!(
                "ERR DBSIZE reads every bucket in one transaction, and this cluster has \
                 {buckets} buckets, more than the {} accesses a transaction may make (lower \
                 workload.kv.buckets_per_partition, --kv-buckets)",
                u16::MAX
            ))]);
        }
        self.start(Then::DbSize, &[])
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

    fn watch(&mut self, mut keys: Vec<Vec<u8>>) -> Step {
        // A key watched already keeps the version it was first watched at (as in Redis).
        keys.sort();
        keys.dedup();
        keys.retain(|k| !self.watched.iter().any(|(w, _)| w == k));
        if self.watched.len() + keys.len() > MAX_TXN_OPS {
            let e = format!("ERR at most {MAX_TXN_OPS} watched keys here");
            return Step::Now(vec![Resp::err(e)]);
        }
        self.start(Then::Watch(keys), &[])
    }

    /// WATCH's reply once the versions of `keys`' buckets were read (or not).
    fn watched(&mut self, keys: Vec<Vec<u8>>, ran: Result<Ran, Resp>) -> Resp {
        match ran {
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
    fn exec(&mut self) -> Step {
        let Some(Multi {
            queued, refused, ..
        }) = self.multi.take()
        else {
            return Step::Now(vec![Resp::err("ERR EXEC without MULTI")]);
        };
        let watched = std::mem::take(&mut self.watched);
        if refused {
            let e = "EXECABORT Transaction discarded because of previous errors.";
            return Step::Now(vec![Resp::err(e)]);
        }
        let refused = self.refusals(data_of(&queued));
        let then = Then::Exec {
            queued,
            refused,
            watched: watched.len(),
        };
        self.start(then, &watched)
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
}

/// The key commands among queued ones.
fn data_of(queued: &[Command]) -> impl Iterator<Item = &DataCommand> {
    queued.iter().filter_map(|c| match c {
        Command::Data(d) => Some(d),
        _ => None,
    })
}

/// Adds the operations of the commands not refused to `txn`.
fn push_runs<'c>(
    txn: &mut KvTxnBuilder<'_>,
    commands: impl Iterator<Item = &'c DataCommand>,
    refused: &[Option<Resp>],
) {
    let runs = commands.zip(refused).filter(|(_, r)| r.is_none());
    for (d, _) in runs {
        d.ops.iter().for_each(|op| txn.push(op));
    }
}

/// One reply per command, from how their transaction ended (its first `watched`
/// operations checked watched buckets); a refused command answers its refusal.
fn data_replies<'c>(
    commands: impl Iterator<Item = &'c DataCommand>,
    refused: Vec<Option<Resp>>,
    ran: Result<Ran, Resp>,
    watched: usize,
) -> Together {
    // One refusal (or none) per command.
    let n = refused.len();
    let mut replies = match ran {
        Ok(Ran::Committed(r)) => r.into_iter().skip(watched),
        Ok(Ran::Aborted(why)) if watched > 0 && why == WATCHED_KEY_CHANGED => {
            return Together::WatchedKeyChanged
        }
        Ok(Ran::Aborted(why)) => return Together::Replies(vec![Resp::err(why); n]),
        Err(e) => return Together::Replies(vec![e; n]),
    };
    let answers = commands
        .zip(refused)
        .map(|(d, refused)| match refused {
            Some(e) => e,
            None => d.reply(replies.by_ref().take(d.ops.len()).collect()),
        })
        .collect();
    Together::Replies(answers)
}

/// DBSIZE's reply: the sum of every bucket's count.
fn summed_counts(ran: Result<Ran, Resp>) -> Resp {
    match ran {
        Ok(Ran::Committed(counts)) => {
            let keys = counts.iter().try_fold(0i64, |sum, r| match r {
                Reply::Int(n) => Some(sum + n),
                _ => None,
            });
            keys.map_or_else(
                || Resp::err("ERR DBSIZE could not count a bucket"),
                Resp::Int,
            )
        }
        Ok(Ran::Aborted(why)) => Resp::err(format!("ERR DBSIZE was aborted: {why}")),
        Err(e) => e,
    }
}

/// The reply of a command queued in MULTI that needs no transaction.
fn queued_reply(cmd: Command) -> Resp {
    match cmd {
        Command::Failed(e) => e,
        Command::Ping(None) => Resp::Simple("PONG"),
        Command::Ping(Some(m)) | Command::Echo(m) => Resp::Bulk(m),
        _ => Resp::err("ERR only key commands, PING and ECHO can be queued in MULTI here"),
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
