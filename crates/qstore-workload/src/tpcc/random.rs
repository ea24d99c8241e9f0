//! TPC-C's random inputs (clauses 2.1.6 and 4.3.2): NURand, random strings, last names and
//! zip codes. Everything draws from `qstore_core::rng`'s seeded generator, so a load and a
//! transaction stream are the same for the same seed.

use qstore_core::rng::Rng;
use rand::{Rng as _, RngCore};

/// NURand's `A` for C_LAST, C_ID and OL_I_ID (clause 2.1.6).
pub const A_C_LAST: u32 = 255;
pub const A_C_ID: u32 = 1023;
pub const A_OL_I_ID: u32 = 8191;

/// A uniform integer in `lo..=hi`.
#[inline]
pub fn uniform(rng: &mut Rng, lo: u32, hi: u32) -> u32 {
    rng.random_range(lo..=hi)
}

/// A uniform amount of money in `lo..=hi` cents.
#[inline]
pub fn money(rng: &mut Rng, lo: i64, hi: i64) -> i64 {
    rng.random_range(lo..=hi)
}

/// NURand(A, x, y) = (((random(0, A) | random(x, y)) + C) % (y - x + 1)) + x.
#[inline]
pub fn nurand(rng: &mut Rng, a: u32, x: u32, y: u32, c: u32) -> u32 {
    debug_assert!(x <= y && c <= a, "NURand({a}, {x}, {y}) with C = {c}");
    ((uniform(rng, 0, a) | uniform(rng, x, y)) + c) % (y - x + 1) + x
}

/// The run-time constants C of NURand (clause 2.1.6.1), one per use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NuRandC {
    pub c_last: u32,
    pub c_id: u32,
    pub ol_i_id: u32,
}

impl NuRandC {
    /// Constants drawn at random in `0..=A`: those of the load.
    pub fn random(rng: &mut Rng) -> Self {
        NuRandC {
            c_last: uniform(rng, 0, A_C_LAST),
            c_id: uniform(rng, 0, A_C_ID),
            ol_i_id: uniform(rng, 0, A_OL_I_ID),
        }
    }

    /// Whether C_LAST's constant `run` may follow `load`: their difference must be in
    /// 65..=119 and be neither 96 nor 112 (clause 2.1.6.1), so that the run's last names are
    /// not distributed like the load's.
    pub fn c_last_delta_ok(load: u32, run: u32) -> bool {
        let delta = load.abs_diff(run);
        (65..=119).contains(&delta) && delta != 96 && delta != 112
    }

    /// The constants of a run on data loaded with `self`: C_LAST's drawn uniformly among the
    /// values the delta rule allows (there is always one: 0..=255 reaches 65 away from any
    /// value on one side at least); C_ID's and OL_I_ID's kept, which the spec allows.
    pub fn for_run(&self, rng: &mut Rng) -> Self {
        let load = self.c_last;
        let allowed = || (0..=A_C_LAST).filter(move |&run| Self::c_last_delta_ok(load, run));
        let pick = rng.random_range(0..allowed().count());
        NuRandC {
            c_last: allowed().nth(pick).expect("pick < count"),
            ..*self
        }
    }
}

const ALNUM: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// Fills `out` with characters of `alphabet`, four per 64 random bits: each 16-bit piece
/// scaled to the alphabet (a bias below 1/1000 between characters, which the spec does not
/// mind, for a load several times faster than one bounded draw per character).
fn fill_from(rng: &mut Rng, alphabet: &[u8], out: &mut [u8]) {
    let n = alphabet.len() as u64;
    for chunk in out.chunks_mut(4) {
        let mut bits = rng.next_u64();
        for b in chunk {
            *b = alphabet[(((bits & 0xFFFF) * n) >> 16) as usize];
            bits >>= 16;
        }
    }
}

/// Writes a random a-string (letters and digits) of a uniform length in `min..=max` at the
/// start of `out`, which must hold `max` bytes; returns its length.
pub fn a_string_into(rng: &mut Rng, min: usize, max: usize, out: &mut [u8]) -> usize {
    let len = rng.random_range(min..=max);
    fill_from(rng, ALNUM, &mut out[..len]);
    len
}

/// As [`a_string_into`], for an n-string (digits).
pub fn n_string_into(rng: &mut Rng, min: usize, max: usize, out: &mut [u8]) -> usize {
    let len = rng.random_range(min..=max);
    fill_from(rng, &ALNUM[..10], &mut out[..len]);
    len
}

pub fn a_string(rng: &mut Rng, min: usize, max: usize) -> Vec<u8> {
    let mut s = vec![0; max];
    let len = a_string_into(rng, min, max, &mut s);
    s.truncate(len);
    s
}

pub fn n_string(rng: &mut Rng, min: usize, max: usize) -> Vec<u8> {
    let mut s = vec![0; max];
    let len = n_string_into(rng, min, max, &mut s);
    s.truncate(len);
    s
}

/// The marker of "original" items and stock (clause 4.3.3.1).
pub const ORIGINAL: &[u8; 8] = b"ORIGINAL";

/// Overwrites 8 consecutive bytes of `s`, at a random position, with "ORIGINAL".
pub fn put_original(rng: &mut Rng, s: &mut [u8]) {
    assert!(
        s.len() >= ORIGINAL.len(),
        "I_DATA and S_DATA hold 26 or more"
    );
    let at = rng.random_range(0..=s.len() - ORIGINAL.len());
    s[at..at + ORIGINAL.len()].copy_from_slice(ORIGINAL);
}

/// A zip code: 4 random digits and "11111" (clause 4.3.2.7), into `out[..9]`.
pub fn zip_into(rng: &mut Rng, out: &mut [u8]) {
    fill_from(rng, &ALNUM[..10], &mut out[..4]);
    out[4..9].copy_from_slice(b"11111");
}

/// The syllables of last names (clause 4.3.2.3).
pub const SYLLABLES: [&str; 10] = [
    "BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING",
];

/// Longest last name: three 5-letter syllables.
pub const MAX_LAST_NAME: usize = 15;

/// Writes the last name of number `n` (0..=999), its three digits spelled with
/// [`SYLLABLES`], at the start of `out`; returns its length.
pub fn last_name_into(n: u32, out: &mut [u8]) -> usize {
    debug_assert!(n < 1000, "last name number {n}");
    let mut len = 0;
    for digit in [n / 100 % 10, n / 10 % 10, n % 10] {
        let s = SYLLABLES[digit as usize].as_bytes();
        out[len..len + s.len()].copy_from_slice(s);
        len += s.len();
    }
    len
}

/// The last name of number `n` (0..=999).
pub fn last_name(n: u32) -> String {
    let mut buf = [0u8; MAX_LAST_NAME];
    let len = last_name_into(n, &mut buf);
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

/// Shuffles `v` uniformly (Fisher-Yates).
pub fn shuffle<T>(rng: &mut Rng, v: &mut [T]) {
    for i in (1..v.len()).rev() {
        v.swap(i, rng.random_range(0..=i));
    }
}

/// A random permutation of `1..=n`.
pub fn permutation(rng: &mut Rng, n: u32) -> Vec<u32> {
    let mut v: Vec<u32> = (1..=n).collect();
    shuffle(rng, &mut v);
    v
}

/// Exactly `k` of `1..=n`, chosen at random, as flags indexed by number (index 0 unused):
/// the spec's "10% of the rows, selected at random".
pub fn choose(rng: &mut Rng, n: u32, k: u32) -> Vec<bool> {
    assert!(k <= n, "choosing {k} of {n}");
    let mut ids: Vec<u32> = (1..=n).collect();
    for i in 0..k as usize {
        let j = rng.random_range(i..ids.len());
        ids.swap(i, j);
    }
    let mut chosen = vec![false; n as usize + 1];
    for &id in &ids[..k as usize] {
        chosen[id as usize] = true;
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use qstore_core::rng::stream;

    #[test]
    fn nurand_stays_in_range_and_reaches_both_ends() {
        let mut rng = stream(1, 2);
        for (a, x, y) in [
            (A_C_LAST, 0, 999),
            (A_C_ID, 1, 3000),
            (A_OL_I_ID, 1, 100_000),
        ] {
            for c in [0, 1, a / 2, a] {
                let (mut lo, mut hi) = (u32::MAX, 0);
                for _ in 0..200_000 {
                    let v = nurand(&mut rng, a, x, y, c);
                    assert!((x..=y).contains(&v), "NURand({a}, {x}, {y}) C={c}: {v}");
                    lo = lo.min(v);
                    hi = hi.max(v);
                }
                assert!(lo < x + 20 && hi > y - 20, "{a} {c}: {lo}..{hi}");
            }
        }
    }

    #[test]
    fn nurand_is_skewed_as_the_spec_means() {
        let mut rng = stream(3, 4);
        let mut counts = vec![0u32; 1000];
        for _ in 0..256_000 {
            counts[nurand(&mut rng, A_C_LAST, 0, 999, 0) as usize] += 1;
        }
        let max = *counts.iter().max().unwrap();
        // The likeliest values have probability 3^8 / 256000, 6561 draws in 256000.
        assert!((6_000..7_200).contains(&max), "{max}");
        assert!(counts.iter().filter(|&&n| n < 100).count() > 300);
    }

    #[test]
    fn run_constant_keeps_the_delta_rule_for_every_load_constant() {
        assert!(NuRandC::c_last_delta_ok(0, 65));
        assert!(NuRandC::c_last_delta_ok(200, 81));
        assert!(!NuRandC::c_last_delta_ok(0, 64));
        assert!(!NuRandC::c_last_delta_ok(0, 120));
        assert!(!NuRandC::c_last_delta_ok(100, 4));
        assert!(!NuRandC::c_last_delta_ok(0, 112));
        let mut rng = stream(5, 6);
        for c_last in 0..=A_C_LAST {
            let load = NuRandC {
                c_last,
                c_id: 17,
                ol_i_id: 8191,
            };
            for _ in 0..8 {
                let run = load.for_run(&mut rng);
                assert!(
                    NuRandC::c_last_delta_ok(c_last, run.c_last),
                    "{load:?} {run:?}"
                );
                assert!(run.c_last <= A_C_LAST);
                assert_eq!((run.c_id, run.ol_i_id), (17, 8191));
            }
        }
        for _ in 0..100 {
            let c = NuRandC::random(&mut rng);
            assert!(c.c_last <= A_C_LAST && c.c_id <= A_C_ID && c.ol_i_id <= A_OL_I_ID);
        }
        let a = NuRandC::random(&mut stream(9, 9)).for_run(&mut stream(9, 10));
        let b = NuRandC::random(&mut stream(9, 9)).for_run(&mut stream(9, 10));
        assert_eq!(a, b, "same seed, same constants");
    }

    #[test]
    fn last_names_are_the_specs() {
        assert_eq!(last_name(0), "BARBARBAR");
        assert_eq!(last_name(371), "PRICALLYOUGHT");
        assert_eq!(last_name(999), "EINGEINGEING");
        assert_eq!(last_name(40), "BARPRESBAR");
        assert_eq!(last_name(7), "BARBARCALLY");
        assert_eq!(last_name(888), "ATIONATIONATION");
        let longest = (0..1000).map(|n| last_name(n).len()).max();
        assert_eq!(longest, Some(MAX_LAST_NAME));
    }

    #[test]
    fn strings_have_the_asked_lengths_and_characters() {
        let mut rng = stream(7, 8);
        let mut total = 0;
        for _ in 0..10_000 {
            let s = a_string(&mut rng, 8, 16);
            assert!((8..=16).contains(&s.len()));
            assert!(s.iter().all(u8::is_ascii_alphanumeric));
            total += s.len();
        }
        let mean = total as f64 / 10_000.0;
        assert!((mean - 12.0).abs() < 0.2, "{mean}");
        let all: std::collections::BTreeSet<u8> =
            (0..200).flat_map(|_| a_string(&mut rng, 24, 24)).collect();
        assert_eq!(all.len(), 62, "every letter and digit comes up");
        let n = n_string(&mut rng, 16, 16);
        assert!(n.len() == 16 && n.iter().all(u8::is_ascii_digit));
        let mut zip = [0u8; 9];
        zip_into(&mut rng, &mut zip);
        assert!(zip[..4].iter().all(u8::is_ascii_digit) && &zip[4..] == b"11111");
        let mut data = a_string(&mut rng, 26, 26);
        put_original(&mut rng, &mut data);
        assert!(data.windows(8).any(|w| w == ORIGINAL));
        assert_eq!(data.len(), 26);
    }

    #[test]
    fn permutations_and_choices_are_exact() {
        let mut rng = stream(11, 12);
        let mut p = permutation(&mut rng, 3000);
        assert_ne!(p[..10], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        p.sort_unstable();
        assert_eq!(p, (1..=3000).collect::<Vec<_>>());
        let chosen = choose(&mut rng, 1000, 100);
        assert_eq!(chosen.len(), 1001);
        assert!(!chosen[0]);
        assert_eq!(chosen.iter().filter(|&&c| c).count(), 100);
    }
}
