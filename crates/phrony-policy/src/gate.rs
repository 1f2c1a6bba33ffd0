//! Equality gates: policies whose conditions require a path to equal one of a few values are
//! skipped without evaluating them when the call's value is none of those.
//!
//! A policy's *gate* is an `eq` or `in` leaf on a path without `[any]`/`[all]` steps, reached
//! from the root of its conditions through `all` nodes only (`Cond::gate`): the conditions cannot
//! hold unless that leaf does. At compile time every gate value is reduced to the canonical key of
//! the condition language's equality ([`Scalar::matches`]): null, a number (`250`, `"250.0"`,
//! `2.5e2` are one key) or a trimmed, case-folded text. The keys of each path slot go into one
//! table, sorted by hash, and each gated policy keeps the ids of its keys. At evaluation the
//! slot's value is looked up in its table once per decision (the id is cached in the slot beside
//! the value), and a gated policy is visited only when that id is one of its own: one integer
//! comparison instead of a condition tree. Policies keep their positions, so the order-dependent
//! rules (first deny, approval tie-breaks, first failure route) are untouched; the property test
//! `indexed_evaluation_equals_the_linear_scan` (src/tests.rs) checks the gates against the linear
//! scan.

use std::cmp::Ordering;

use serde_json::Value;

use crate::policy::Policy;
use crate::request::Request;
use crate::slots::{self, KEY_UNKNOWN, PathTable, RegexHit, Slot, Slots};
use crate::text::eq_folded;
use crate::value::{Actual, Scalar};

/// The key id of a value that equals no gate value of its slot.
const KEY_NONE: u32 = u32::MAX - 1;

/// A canonical equality key.
#[derive(Debug, Clone, PartialEq)]
enum Key {
    Null,
    /// A finite number, `-0.0` read as `0.0`.
    Num(f64),
    /// Trimmed and case-folded.
    Text(Box<str>),
}

impl Key {
    fn of(scalar: &Scalar) -> Self {
        match (scalar.text(), scalar.num()) {
            (None, _) => Key::Null,
            (Some(_), Some(n)) => Key::Num(zero(n)),
            (Some(text), None) => Key::Text(text.into()),
        }
    }

    fn hash(&self) -> u64 {
        match self {
            Key::Null => NULL_HASH,
            Key::Num(n) => num_hash(*n),
            Key::Text(t) => text_hash(t.chars()),
        }
    }

    fn rank(&self) -> u8 {
        match self {
            Key::Null => 0,
            Key::Num(_) => 1,
            Key::Text(_) => 2,
        }
    }

    /// A total order, so equal keys end up side by side for deduplication.
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (Key::Num(a), Key::Num(b)) => a.total_cmp(b),
            (Key::Text(a), Key::Text(b)) => a.cmp(b),
            _ => self.rank().cmp(&other.rank()),
        }
    }
}

fn zero(n: f64) -> f64 {
    if n == 0.0 { 0.0 } else { n }
}

const SEED: u64 = 0x9e37_79b9_7f4a_7c15;
const NULL_HASH: u64 = 0x2545_f491_4f6c_dd1d;

fn mix(h: u64, word: u64) -> u64 {
    (h.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95)
}

fn num_hash(n: f64) -> u64 {
    mix(mix(SEED, 1), n.to_bits())
}

fn text_hash(folded: impl Iterator<Item = char>) -> u64 {
    folded.fold(mix(SEED, 2), |h, c| mix(h, u64::from(c)))
}

/// The hash of `actual`'s trimmed, case-folded form, without building it.
fn actual_text_hash(actual: &str) -> u64 {
    let t = actual.trim();
    if t.is_ascii() {
        text_hash(t.bytes().map(|b| char::from(b.to_ascii_lowercase())))
    } else {
        text_hash(t.chars().flat_map(char::to_lowercase))
    }
}

/// The distinct gate keys of one slot, sorted by hash; a key's id is its position.
#[derive(Debug, Clone, Default)]
struct KeyTable {
    entries: Vec<(u64, Key)>,
}

impl KeyTable {
    fn position(&self, hash: u64, mut same: impl FnMut(&Key) -> bool) -> Option<usize> {
        let start = self.entries.partition_point(|(h, _)| *h < hash);
        let candidates = self.entries.get(start..)?;
        candidates
            .iter()
            .take_while(|(h, _)| *h == hash)
            .position(|(_, k)| same(k))
            .map(|i| start + i)
    }

    fn id(&self, hash: u64, same: impl FnMut(&Key) -> bool) -> u32 {
        self.position(hash, same)
            .and_then(|p| u32::try_from(p).ok())
            .filter(|id| *id < KEY_NONE)
            .unwrap_or(KEY_NONE)
    }

    fn id_of_key(&self, key: &Key) -> u32 {
        self.id(key.hash(), |k| k == key)
    }

    /// The id of the key `value` equals, under the same equality as [`Scalar::matches`]:
    /// numbers by value, null only to null, other scalars by folded text, lists and maps never.
    fn id_of_value(&self, value: &Value) -> u32 {
        let actual = Actual::Json(value);
        if let Some(n) = actual.number() {
            let n = zero(n);
            return self.id(num_hash(n), |k| matches!(k, Key::Num(m) if *m == n));
        }
        if actual.is_null() {
            return self.id(NULL_HASH, |k| matches!(k, Key::Null));
        }
        actual
            .with_text(|t| {
                self.id(
                    actual_text_hash(t),
                    |k| matches!(k, Key::Text(s) if eq_folded(t, s)),
                )
            })
            .unwrap_or(KEY_NONE)
    }
}

/// One policy's gate: its slot and the ids of the values it admits.
#[derive(Debug, Clone)]
struct Gate {
    slot: u32,
    keys: Box<[u32]>,
}

/// The gates of a set, by policy position, and the key tables, by slot.
#[derive(Debug, Clone, Default)]
pub(crate) struct Gates {
    by_policy: Vec<Option<Gate>>,
    tables: Vec<KeyTable>,
}

impl Gates {
    pub(crate) fn new(policies: &[Policy], paths: &PathTable) -> Self {
        let mut tables = vec![KeyTable::default(); paths.len()];
        for policy in policies {
            policy.keyed_values(&mut |slot, values| {
                if let Some(table) = usize::try_from(slot).ok().and_then(|s| tables.get_mut(s)) {
                    table.entries.extend(values.iter().map(|v| {
                        let key = Key::of(v);
                        (key.hash(), key)
                    }));
                }
            });
        }
        for table in &mut tables {
            table
                .entries
                .sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
            table.entries.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
        }
        let mut gates = Self {
            by_policy: Vec::with_capacity(policies.len()),
            tables,
        };
        gates.by_policy = policies
            .iter()
            .map(|p| {
                let (slot, values) = p.gate()?;
                let keys = gates.ids(slot, values)?;
                Some(Gate { slot, keys })
            })
            .collect();
        gates
    }

    /// The ids of `values` in slot `slot`'s key table; `None` if one is missing (every value
    /// [`Policy::keyed_values`] reports is in it).
    pub(crate) fn ids(&self, slot: u32, values: &[Scalar]) -> Option<Box<[u32]>> {
        let table = self.tables.get(usize::try_from(slot).ok()?)?;
        values
            .iter()
            .map(|v| Some(table.id_of_key(&Key::of(v))).filter(|id| *id != KEY_NONE))
            .collect()
    }

    /// The key id of the value `value` of the already resolved slot `index` (looked up once per
    /// decision); `None` when the decision has no such slot.
    pub(crate) fn leaf_key(&self, index: u32, slots: Slots<'_, '_>, value: &Value) -> Option<u32> {
        let cell = slots.get(usize::try_from(index).ok()?)?;
        match cell.get() {
            Slot::Found(_, id, _) if id != KEY_UNKNOWN => Some(id),
            Slot::Found(found, _, hit) => {
                let id = self
                    .tables
                    .get(usize::try_from(index).ok()?)
                    .map_or(KEY_NONE, |t| t.id_of_value(value));
                cell.set(Slot::Found(found, id, hit));
                Some(id)
            }
            Slot::Unresolved | Slot::Missing => None,
        }
    }

    /// Whether the policy at `position` can match the call: `false` only when it has a gate and
    /// the value at the gate's path is none of the gate's values.
    #[inline]
    pub(crate) fn open<'a>(
        &self,
        position: usize,
        slots: Slots<'_, 'a>,
        paths: &PathTable,
        req: &Request<'a>,
    ) -> bool {
        match self.by_policy.get(position) {
            Some(Some(gate)) => self.admits(gate, slots, paths, req),
            _ => true,
        }
    }

    /// Whether the value at `gate`'s path is one of its values.
    fn admits<'a>(
        &self,
        gate: &Gate,
        slots: Slots<'_, 'a>,
        paths: &PathTable,
        req: &Request<'a>,
    ) -> bool {
        match self.slot_key(gate.slot, slots, paths, req) {
            // The common case, a value no gate of the slot names, needs no look at the keys.
            Some(KEY_NONE) => false,
            Some(id) => gate.keys.contains(&id),
            // The decision has no slot for it (e.g. the linear oracle): evaluate.
            None => true,
        }
    }

    /// The key id of slot `slot`'s value, looked up once per decision.
    fn slot_key<'a>(
        &self,
        slot: u32,
        slots: Slots<'_, 'a>,
        paths: &PathTable,
        req: &Request<'a>,
    ) -> Option<u32> {
        let index = usize::try_from(slot).ok()?;
        let cell = slots.get(index)?;
        let (root, prefix) = paths.get(slot)?;
        let Some(value) = slots::resolve(cell, root, prefix, req) else {
            // Missing: `eq` and `in` are false.
            return Some(KEY_NONE);
        };
        let hit = match cell.get() {
            Slot::Found(_, id, _) if id != KEY_UNKNOWN => return Some(id),
            Slot::Found(_, _, hit) => hit,
            Slot::Unresolved | Slot::Missing => RegexHit::Unknown,
        };
        let id = self
            .tables
            .get(index)
            .map_or(KEY_NONE, |t| t.id_of_value(value));
        cell.set(Slot::Found(value, id, hit));
        Some(id)
    }
}
