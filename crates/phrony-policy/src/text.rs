//! Allocation-free text helpers: case-insensitive comparisons and a stack buffer for formatting.
//!
//! Case folding is per character (`char::to_lowercase`), applied the same way to the expected value
//! (once, at compile time) and to the actual value (lazily, at evaluation time), so no rule such as
//! the final-sigma special case of `str::to_lowercase` can make the two sides disagree.

use std::fmt;

/// Trims and lowercases `s` the way the engine compares strings (used at compile time).
pub(crate) fn fold(s: &str) -> String {
    folded(s.trim()).collect()
}

fn folded(s: &str) -> impl Iterator<Item = char> + Clone + '_ {
    s.chars().flat_map(char::to_lowercase)
}

/// The trimmed `actual` when it is ASCII: its case fold is then its ASCII lowercase, so the
/// comparisons below can work on bytes. (Only the actual side must be ASCII: a non-ASCII expected
/// value simply never equals an ASCII byte.)
fn ascii(actual: &str) -> Option<&[u8]> {
    let t = actual.trim();
    t.is_ascii().then_some(t.as_bytes())
}

fn lower(bytes: &[u8]) -> impl DoubleEndedIterator<Item = u8> + Clone + '_ {
    bytes.iter().map(u8::to_ascii_lowercase)
}

/// `actual` (trimmed, case-folded) equals the already folded `expected`.
pub(crate) fn eq_folded(actual: &str, expected: &str) -> bool {
    match ascii(actual) {
        Some(a) => a.len() == expected.len() && lower(a).eq(expected.bytes()),
        None => folded(actual.trim()).eq(expected.chars()),
    }
}

/// `actual` (trimmed, case-folded) starts with the already folded `needle`.
pub(crate) fn starts_with_folded(actual: &str, needle: &str) -> bool {
    if let Some(a) = ascii(actual) {
        return a.len() >= needle.len() && lower(a).zip(needle.bytes()).all(|(x, n)| x == n);
    }
    let mut it = folded(actual.trim());
    needle.chars().all(|n| it.next() == Some(n))
}

/// `actual` (trimmed, case-folded) ends with the already folded `needle`.
pub(crate) fn ends_with_folded(actual: &str, needle: &str) -> bool {
    if let Some(a) = ascii(actual) {
        return a.len() >= needle.len()
            && lower(a)
                .rev()
                .zip(needle.bytes().rev())
                .all(|(x, n)| x == n);
    }
    let mut it = actual
        .trim()
        .chars()
        .rev()
        .flat_map(|c| c.to_lowercase().rev());
    needle.chars().rev().all(|n| it.next() == Some(n))
}

/// `actual` (trimmed, case-folded) contains the already folded `needle`.
pub(crate) fn contains_folded(actual: &str, needle: &str) -> bool {
    if let Some(a) = ascii(actual) {
        let n = needle.as_bytes();
        return n.is_empty()
            || a.windows(n.len())
                .any(|w| lower(w).zip(n.iter()).all(|(x, y)| x == *y));
    }
    let mut it = folded(actual.trim());
    loop {
        let mut probe = it.clone();
        if needle.chars().all(|n| probe.next() == Some(n)) {
            return true;
        }
        if it.next().is_none() {
            return false;
        }
    }
}

/// Parses a number the way the condition language does: trimmed, finite floats only.
pub(crate) fn parse_number(s: &str) -> Option<f64> {
    let t = s.trim();
    if t.is_empty() {
        return None;
    }
    t.parse::<f64>().ok().filter(|f| f.is_finite())
}

/// A string buffer on the stack that moves to the heap only when it outgrows its capacity.
pub(crate) struct StackStr {
    buf: [u8; Self::CAPACITY],
    len: usize,
    heap: Option<String>,
}

impl StackStr {
    const CAPACITY: usize = 192;

    pub(crate) fn new() -> Self {
        Self {
            buf: [0; Self::CAPACITY],
            len: 0,
            heap: None,
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        match &self.heap {
            Some(s) => s,
            // Only whole `&str`s are ever copied in, so the bytes are valid UTF-8.
            None => std::str::from_utf8(&self.buf[..self.len]).unwrap_or_default(),
        }
    }
}

impl fmt::Write for StackStr {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if let Some(heap) = &mut self.heap {
            heap.push_str(s);
        } else if let Some(dst) = self.buf.get_mut(self.len..self.len + s.len()) {
            dst.copy_from_slice(s.as_bytes());
            self.len += s.len();
        } else {
            let mut heap = String::with_capacity(self.len + s.len());
            heap.push_str(self.as_str());
            heap.push_str(s);
            self.heap = Some(heap);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;

    use super::*;

    #[test]
    fn folded_comparisons() {
        assert!(eq_folded("  EUR ", "eur"));
        assert!(!eq_folded("EURO", "eur"));
        assert!(eq_folded("ÄRGER", &fold("ärger")));
        // Final sigma: per-char folding keeps both sides identical.
        assert!(eq_folded("ΟΔΟΣ", &fold("οδοσ")));
        assert!(starts_with_folded(" Admin-Team", "admin"));
        assert!(!starts_with_folded("adm", "admin"));
        assert!(ends_with_folded("report.PDF ", ".pdf"));
        assert!(!ends_with_folded("pdf", ".pdf"));
        assert!(contains_folded("Please REFUND now", "refund"));
        assert!(contains_folded("aaab", "aab"));
        assert!(!contains_folded("refun", "refund"));
        assert!(contains_folded("x", ""));
    }

    /// The Unicode definitions the ASCII fast paths must agree with.
    fn reference(actual: &str, expected: &str) -> [bool; 4] {
        let all: Vec<char> = folded(actual.trim()).collect();
        let want: Vec<char> = expected.chars().collect();
        [
            all == want,
            all.starts_with(&want),
            all.ends_with(&want),
            want.is_empty() || all.windows(want.len()).any(|w| w == want.as_slice()),
        ]
    }

    #[test]
    fn ascii_fast_paths_keep_unicode_folding() {
        let actuals = [
            "  EUR ",
            "eur",
            "Kelvin",
            "\u{212A}elvin",
            "ÄRGER",
            "ärger",
            "ΟΔΟΣ",
            "İstanbul",
            "istanbul",
            "\u{b}tab\u{b}",
            "",
            "report.PDF",
        ];
        let expected = [
            fold("eur"),
            fold("\u{212A}"),
            fold("kelvin"),
            fold("\u{212A}elvin"),
            fold("ärger"),
            fold("ÄR"),
            fold("οδοσ"),
            fold("İstanbul"),
            fold("istanbul"),
            fold("tab"),
            fold(".pdf"),
            String::new(),
        ];
        for a in actuals {
            for e in &expected {
                let got = [
                    eq_folded(a, e),
                    starts_with_folded(a, e),
                    ends_with_folded(a, e),
                    contains_folded(a, e),
                ];
                assert_eq!(got, reference(a, e), "{a:?} against {e:?}");
            }
        }
        // The Kelvin sign folds to an ASCII `k`, so an ASCII value equals it.
        assert!(eq_folded("kelvin", &fold("\u{212A}ELVIN")));
        assert!(eq_folded("\u{212A}ELVIN", "kelvin"));
        // `İ` folds to `i` plus a combining dot: not plain `i`.
        assert!(!eq_folded("İstanbul", "istanbul"));
        assert!(starts_with_folded("İstanbul", "i"));
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_number(" 250 "), Some(250.0));
        assert_eq!(parse_number("1e3"), Some(1000.0));
        assert_eq!(parse_number("-0.5"), Some(-0.5));
        assert_eq!(parse_number("NaN"), None);
        assert_eq!(parse_number("inf"), None);
        assert_eq!(parse_number(""), None);
        assert_eq!(parse_number("12abc"), None);
    }

    #[test]
    fn stack_str_spills_to_heap() {
        let mut s = StackStr::new();
        write!(s, "{}", 250.5).unwrap();
        assert_eq!(s.as_str(), "250.5");
        let long = "x".repeat(300);
        s.write_str(&long).unwrap();
        assert_eq!(s.as_str().len(), 305);
        assert!(s.as_str().starts_with("250.5x"));
    }
}
