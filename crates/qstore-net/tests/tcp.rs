//! The TCP transport on loopback: delivery and order under load, accounting, handshake
//! refusals, hostile connections, peer loss and return, injected delay.

use crossbeam_channel::{unbounded, Receiver};
use qstore_core::config::NetConfig;
use qstore_core::NodeId;
use qstore_net::auth::ClusterSecret;
use qstore_net::frame::goodbye_frame;
use qstore_net::frame::{FrameEncoder, MAGIC};
use qstore_net::tcp::{accept_as, dial_as};
use qstore_net::{
    encoded_len, Envelope, Handshake, PeerEvent, PeerEventKind, TcpConfig, TcpTransport, Transport,
};
use serde::{Deserialize, Serialize};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Msg {
    seq: u64,
    /// Microseconds since the test's start when the message was sent.
    sent_us: u64,
    pad: Vec<u8>,
}

impl Msg {
    fn new(seq: u64) -> Self {
        Msg {
            seq,
            sent_us: 0,
            pad: vec![seq as u8; (seq % 7) as usize],
        }
    }
}

type Node = (TcpTransport<Msg>, Receiver<Envelope<Msg>>);

const WAIT: Duration = Duration::from_secs(5);

/// Binds `n` listeners on loopback ports chosen by the system.
fn listeners(n: usize) -> (Vec<TcpListener>, Vec<SocketAddr>) {
    let ls: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let addrs = ls.iter().map(|l| l.local_addr().unwrap()).collect();
    (ls, addrs)
}

/// An address nobody listens on.
fn dead_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn secret() -> ClusterSecret {
    ClusterSecret::from_material(b"the secret of the test cluster").unwrap()
}

fn handshake(cluster_id: u64) -> Handshake {
    Handshake {
        cluster_id,
        protocol: "qstore".into(),
        format_version: 1,
        secret: secret(),
    }
}

fn config(me: u32, peers: &[SocketAddr], cluster_id: u64) -> TcpConfig {
    let mut cfg = TcpConfig::new(NodeId(me), peers.to_vec(), handshake(cluster_id));
    cfg.connect_backoff_min = Duration::from_millis(2);
    cfg.connect_backoff_max = Duration::from_millis(50);
    cfg.handshake_timeout = Duration::from_secs(1);
    cfg
}

fn start(
    cfg: TcpConfig,
    listener: TcpListener,
    events: Option<crossbeam_channel::Sender<PeerEvent>>,
) -> Node {
    let (inbox, rx) = unbounded();
    (
        TcpTransport::start(cfg, listener, inbox, events).unwrap(),
        rx,
    )
}

/// Starts a cluster with one listener per address; all nodes use `cfg_of`.
fn cluster(n: usize, cfg_of: impl Fn(u32, &[SocketAddr]) -> TcpConfig) -> Vec<Node> {
    let (ls, addrs) = listeners(n);
    let nodes: Vec<Node> = ls
        .into_iter()
        .enumerate()
        .map(|(i, l)| start(cfg_of(i as u32, &addrs), l, None))
        .collect();
    for (t, _) in &nodes {
        t.wait_connected(WAIT).unwrap();
    }
    nodes
}

/// Log lines of every test in this binary (the transport logs from its own threads, so the
/// subscriber must be global).
fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || LogSink(sink.clone()))
            .try_init()
            .unwrap();
        buf
    })
}

struct LogSink(Arc<Mutex<Vec<u8>>>);

impl Write for LogSink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Waits until a log line contains `text`.
fn wait_logged(text: &str) -> bool {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if String::from_utf8_lossy(&logs().lock().unwrap()).contains(text) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

#[test]
fn three_nodes_exchange_messages_in_order_and_count_them() {
    const PER_LINK: u64 = 3_000;
    // Small frames, so that the load spans many of them; node 2 also waits for more
    // messages before writing a frame out.
    const FLUSH: usize = 2048;
    let nodes = cluster(3, |me, addrs| TcpConfig {
        flush_bytes: FLUSH,
        flush_after: Duration::from_micros(if me == 2 { 100 } else { 0 }),
        ..config(me, addrs, 7)
    });
    std::thread::scope(|s| {
        for (me, (t, _)) in nodes.iter().enumerate() {
            s.spawn(move || {
                for seq in 0..PER_LINK {
                    for to in 0..3 {
                        t.send(NodeId(me as u32), NodeId(to), Msg::new(seq));
                    }
                }
            });
        }
    });
    let bytes: u64 = (0..PER_LINK)
        .map(|s| encoded_len(&Msg::new(s)) as u64)
        .sum();
    for (me, (t, rx)) in nodes.iter().enumerate() {
        let mut next = [0u64; 3];
        for _ in 0..3 * PER_LINK {
            let env = rx.recv_timeout(WAIT).expect("every message arrives");
            assert_eq!(
                env.msg,
                Msg::new(next[env.from.index()]),
                "link {:?}->{me} is FIFO",
                env.from
            );
            next[env.from.index()] += 1;
        }
        assert!(
            rx.recv_timeout(Duration::from_millis(20)).is_err(),
            "no duplicates"
        );
        // Three destinations (itself included), each counted like the in-process transport.
        assert_eq!(t.counters().snapshot()[me], (3 * PER_LINK, 3 * bytes));
        let frames = t.counters().frames()[me];
        // Frames fill up to FLUSH bytes, and hold several messages each.
        let at_least = 2 * bytes / (2 * FLUSH as u64);
        assert!(
            frames >= at_least && frames < 2 * PER_LINK / 4,
            "{frames} frames for {} messages",
            2 * PER_LINK
        );
    }
}

#[test]
fn a_message_too_large_for_any_frame_is_dropped_and_the_link_goes_on() {
    logs();
    let nodes = cluster(2, |me, addrs| TcpConfig {
        max_frame: 1024,
        ..config(me, addrs, 7)
    });
    let big = Msg {
        pad: vec![1; 2000],
        ..Msg::new(1)
    };
    nodes[0].0.send(NodeId(0), NodeId(1), Msg::new(0));
    nodes[0].0.send(NodeId(0), NodeId(1), big);
    nodes[0].0.send(NodeId(0), NodeId(1), Msg::new(2));
    assert_eq!(nodes[1].1.recv_timeout(WAIT).unwrap().msg, Msg::new(0));
    assert_eq!(nodes[1].1.recv_timeout(WAIT).unwrap().msg, Msg::new(2));
    assert!(wait_logged("dropping a message to peer 1"));
}

#[test]
fn mismatched_cluster_id_is_refused_and_logged() {
    logs();
    let (mut ls, addrs) = listeners(2);
    let (events_tx, events) = unbounded();
    let b = start(config(1, &addrs, 5), ls.pop().unwrap(), Some(events_tx));
    let a = start(config(0, &addrs, 7), ls.pop().unwrap(), None);
    let err = b.0.wait_connected(Duration::from_millis(300)).unwrap_err();
    assert!(err.contains(&format!("0 ({})", addrs[0])), "{err}");
    assert!(wait_logged("refusing peer 127.0.0.1"));
    assert!(
        wait_logged("cluster id 5 != 7"),
        "the acceptor names the mismatch"
    );
    assert!(
        wait_logged("refused the connection: cluster id 5 != 7"),
        "so does the dialer"
    );
    b.0.send(NodeId(1), NodeId(0), Msg::new(1));
    a.0.send(NodeId(0), NodeId(1), Msg::new(2));
    assert!(a.1.recv_timeout(Duration::from_millis(100)).is_err());
    assert!(b.1.recv_timeout(Duration::from_millis(100)).is_err());
    assert!(events.try_recv().is_err(), "a refused link never comes up");
}

fn frame_of<T: Serialize>(msgs: &[T]) -> Vec<u8> {
    let mut enc = FrameEncoder::new(1 << 16, 1 << 20);
    for m in msgs {
        enc.push(m).unwrap();
    }
    let mut out = Vec::new();
    enc.write_to(&mut out).unwrap();
    out
}

/// Connects to node 0 at `addr` and completes the handshake as node `node` of cluster 7.
fn raw_peer(addr: SocketAddr, node: u32) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    dial_as(&s, &handshake(7), NodeId(node), 1, NodeId(0), WAIT).unwrap();
    s
}

/// Asserts that the node closes `s` after it sent `bytes`.
fn assert_closed_after(mut s: TcpStream, bytes: &[u8]) {
    let _ = s.write_all(bytes);
    let _ = s.shutdown(Shutdown::Write);
    let mut sink = [0u8; 64];
    match s.read(&mut sink) {
        Ok(0) => {}
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        other => panic!("connection still open: {other:?}"),
    }
}

#[test]
fn hostile_connections_are_closed_and_the_node_keeps_working() {
    logs();
    // Node 2 exists only in the peer list; raw connections claim to be it.
    let (mut ls, mut addrs) = listeners(2);
    addrs.push(dead_addr());
    let b = start(config(1, &addrs, 7), ls.pop().unwrap(), None);
    let a = start(config(0, &addrs, 7), ls.pop().unwrap(), None);
    let err = a.0.wait_connected(Duration::from_millis(50)).unwrap_err();
    assert!(
        err.contains(&format!("2 ({})", addrs[2])) && !err.contains(" 1 ("),
        "{err}"
    );

    // Not a qstore frame at all: refused at the handshake.
    assert_closed_after(
        TcpStream::connect(addrs[0]).unwrap(),
        b"GET / HTTP/1.1\r\n\r\n",
    );
    assert!(wait_logged("no valid handshake"));

    // A valid frame from a hand-made peer is delivered, then a corrupted one closes it.
    let mut raw = raw_peer(addrs[0], 2);
    raw.write_all(&frame_of(&[Msg::new(9)])).unwrap();
    let env = a.1.recv_timeout(WAIT).unwrap();
    assert_eq!((env.from, env.msg), (NodeId(2), Msg::new(9)));
    let mut corrupt = frame_of(&[Msg::new(10)]);
    *corrupt.last_mut().unwrap() ^= 0x40;
    assert_closed_after(raw, &corrupt);
    assert!(wait_logged("checksum mismatch"));

    // An oversized length, a truncated frame, and garbage behind a valid checksum.
    let mut huge = Vec::from(MAGIC);
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    huge.extend_from_slice(&[0; 4]);
    assert_closed_after(raw_peer(addrs[0], 2), &huge);
    assert!(wait_logged("exceeds the limit"));
    let whole = frame_of(&[Msg::new(11), Msg::new(12)]);
    assert_closed_after(raw_peer(addrs[0], 2), &whole[..whole.len() - 3]);
    assert!(wait_logged("stream ended inside a frame"));
    let payload = [1u8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff];
    let mut garbage = Vec::from(MAGIC);
    garbage.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    garbage.extend_from_slice(&(xxhash_rust::xxh3::xxh3_64(&payload) as u32).to_le_bytes());
    garbage.extend_from_slice(&payload);
    assert_closed_after(raw_peer(addrs[0], 2), &garbage);
    assert!(wait_logged("cannot decode message"));

    // None of that disturbed the real peer.
    for seq in 0..100 {
        b.0.send(NodeId(1), NodeId(0), Msg::new(seq));
    }
    for seq in 0..100 {
        let env = a.1.recv_timeout(WAIT).unwrap();
        assert_eq!((env.from, env.msg), (NodeId(1), Msg::new(seq)));
    }
}

fn next_event(events: &Receiver<PeerEvent>) -> PeerEvent {
    events.recv_timeout(WAIT).expect("a peer event")
}

#[test]
fn a_lost_peer_goes_down_and_comes_back_on_the_same_address() {
    let (mut ls, addrs) = listeners(2);
    let (events_tx, events) = unbounded();
    // The same process (incarnation) reconnecting, as after a network failure.
    let b_config = || TcpConfig {
        incarnation: 11,
        ..config(1, &addrs, 7)
    };
    let b = start(b_config(), ls.pop().unwrap(), None);
    let a = start(config(0, &addrs, 7), ls.pop().unwrap(), Some(events_tx));
    a.0.wait_connected(WAIT).unwrap();
    assert_eq!(
        next_event(&events),
        PeerEvent {
            peer: NodeId(1),
            kind: PeerEventKind::Up
        }
    );

    let stopped = Instant::now();
    drop(b);
    assert!(
        stopped.elapsed() < Duration::from_secs(1),
        "shutdown is prompt"
    );
    // Dropped on purpose: it said goodbye, so this is a stop rather than a failure.
    let down = next_event(&events);
    assert_eq!(down.kind, PeerEventKind::Stopped, "{down:?}");
    assert_eq!(down.peer, NodeId(1));

    let listener = TcpListener::bind(addrs[1]).expect("the port is free again");
    let b = start(b_config(), listener, None);
    assert_eq!(
        next_event(&events),
        PeerEvent {
            peer: NodeId(1),
            kind: PeerEventKind::Up
        }
    );
    a.0.send(NodeId(0), NodeId(1), Msg::new(1));
    b.0.send(NodeId(1), NodeId(0), Msg::new(2));
    assert_eq!(b.1.recv_timeout(WAIT).unwrap().msg, Msg::new(1));
    assert_eq!(a.1.recv_timeout(WAIT).unwrap().msg, Msg::new(2));
}

/// A node that stopped reading its inbox (it is shutting down) keeps its connections until
/// its transport stops: what peers still send it is dropped, and they see it stop, not fail.
#[test]
fn a_node_that_stopped_reading_its_inbox_stops_rather_than_fails() {
    let (mut ls, addrs) = listeners(2);
    let (events_tx, events) = unbounded();
    let (b, b_inbox) = start(config(1, &addrs, 7), ls.pop().unwrap(), None);
    let a = start(config(0, &addrs, 7), ls.pop().unwrap(), Some(events_tx));
    a.0.wait_connected(WAIT).unwrap();
    assert_eq!(next_event(&events).kind, PeerEventKind::Up);
    drop(b_inbox);
    for seq in 0..200 {
        a.0.send(NodeId(0), NodeId(1), Msg::new(seq));
        std::thread::sleep(Duration::from_millis(1));
    }
    let event = events.recv_timeout(Duration::from_millis(300));
    assert!(
        event.is_err(),
        "the link to a live peer stays up: {event:?}"
    );
    drop(b);
    assert_eq!(next_event(&events).kind, PeerEventKind::Stopped);
}

/// Node 0 of a two-node cluster whose node 1 is played on raw sockets, once both links are
/// up: the node, its peer events, the connection node 0 dialed (node 1 reads it) and the one
/// node 1 dialed (node 0 reads it).
fn node_and_raw_peer() -> (Node, Receiver<PeerEvent>, TcpStream, TcpStream) {
    let (mut ls, addrs) = listeners(2);
    let (events_tx, events) = unbounded();
    let fake_b = ls.pop().unwrap();
    let a = start(config(0, &addrs, 7), ls.pop().unwrap(), Some(events_tx));
    let (from_a, _) = fake_b.accept().unwrap();
    let dialer = accept_as(&from_a, &handshake(7), NodeId(1), 1, 2, WAIT).unwrap();
    assert_eq!(dialer, NodeId(0));
    let to_a = raw_peer(addrs[0], 1);
    assert_eq!(next_event(&events).kind, PeerEventKind::Up);
    (a, events, from_a, to_a)
}

/// A peer that stops closes the connections it reads before its goodbye, sent on the one it
/// writes, has arrived: the node still sees a stop, not a failure, because it waits for the
/// connection it reads from that peer to end before it judges.
#[test]
fn a_goodbye_that_arrives_after_the_other_connection_closed_is_a_stop() {
    let (_a, events, from_a, mut to_a) = node_and_raw_peer();
    // Closes the connection node 0 writes to (node 0 notices within its idle check), and only
    // then says goodbye on the one node 0 reads.
    from_a.shutdown(Shutdown::Both).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    to_a.write_all(&goodbye_frame()).unwrap();
    to_a.shutdown(Shutdown::Both).unwrap();
    assert_eq!(next_event(&events).kind, PeerEventKind::Stopped);
}

/// A peer that crashes closes both connections at once, with no goodbye: a failure.
#[test]
fn a_peer_gone_without_a_goodbye_is_down() {
    let (_a, events, from_a, to_a) = node_and_raw_peer();
    let started = Instant::now();
    to_a.shutdown(Shutdown::Both).unwrap();
    from_a.shutdown(Shutdown::Both).unwrap();
    assert!(matches!(next_event(&events).kind, PeerEventKind::Down(_)));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "noticed at once"
    );
}

#[test]
fn injected_delay_holds_messages_and_keeps_the_link_fifo() {
    let delay = NetConfig {
        delay_us: 20_000,
        jitter_us: 5_000,
        ..Default::default()
    };
    let nodes = cluster(2, |me, addrs| TcpConfig {
        net: delay.clone(),
        ..config(me, addrs, 7)
    });
    let start = Instant::now();
    for seq in 0..50 {
        let msg = Msg {
            sent_us: start.elapsed().as_micros() as u64,
            ..Msg::new(seq)
        };
        nodes[0].0.send(NodeId(0), NodeId(1), msg);
    }
    for seq in 0..50 {
        let msg = nodes[1].1.recv_timeout(WAIT).unwrap().msg;
        let held = start.elapsed().as_micros() as u64 - msg.sent_us;
        assert_eq!(msg.seq, seq);
        assert!(
            held >= delay.delay_us,
            "message {seq} arrived after {held} µs"
        );
    }
}

#[test]
fn a_peer_without_the_secret_is_refused_both_ways() {
    logs();
    let (mut ls, addrs) = listeners(2);
    let other = TcpConfig {
        handshake: Handshake {
            secret: ClusterSecret::from_material(b"another cluster's secret").unwrap(),
            ..handshake(7)
        },
        ..config(1, &addrs, 7)
    };
    let b = start(other, ls.pop().unwrap(), None);
    let a = start(config(0, &addrs, 7), ls.pop().unwrap(), None);
    assert!(a.0.wait_connected(Duration::from_millis(300)).is_err());
    assert!(b.0.wait_connected(Duration::from_millis(10)).is_err());
    assert!(wait_logged("could not prove it holds the cluster secret"));
}

/// The handshake's wire format, written out field by field, for peers that do not follow it.
#[derive(Serialize, Deserialize)]
struct Hello {
    cluster_id: u64,
    node: u32,
    protocol: String,
    format_version: u32,
    incarnation: u64,
    nonce: [u8; 32],
}

#[derive(Deserialize)]
enum Reply {
    Accept {
        #[allow(dead_code)]
        hello: Hello,
        #[allow(dead_code)]
        proof: [u8; 32],
    },
    Refuse(#[allow(dead_code)] String),
}

#[derive(Deserialize, Debug)]
enum Verdict {
    Welcome,
    Refuse { reason: String, restarted: bool },
}

fn read_one<T: serde::de::DeserializeOwned>(s: &mut TcpStream) -> T {
    let msgs = qstore_net::FrameDecoder::new(4096)
        .read_frame::<T, _>(s)
        .unwrap()
        .expect("an answer");
    msgs.into_iter().next().unwrap()
}

#[test]
fn an_impersonator_cannot_replace_a_connected_peer() {
    logs();
    let nodes = cluster(2, |me, addrs| config(me, addrs, 7));
    let addr = nodes[0].0.local_addr();
    // Claims to be node 1, with the right cluster id and a made-up proof.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let hello = Hello {
        cluster_id: 7,
        node: 1,
        protocol: "qstore".into(),
        format_version: 1,
        incarnation: 1,
        nonce: [3; 32],
    };
    s.write_all(&frame_of(&[hello])).unwrap();
    assert!(matches!(read_one::<Reply>(&mut s), Reply::Accept { .. }));
    s.write_all(&frame_of(&[[0x5au8; 32]])).unwrap();
    match read_one::<Verdict>(&mut s) {
        Verdict::Refuse { reason, restarted } => {
            assert!(
                reason.contains("cannot prove it holds the cluster secret"),
                "{reason}"
            );
            assert!(!restarted);
        }
        other => panic!("an impostor was welcomed: {other:?}"),
    }
    assert_closed_after(s, &frame_of(&[Msg::new(99)]));
    // A dialer that checks the acceptor's proof refuses a node holding another secret.
    let s = TcpStream::connect(addr).unwrap();
    let forged = Handshake {
        secret: ClusterSecret::from_material(b"a guess at the secret").unwrap(),
        ..handshake(7)
    };
    let err = dial_as(&s, &forged, NodeId(1), 1, NodeId(0), WAIT).unwrap_err();
    assert!(err.to_string().contains("secret"), "{err}");
    // The real node 1's connection was never replaced: its messages still flow.
    for seq in 0..50 {
        nodes[1].0.send(NodeId(1), NodeId(0), Msg::new(seq));
    }
    for seq in 0..50 {
        let env = nodes[0].1.recv_timeout(WAIT).unwrap();
        assert_eq!((env.from, env.msg), (NodeId(1), Msg::new(seq)));
    }
}

#[test]
fn a_restarted_peer_is_refused_reported_and_told_why() {
    logs();
    let (mut ls, addrs) = listeners(2);
    let (events_tx, events) = unbounded();
    let b = start(config(1, &addrs, 7), ls.pop().unwrap(), None);
    let a = start(config(0, &addrs, 7), ls.pop().unwrap(), Some(events_tx));
    a.0.wait_connected(WAIT).unwrap();
    assert_eq!(next_event(&events).kind, PeerEventKind::Up);
    drop(b);
    assert_eq!(next_event(&events).kind, PeerEventKind::Stopped);

    // A new process for node 1: another incarnation, and none of node 1's old state.
    let listener = TcpListener::bind(addrs[1]).expect("the port is free again");
    let b = start(config(1, &addrs, 7), listener, None);
    let restarted = next_event(&events);
    assert_eq!(restarted.peer, NodeId(1));
    assert!(
        matches!(&restarted.kind, PeerEventKind::Restarted(why)
            if why.contains("node 1 restarted") && why.contains("restart the cluster")),
        "{restarted:?}"
    );
    // The restarted node learns why at once, rather than after its whole connect timeout.
    let waited = Instant::now();
    let err = b.0.wait_connected(Duration::from_secs(20)).unwrap_err();
    assert!(err.contains("restarted"), "{err}");
    assert!(
        waited.elapsed() < Duration::from_secs(5),
        "{:?}",
        waited.elapsed()
    );
    // Nothing flows between them any more.
    a.0.send(NodeId(0), NodeId(1), Msg::new(1));
    assert!(b.1.recv_timeout(Duration::from_millis(200)).is_err());
}

#[test]
fn a_handshake_has_one_deadline_however_slowly_bytes_come() {
    logs();
    let (mut ls, mut addrs) = listeners(1);
    addrs.push(dead_addr());
    let cfg = TcpConfig {
        handshake_timeout: Duration::from_millis(500),
        ..config(0, &addrs, 7)
    };
    let a = start(cfg, ls.pop().unwrap(), None);
    let mut s = TcpStream::connect(a.0.local_addr()).unwrap();
    // A valid-looking header, a byte at a time: every read gets a byte well within any
    // per-read timeout, but the whole handshake cannot finish by its deadline.
    let opened = Instant::now();
    let header = frame_of(&[Msg::new(1)]);
    let mut closed = false;
    for b in header.iter().cycle().take(100) {
        std::thread::sleep(Duration::from_millis(100));
        if s.write_all(&[*b]).is_err() {
            closed = true;
            break;
        }
    }
    let mut sink = [0u8; 16];
    s.set_read_timeout(Some(WAIT)).unwrap();
    closed |= matches!(s.read(&mut sink), Ok(0) | Err(_));
    assert!(closed, "the slow connection was never closed");
    assert!(
        opened.elapsed() < Duration::from_secs(4),
        "closed only after {:?}",
        opened.elapsed()
    );
}

#[test]
fn silent_connections_cannot_keep_a_real_peer_out() {
    logs();
    let (ls, addrs) = listeners(2);
    let mut ls = ls.into_iter();
    let short = |me| TcpConfig {
        handshake_timeout: Duration::from_millis(300),
        ..config(me, &addrs, 7)
    };
    let a = start(short(0), ls.next().unwrap(), None);
    // Far more silent connections than the node takes handshakes at once.
    let silent: Vec<TcpStream> = (0..3 * qstore_net::tcp::MAX_PENDING_HANDSHAKES)
        .map(|_| TcpStream::connect(addrs[0]).unwrap())
        .collect();
    let b = start(short(1), ls.next().unwrap(), None);
    a.0.wait_connected(WAIT).unwrap();
    b.0.wait_connected(WAIT).unwrap();
    b.0.send(NodeId(1), NodeId(0), Msg::new(5));
    assert_eq!(a.1.recv_timeout(WAIT).unwrap().msg, Msg::new(5));
    drop(silent);
}
