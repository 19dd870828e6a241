//! A question's state in a stored form ([`Evaluator::save`], [`Evaluator::load`]): what a
//! month's rollup keeps on disk (`store::rollups`), so a year is read as twelve states, not
//! counted from 365 days.
//!
//! Contract:
//! - Only a settled state is saved, each row's last visit closed (its engagement added), so
//!   a loaded state merges with others exactly as the state it was saved from.
//! - Rows are saved in the order of their values and name them (never an interned number):
//!   the same state always gives the same sums in the same order, and a loaded state interns
//!   its values in the question it joins. Visitor sets are roaring's portable format.
//! - Loading checks every length against the bytes left, refuses a row named twice, a
//!   dimension count other than the question's and trailing bytes, and reads each visitor
//!   set through roaring's validating reader: bytes not written here are refused, never
//!   read out of bounds.

use jiff::civil::Date;
use roaring::RoaringBitmap;

use super::{Acc, Evaluator, Query, SiteZone};

/// The first bytes of a stored state (and its format's version).
const MAGIC: &[u8; 4] = b"TQS1";

/// Bytes that are not a stored state of the question at hand.
#[derive(Debug, thiserror::Error)]
#[error("stored question state: {0}")]
pub struct StateError(&'static str);

fn put(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn u64(&mut self) -> Result<u64, StateError> {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.0.split_first().ok_or(StateError("truncated number"))?;
            self.0 = rest;
            n |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(n);
            }
        }
        Err(StateError("number too long"))
    }

    fn len(&mut self) -> Result<usize, StateError> {
        let n = usize::try_from(self.u64()?).map_err(|_| StateError("length out of range"))?;
        if n > self.0.len() {
            return Err(StateError("length beyond the bytes left"));
        }
        Ok(n)
    }

    fn bytes(&mut self) -> Result<&'a [u8], StateError> {
        let n = self.len()?;
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn bitmap(&mut self) -> Result<RoaringBitmap, StateError> {
        RoaringBitmap::deserialize_from(self.bytes()?).map_err(|_| StateError("bad visitor set"))
    }
}

/// A row's sums, in stored order.
fn fields(a: &mut Acc) -> [&mut u64; 13] {
    [
        &mut a.events,
        &mut a.pageviews,
        &mut a.visits,
        &mut a.counted_visitors,
        &mut a.whole_visits,
        &mut a.duration_s,
        &mut a.whole_pageviews,
        &mut a.bounce_visits,
        &mut a.bounces,
        &mut a.engaged_ms,
        &mut a.engaged_visits,
        &mut a.scroll_sum,
        &mut a.scroll_visits,
    ]
}

/// A row's sums with its last visit closed ([`Acc::close_visit`] of a copy), in stored order.
fn sums(a: &Acc) -> [u64; 13] {
    let mut closed = Acc {
        visit_engaged_ms: a.visit_engaged_ms,
        visit_scroll: a.visit_scroll,
        ..Acc::default()
    };
    closed.add_sums(a);
    closed.close_visit();
    fields(&mut closed).map(|f| *f)
}

/// Whether two sets hold the same numbers (roaring's own equality tells containers of one
/// set apart when one is a bitset and the other a list).
fn same_set(a: &RoaringBitmap, b: &RoaringBitmap) -> bool {
    a.len() == b.len() && a.is_subset(b)
}

fn put_bitmap(out: &mut Vec<u8>, set: &RoaringBitmap) {
    put(out, set.serialized_size() as u64);
    // Writing into a vector cannot fail.
    let _ = set.serialize_into(&mut *out);
}

impl Evaluator {
    /// This state in its stored form (settled first).
    pub fn save(&mut self) -> Vec<u8> {
        self.settle();
        let mut rows: Vec<(Vec<&str>, &Acc)> = self
            .rows
            .keys
            .iter()
            .zip(&self.rows.accs)
            .map(|(key, acc)| {
                let names = key
                    .iter()
                    .enumerate()
                    .map(|(k, id)| &*self.values[k].names[*id as usize])
                    .collect();
                (names, acc)
            })
            .collect();
        rows.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut out = MAGIC.to_vec();
        put(&mut out, self.slots.len() as u64);
        put(&mut out, rows.len() as u64);
        for (names, acc) in rows {
            for name in names {
                put(&mut out, name.len() as u64);
                out.extend_from_slice(name.as_bytes());
            }
            for n in sums(acc) {
                put(&mut out, n);
            }
            put_bitmap(&mut out, &acc.visitors);
        }
        put_bitmap(&mut out, &self.total);
        put(&mut out, self.extra_total);
        out
    }

    /// The state `bytes` stored of `query` (checked by the caller), as a state of that
    /// question over the local days `from..=to` of a site in `zone`: to
    /// [`Evaluator::merge`] with the states of other days.
    pub fn load(
        query: &Query,
        from: Date,
        to: Date,
        zone: &SiteZone,
        bytes: &[u8],
    ) -> Result<Self, StateError> {
        let mut e = Self::checked(query, from, to, zone);
        let rest = bytes
            .strip_prefix(MAGIC)
            .ok_or(StateError("not a stored state"))?;
        let mut r = Reader(rest);
        if r.u64()? != e.slots.len() as u64 {
            return Err(StateError("another question's dimensions"));
        }
        let rows = r.u64()?;
        let mut key = vec![0u32; e.slots.len()];
        for _ in 0..rows {
            for (k, v) in key.iter_mut().enumerate() {
                let name = std::str::from_utf8(r.bytes()?)
                    .map_err(|_| StateError("a value is not UTF-8"))?;
                *v = e.values[k].id(name);
            }
            let fresh = e.rows.accs.len();
            let at = e.rows.at(&key);
            if at != fresh {
                return Err(StateError("a row named twice"));
            }
            let mut s = [0u64; 13];
            for n in &mut s {
                *n = r.u64()?;
            }
            let acc = &mut e.rows.accs[at];
            for (field, n) in fields(acc).into_iter().zip(s) {
                *field = n;
            }
            acc.visitors = r.bitmap()?;
            acc.held = acc.visitors.len();
        }
        e.total = r.bitmap()?;
        e.extra_total = r.u64()?;
        if !r.0.is_empty() {
            return Err(StateError("bytes after the state"));
        }
        Ok(e)
    }

    /// Whether this state and `other` hold the same rows, sums and visitor sets (whatever
    /// the order they were counted in): `tally verify`'s check of a stored state against a
    /// recount. Both are settled first.
    pub fn same_as(&mut self, other: &mut Evaluator) -> bool {
        self.settle();
        other.settle();
        if self.rows.accs.len() != other.rows.accs.len()
            || !same_set(&self.total, &other.total)
            || self.extra_total != other.extra_total
        {
            return false;
        }
        let width = self.slots.len();
        let mut key = vec![0u32; width];
        for (mine, acc) in self.rows.keys.iter().zip(&self.rows.accs) {
            for (k, id) in mine.iter().enumerate() {
                let name = &self.values[k].names[*id as usize];
                match other.values[k].ids.get(&**name) {
                    Some(id) => key[k] = *id,
                    None => return false,
                }
            }
            let Some(theirs) = other.row_of(&key) else {
                return false;
            };
            if sums(acc) != sums(theirs) || !same_set(&acc.visitors, &theirs.visitors) {
                return false;
            }
        }
        true
    }

    /// The row of `key` (interned values), if there is one.
    fn row_of(&self, key: &[u32]) -> Option<&Acc> {
        let r = match key {
            [] => (!self.rows.accs.is_empty()).then_some(0),
            [v] => self
                .rows
                .dense
                .get(*v as usize)
                .and_then(|r| r.checked_sub(1))
                .map(|r| r as usize),
            _ => self.rows.index.get(key).copied(),
        }?;
        self.rows.accs.get(r)
    }
}
