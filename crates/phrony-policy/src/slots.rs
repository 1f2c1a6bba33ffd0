//! Per-decision path slots: every distinct JSON path prefix the set's conditions read is looked
//! up at most once per decision (see the module docs of `set.rs`).
//!
//! At compile time the set interns the *plain prefix* of every condition's path (its leading key
//! and index steps, up to the first `[any]` or `[all]`) under its root (arguments, session
//! metadata or principal claims) and gives each distinct one a slot number. A decision gets one
//! [`Slot`] per number, unresolved until the first condition on that prefix looks it up; every
//! later condition on the same prefix reuses the value found (or its absence) and walks only the
//! steps after the prefix. The slots live on the stack for sets with at most [`MAX_STACK_SLOTS`]
//! distinct prefixes, so evaluation still does not allocate.

use std::cell::Cell;
use std::collections::HashMap;

use regex::RegexSet;
use serde_json::Value;

use crate::path::Seg;
use crate::request::Request;
use crate::value::Actual;

/// Where a cached path starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Root {
    /// The tool arguments.
    Args,
    /// `phrony.session.metadata`.
    SessionMetadata,
    /// `phrony.principal`.
    Principal,
}

impl Root {
    fn value<'a>(self, req: &Request<'a>) -> Option<&'a Value> {
        match self {
            Root::Args => Some(req.args),
            Root::SessionMetadata => req.session.and_then(|s| s.metadata),
            Root::Principal => req.principal,
        }
    }
}

/// A condition leaf's slot: the slot number of its path's plain prefix, and the prefix length in
/// steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlotRef {
    pub(crate) index: u32,
    pub(crate) plain: u32,
}

/// A slot's key id before it was computed (see `gate.rs`).
pub(crate) const KEY_UNKNOWN: u32 = u32::MAX;

/// One slot during one decision.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) enum Slot<'a> {
    /// Not looked up yet.
    #[default]
    Unresolved,
    /// The prefix is missing (or crosses a value of the wrong kind).
    Missing,
    /// The value at the prefix, its key id in the slot's gate key table ([`KEY_UNKNOWN`] until
    /// a gate asks), and whether some `matches` pattern on the slot matches it.
    Found(&'a Value, u32, RegexHit),
}

/// Whether some `matches` pattern on a slot matches its value (see [`RegexFilters`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RegexHit {
    /// Not asked yet.
    Unknown,
    /// None does: every `matches` leaf on the slot is false.
    No,
    /// Some does: each leaf tests its own pattern.
    Yes,
}

/// Per slot, every `matches` pattern that tests the slot's value itself (no steps after the
/// prefix), as one [`RegexSet`]: one search per decision tells whether any of them can match,
/// and when none can (the common case) each `matches` leaf on the slot is false without running
/// its own regex. `None` for slots without patterns (or if the set does not compile within the
/// regex crate's size limits: the leaves then run their own patterns).
#[derive(Debug, Clone, Default)]
pub(crate) struct RegexFilters {
    by_slot: Vec<Option<RegexSet>>,
}

impl RegexFilters {
    /// Builds the filters from `(slot, pattern)` pairs.
    pub(crate) fn new<'p>(
        slots: usize,
        patterns: impl IntoIterator<Item = (u32, &'p str)>,
    ) -> Self {
        let mut by_slot: Vec<Vec<&str>> = vec![Vec::new(); slots];
        for (slot, pattern) in patterns {
            if let Some(list) = usize::try_from(slot).ok().and_then(|s| by_slot.get_mut(s)) {
                list.push(pattern);
            }
        }
        Self {
            by_slot: by_slot
                .into_iter()
                .map(|list| {
                    (!list.is_empty())
                        .then(|| RegexSet::new(list).ok())
                        .flatten()
                })
                .collect(),
        }
    }

    /// The filters, by slot.
    pub(crate) fn as_slice(&self) -> &[Option<RegexSet>] {
        &self.by_slot
    }
}

/// Whether a `matches` leaf on slot `index`, whose value is `value`, can hold: `false` only when
/// the slot's filter says no pattern matches `value` (asked once per decision).
pub(crate) fn regex_may_match(
    filters: &[Option<RegexSet>],
    slots: Slots<'_, '_>,
    index: u32,
    value: &Value,
) -> bool {
    let Ok(index) = usize::try_from(index) else {
        return true;
    };
    let (Some(Some(set)), Some(cell)) = (filters.get(index), slots.get(index)) else {
        return true;
    };
    let Slot::Found(found, key, hit) = cell.get() else {
        return true;
    };
    match hit {
        RegexHit::Yes => true,
        RegexHit::No => false,
        RegexHit::Unknown => {
            // The same text `Op::Matches` searches.
            let any = Actual::Json(value).with_any_text(|t| set.is_match(t));
            let hit = if any { RegexHit::Yes } else { RegexHit::No };
            cell.set(Slot::Found(found, key, hit));
            any
        }
    }
}

/// The slots of one decision.
pub(crate) type Slots<'c, 'a> = &'c [Cell<Slot<'a>>];

/// The number of leading key and index steps of `segs`.
pub(crate) fn plain_len(segs: &[Seg]) -> usize {
    segs.iter()
        .take_while(|s| matches!(s, Seg::Key(_) | Seg::Index(_)))
        .count()
}

/// Follows key and index steps from `v`; `None` when one is missing or crosses a value of the
/// wrong kind (as [`walk`](crate::path::walk) would report it). Stops at `[any]`/`[all]`, which
/// slots never contain.
fn lookup<'v>(segs: &[Seg], v: &'v Value) -> Option<&'v Value> {
    segs.iter().try_fold(v, |v, seg| match seg {
        Seg::Key(k) => v.as_object()?.get(k),
        Seg::Index(i) => v.as_array()?.get(*i),
        Seg::Any | Seg::All => None,
    })
}

/// The value at `prefix` under `root`, looked up on first use and cached in `cell`.
#[inline]
pub(crate) fn resolve<'a>(
    cell: &Cell<Slot<'a>>,
    root: Root,
    prefix: &[Seg],
    req: &Request<'a>,
) -> Option<&'a Value> {
    match cell.get() {
        Slot::Found(v, _, _) => Some(v),
        Slot::Missing => None,
        Slot::Unresolved => {
            let found = root.value(req).and_then(|v| lookup(prefix, v));
            cell.set(found.map_or(Slot::Missing, |v| {
                Slot::Found(v, KEY_UNKNOWN, RegexHit::Unknown)
            }));
            found
        }
    }
}

/// The distinct plain prefixes of a set, by slot number. Built at compile time.
#[derive(Debug, Clone, Default)]
pub(crate) struct PathTable {
    paths: Vec<(Root, Box<[Seg]>)>,
    numbers: HashMap<(Root, Box<[Seg]>), u32>,
}

impl PathTable {
    /// The slot number of `prefix` under `root`, allocating one on first sight. `None` past
    /// `u32::MAX` slots (the leaf then reads its path uncached).
    pub(crate) fn intern(&mut self, root: Root, prefix: &[Seg]) -> Option<u32> {
        let key = (root, Box::<[Seg]>::from(prefix));
        if let Some(n) = self.numbers.get(&key) {
            return Some(*n);
        }
        let n = u32::try_from(self.paths.len())
            .ok()
            .filter(|n| *n < KEY_UNKNOWN)?;
        self.paths.push(key.clone());
        self.numbers.insert(key, n);
        Some(n)
    }

    /// The number of slots a decision needs.
    pub(crate) fn len(&self) -> usize {
        self.paths.len()
    }

    /// The root and prefix of slot `index`.
    pub(crate) fn get(&self, index: u32) -> Option<(Root, &[Seg])> {
        let (root, prefix) = self.paths.get(usize::try_from(index).ok()?)?;
        Some((*root, prefix))
    }
}

/// Sets with at most this many distinct path prefixes keep a decision's slots on the stack.
pub(crate) const MAX_STACK_SLOTS: usize = 128;

/// Runs `f` with `n` fresh slots: on the stack up to [`MAX_STACK_SLOTS`] (in arrays of 8, 32 or
/// 128, so a small set clears little), on the heap above.
#[inline]
pub(crate) fn with_slots<'a, R>(n: usize, f: impl FnOnce(Slots<'_, 'a>) -> R) -> R {
    fn fresh<'a, const N: usize>() -> [Cell<Slot<'a>>; N] {
        [const { Cell::new(Slot::Unresolved) }; N]
    }
    if n == 0 {
        f(&[])
    } else if n <= 8 {
        f(&fresh::<8>()[..n])
    } else if n <= 32 {
        f(&fresh::<32>()[..n])
    } else if n <= MAX_STACK_SLOTS {
        f(&fresh::<MAX_STACK_SLOTS>()[..n])
    } else {
        f(&vec![Cell::new(Slot::Unresolved); n])
    }
}
