//! Length-prefixed frames that carry many postcard-encoded messages, for links between nodes
//! and for client connections.
//!
//! A frame is a 12-byte header followed by the payload:
//!
//! ```text
//! magic "QSF" | format 1 | payload length: u32 LE | checksum: u32 LE | payload
//! payload = message count: u32 LE | message 1 | message 2 | ...   (each message in postcard)
//! ```
//!
//! The checksum is the low 32 bits of xxh3-64 over the whole payload (count included). Messages
//! are not length-prefixed: postcard is self-delimiting, and the count, the payload length and
//! the checksum together catch truncation and trailing garbage.
//!
//! Decoding treats the input as hostile: the length is checked against a configurable maximum
//! before anything is allocated, buffers grow only with bytes actually received, and every
//! malformed input becomes a [`FrameError`], never a panic.

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::io::{self, Read, Write};

/// The first four bytes of every frame: "QSF" and the frame format version.
pub const MAGIC: [u8; 4] = *b"QSF\x01";
/// Bytes of the frame header: magic, payload length, checksum.
pub const HEADER_LEN: usize = 12;
/// Bytes of the message count at the start of the payload.
const COUNT_LEN: usize = 4;
/// Largest payload accepted by default. Frames are normally flushed far below this (at
/// [`DEFAULT_FLUSH_BYTES`]); the limit only bounds what a broken or hostile peer can make a
/// node allocate.
pub const DEFAULT_MAX_FRAME: usize = 16 << 20;
/// Payload size at which a sender writes its frame out: large enough to amortise a system call
/// over many small messages, small enough to stay in cache.
pub const DEFAULT_FLUSH_BYTES: usize = 64 << 10;

/// Why a frame could not be read or built.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    #[error("bad magic {0:02x?}: not a qstore frame, or another frame format version")]
    BadMagic([u8; 4]),
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    Oversized { len: usize, max: usize },
    #[error("checksum mismatch: header says {expected:#010x}, payload has {actual:#010x}")]
    Checksum { expected: u32, actual: u32 },
    #[error("cannot decode message: {0}")]
    Decode(String),
    #[error("cannot encode message: {0}")]
    Encode(String),
    #[error("stream ended inside a frame: {got} of {expected} bytes")]
    Truncated { expected: usize, got: usize },
}

/// The frame checksum of `payload`.
fn checksum(payload: &[u8]) -> u32 {
    xxhash_rust::xxh3::xxh3_64(payload) as u32
}

/// Builds frames: messages are appended to one buffer that already has room for the header,
/// so a frame is written with a single `write_all` and no copying.
#[derive(Debug)]
pub struct FrameEncoder {
    /// Header space, message count space, then the encoded messages.
    buf: Vec<u8>,
    count: u32,
    flush_bytes: usize,
    max_frame: usize,
    /// Set when the last message did not fit: the frame ends here and the message after this
    /// offset opens the next frame.
    spill: Option<usize>,
}

impl FrameEncoder {
    /// An encoder that asks to be flushed at `flush_bytes` of payload and never builds a
    /// payload larger than `max_frame`.
    pub fn new(flush_bytes: usize, max_frame: usize) -> Self {
        let max_frame = max_frame.min(u32::MAX as usize);
        let mut buf = Vec::with_capacity(HEADER_LEN + COUNT_LEN + flush_bytes.min(max_frame));
        buf.resize(HEADER_LEN + COUNT_LEN, 0);
        FrameEncoder {
            buf,
            count: 0,
            flush_bytes,
            max_frame,
            spill: None,
        }
    }

    /// Appends `msg` and returns its size in bytes. A message too large for any frame is
    /// refused with [`FrameError::Oversized`] and leaves the encoder unchanged. A message that
    /// only does not fit next to the ones already there is kept for the next frame and
    /// [`should_flush`](Self::should_flush) turns true: call [`write_to`](Self::write_to)
    /// before pushing again.
    pub fn push<M: Serialize + ?Sized>(&mut self, msg: &M) -> Result<usize, FrameError> {
        if self.spill.is_some() {
            return Err(FrameError::Encode(
                "frame is full: write it out first".into(),
            ));
        }
        let start = self.buf.len();
        if let Err(e) = postcard::to_io(msg, &mut self.buf) {
            self.buf.truncate(start);
            return Err(FrameError::Encode(e.to_string()));
        }
        let size = self.buf.len() - start;
        if size == 0 {
            // A zero-byte message would let a frame claim any count with an empty payload;
            // the decoder refuses counts larger than the payload, so refuse them here too.
            return Err(FrameError::Encode(
                "message encodes to zero bytes; every message needs at least one".into(),
            ));
        }
        if self.payload_len() > self.max_frame {
            self.refuse_or_spill(start, size)?;
        }
        self.count += 1;
        Ok(size)
    }

    /// Handles a message that made the payload exceed the limit.
    fn refuse_or_spill(&mut self, start: usize, size: usize) -> Result<(), FrameError> {
        if self.count == 0 || COUNT_LEN + size > self.max_frame {
            self.buf.truncate(start);
            return Err(FrameError::Oversized {
                len: COUNT_LEN + size,
                max: self.max_frame,
            });
        }
        self.spill = Some(start);
        Ok(())
    }

    /// Bytes of payload (count and messages) in the buffer, including a spilled message.
    pub fn payload_len(&self) -> usize {
        self.buf.len() - HEADER_LEN
    }

    /// Messages in the buffer, including a spilled message.
    pub fn count(&self) -> u32 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Whether the frame has reached the flush size (or is full) and should be written now.
    pub fn should_flush(&self) -> bool {
        self.spill.is_some() || self.payload_len() >= self.flush_bytes
    }

    /// Writes the frame (if it holds any message) to `w` and starts the next one. The frame is
    /// consumed even when the write fails: after a failed write the connection is gone and
    /// nobody knows how much of the frame arrived. A spilled message stays for the next frame.
    pub fn write_to<W: Write + ?Sized>(&mut self, w: &mut W) -> io::Result<()> {
        if self.count == 0 {
            return Ok(());
        }
        let end = self.spill.unwrap_or(self.buf.len());
        let in_frame = if self.spill.is_some() {
            self.count - 1
        } else {
            self.count
        };
        self.seal(end, in_frame);
        let result = w.write_all(&self.buf[..end]);
        self.buf.drain(HEADER_LEN + COUNT_LEN..end);
        self.count -= in_frame;
        self.spill = None;
        result
    }

    /// Writes the header and the message count of the frame that ends at `end`.
    fn seal(&mut self, end: usize, count: u32) {
        let (header, payload) = self.buf[..end].split_at_mut(HEADER_LEN);
        payload[..COUNT_LEN].copy_from_slice(&count.to_le_bytes());
        let len = payload.len() as u32; // at most max_frame, itself at most u32::MAX
        header[..4].copy_from_slice(&MAGIC);
        header[4..8].copy_from_slice(&len.to_le_bytes());
        header[8..12].copy_from_slice(&checksum(payload).to_le_bytes());
    }
}

/// A frame with no messages, which encoders never produce otherwise: a node sends it as the
/// last frame of a link when it shuts down on purpose, so that its peer can tell a stop from
/// a failure.
pub fn goodbye_frame() -> [u8; HEADER_LEN + COUNT_LEN] {
    let payload = 0u32.to_le_bytes();
    let mut f = [0u8; HEADER_LEN + COUNT_LEN];
    f[..4].copy_from_slice(&MAGIC);
    f[4..8].copy_from_slice(&(COUNT_LEN as u32).to_le_bytes());
    f[8..12].copy_from_slice(&checksum(&payload).to_le_bytes());
    f[12..].copy_from_slice(&payload);
    f
}

/// Reads frames from a byte stream, reusing one buffer.
#[derive(Debug)]
pub struct FrameDecoder {
    max_frame: usize,
    buf: Vec<u8>,
}

impl FrameDecoder {
    /// A decoder that refuses payloads longer than `max_frame` bytes.
    pub fn new(max_frame: usize) -> Self {
        FrameDecoder {
            max_frame,
            buf: Vec::new(),
        }
    }

    /// Reads one frame and decodes its messages. Blocks until the frame is complete; returns
    /// `Ok(None)` when the stream ends cleanly between frames.
    pub fn read_frame<M, R>(&mut self, r: &mut R) -> Result<Option<Vec<M>>, FrameError>
    where
        M: DeserializeOwned,
        R: Read + ?Sized,
    {
        let mut header = [0u8; HEADER_LEN];
        match read_full(r, &mut header)? {
            0 => return Ok(None),
            HEADER_LEN => {}
            got => {
                return Err(FrameError::Truncated {
                    expected: HEADER_LEN,
                    got,
                })
            }
        }
        let (len, expected) = self.check_header(&header)?;
        self.read_payload(r, len)?;
        let actual = checksum(&self.buf);
        if actual != expected {
            return Err(FrameError::Checksum { expected, actual });
        }
        decode_payload(&self.buf).map(Some)
    }

    /// Validates magic and length; returns the payload length and the expected checksum.
    fn check_header(&self, header: &[u8; HEADER_LEN]) -> Result<(usize, u32), FrameError> {
        let field =
            |i: usize| u32::from_le_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
        if header[..4] != MAGIC {
            return Err(FrameError::BadMagic([
                header[0], header[1], header[2], header[3],
            ]));
        }
        let len = field(4) as usize;
        if len > self.max_frame {
            return Err(FrameError::Oversized {
                len,
                max: self.max_frame,
            });
        }
        Ok((len, field(8)))
    }

    /// Reads `len` payload bytes into the buffer. The buffer grows with the bytes that
    /// actually arrive, so a peer that announces a large frame and sends nothing costs nothing.
    fn read_payload<R: Read + ?Sized>(&mut self, r: &mut R, len: usize) -> Result<(), FrameError> {
        self.buf.clear();
        self.buf.reserve(len.min(DEFAULT_FLUSH_BYTES));
        r.take(len as u64).read_to_end(&mut self.buf)?;
        if self.buf.len() < len {
            return Err(FrameError::Truncated {
                expected: HEADER_LEN + len,
                got: HEADER_LEN + self.buf.len(),
            });
        }
        Ok(())
    }

    /// Capacity of the internal buffer (for tests of the allocation bound).
    #[cfg(test)]
    fn buffer_capacity(&self) -> usize {
        self.buf.capacity()
    }
}

/// Takes the first frame from `bytes`, for readers of non-blocking sockets that gather bytes
/// as they come: `Ok(None)` while the frame is incomplete, else its messages and the bytes it
/// took. Malformed input is an error as soon as it shows (a wrong magic, an oversized
/// length), before the rest arrives.
pub fn parse_frame<M: DeserializeOwned>(
    bytes: &[u8],
    max_frame: usize,
) -> Result<Option<(Vec<M>, usize)>, FrameError> {
    let magic_seen = bytes.len().min(MAGIC.len());
    if bytes[..magic_seen] != MAGIC[..magic_seen] {
        let mut got = [0u8; 4];
        got[..magic_seen].copy_from_slice(&bytes[..magic_seen]);
        return Err(FrameError::BadMagic(got));
    }
    let Some(header) = bytes.first_chunk::<HEADER_LEN>() else {
        return Ok(None);
    };
    let (len, expected) = FrameDecoder::new(max_frame).check_header(header)?;
    let Some(payload) = bytes.get(HEADER_LEN..HEADER_LEN + len) else {
        return Ok(None);
    };
    let actual = checksum(payload);
    if actual != expected {
        return Err(FrameError::Checksum { expected, actual });
    }
    Ok(Some((decode_payload(payload)?, HEADER_LEN + len)))
}

/// Decodes the messages of a payload (message count, then the messages).
pub fn decode_payload<M: DeserializeOwned>(payload: &[u8]) -> Result<Vec<M>, FrameError> {
    let Some((count, mut rest)) = payload.split_first_chunk::<COUNT_LEN>() else {
        return Err(FrameError::Decode(
            "payload shorter than its message count".into(),
        ));
    };
    let count = u32::from_le_bytes(*count) as usize;
    // Every message takes at least one byte, so this bounds the loop.
    if count > rest.len() {
        return Err(FrameError::Decode(format!(
            "{count} messages cannot fit in {} bytes",
            rest.len()
        )));
    }
    // Decoded messages may be much larger than their encoding: reserve only a little up front.
    let mut msgs = Vec::with_capacity(count.min(1024));
    for i in 0..count {
        let (msg, tail) = postcard::take_from_bytes::<M>(rest)
            .map_err(|e| FrameError::Decode(format!("message {i} of {count}: {e}")))?;
        msgs.push(msg);
        rest = tail;
    }
    if !rest.is_empty() {
        return Err(FrameError::Decode(format!(
            "{} bytes left after {count} messages",
            rest.len()
        )));
    }
    Ok(msgs)
}

/// Reads until `buf` is full or the stream ends; returns the bytes read.
fn read_full<R: Read + ?Sized>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_of(msgs: &[u64]) -> Vec<u8> {
        let mut enc = FrameEncoder::new(DEFAULT_FLUSH_BYTES, DEFAULT_MAX_FRAME);
        for m in msgs {
            enc.push(m).unwrap();
        }
        let mut out = Vec::new();
        enc.write_to(&mut out).unwrap();
        out
    }

    #[test]
    fn one_frame_carries_many_messages() {
        let bytes = frame_of(&[1, 300, 70_000]);
        let mut dec = FrameDecoder::new(DEFAULT_MAX_FRAME);
        let mut r = bytes.as_slice();
        assert_eq!(
            dec.read_frame::<u64, _>(&mut r).unwrap(),
            Some(vec![1, 300, 70_000])
        );
        assert!(dec.read_frame::<u64, _>(&mut r).unwrap().is_none());
    }

    #[test]
    fn parse_frame_waits_for_whole_frames_and_agrees_with_the_reader() {
        let mut bytes = frame_of(&[1, 300, 70_000]);
        bytes.extend(frame_of(&[9]));
        let first = bytes.len() - frame_of(&[9]).len();
        for cut in 0..first {
            assert!(parse_frame::<u64>(&bytes[..cut], DEFAULT_MAX_FRAME)
                .unwrap()
                .is_none());
        }
        let (msgs, used) = parse_frame::<u64>(&bytes, DEFAULT_MAX_FRAME)
            .unwrap()
            .unwrap();
        assert_eq!((msgs, used), (vec![1, 300, 70_000], first));
        let (msgs, _) = parse_frame::<u64>(&bytes[used..], DEFAULT_MAX_FRAME)
            .unwrap()
            .unwrap();
        assert_eq!(msgs, vec![9]);
        assert!(matches!(
            parse_frame::<u64>(b"GET / HTTP/1.1", DEFAULT_MAX_FRAME),
            Err(FrameError::BadMagic(_))
        ));
        assert!(matches!(
            parse_frame::<u64>(b"Q", DEFAULT_MAX_FRAME),
            Ok(None)
        ));
        assert!(matches!(
            parse_frame::<u64>(b"X", DEFAULT_MAX_FRAME),
            Err(FrameError::BadMagic(_))
        ));
        let mut corrupt = frame_of(&[5]);
        *corrupt.last_mut().unwrap() ^= 1;
        assert!(matches!(
            parse_frame::<u64>(&corrupt, DEFAULT_MAX_FRAME),
            Err(FrameError::Checksum { .. })
        ));
    }

    #[test]
    fn oversized_length_is_refused_before_allocating() {
        let mut header = Vec::from(MAGIC);
        header.extend_from_slice(&u32::MAX.to_le_bytes());
        header.extend_from_slice(&0u32.to_le_bytes());
        // No payload follows: the decoder must not try to read (or reserve) one.
        let mut dec = FrameDecoder::new(DEFAULT_MAX_FRAME);
        let err = dec
            .read_frame::<u64, _>(&mut header.as_slice())
            .unwrap_err();
        assert!(
            matches!(err, FrameError::Oversized { len, max } if len == u32::MAX as usize && max == DEFAULT_MAX_FRAME),
            "{err}"
        );
        assert_eq!(dec.buffer_capacity(), 0);
    }

    #[test]
    fn announced_length_without_bytes_costs_only_what_arrives() {
        let mut bytes = Vec::from(MAGIC);
        bytes.extend_from_slice(&((DEFAULT_MAX_FRAME) as u32).to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.extend_from_slice(&[0; 10]);
        let mut dec = FrameDecoder::new(DEFAULT_MAX_FRAME);
        let err = dec.read_frame::<u64, _>(&mut bytes.as_slice()).unwrap_err();
        assert!(
            matches!(err, FrameError::Truncated { got, .. } if got == HEADER_LEN + 10),
            "{err}"
        );
        assert!(dec.buffer_capacity() <= 2 * DEFAULT_FLUSH_BYTES);
    }

    #[test]
    fn encoder_refuses_a_message_larger_than_any_frame() {
        let mut enc = FrameEncoder::new(64, 100);
        let err = enc.push(&vec![7u8; 200]).unwrap_err();
        assert!(
            matches!(err, FrameError::Oversized { max: 100, .. }),
            "{err}"
        );
        assert!(enc.is_empty());
    }

    #[test]
    fn a_message_that_does_not_fit_opens_the_next_frame() {
        let mut enc = FrameEncoder::new(1_000, 100);
        enc.push(&vec![1u8; 60]).unwrap();
        assert!(!enc.should_flush());
        enc.push(&vec![2u8; 60]).unwrap();
        assert!(enc.should_flush());
        assert!(
            enc.push(&vec![3u8; 1]).is_err(),
            "a full frame must be written first"
        );
        let mut out = Vec::new();
        enc.write_to(&mut out).unwrap();
        assert_eq!(enc.count(), 1);
        enc.write_to(&mut out).unwrap();
        let mut dec = FrameDecoder::new(100);
        let mut r = out.as_slice();
        assert_eq!(
            dec.read_frame::<Vec<u8>, _>(&mut r).unwrap(),
            Some(vec![vec![1u8; 60]])
        );
        assert_eq!(
            dec.read_frame::<Vec<u8>, _>(&mut r).unwrap(),
            Some(vec![vec![2u8; 60]])
        );
    }

    #[test]
    fn zero_byte_messages_are_refused() {
        let mut enc = FrameEncoder::new(64, 100);
        assert!(matches!(enc.push(&()), Err(FrameError::Encode(_))));
    }

    #[test]
    fn corrupted_frames_are_errors() {
        let good = frame_of(&[5, 6]);
        let mut dec = FrameDecoder::new(DEFAULT_MAX_FRAME);
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        let err = dec
            .read_frame::<u64, _>(&mut flipped.as_slice())
            .unwrap_err();
        assert!(matches!(err, FrameError::Checksum { .. }), "{err}");
        let mut magic = good.clone();
        magic[0] = b'X';
        let err = dec.read_frame::<u64, _>(&mut magic.as_slice()).unwrap_err();
        assert!(matches!(err, FrameError::BadMagic(_)), "{err}");
        let err = dec
            .read_frame::<u64, _>(&mut &good[..good.len() - 1])
            .unwrap_err();
        assert!(matches!(err, FrameError::Truncated { .. }), "{err}");
    }
}
