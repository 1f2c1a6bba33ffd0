//! Positions of YAML nodes by field path.
//!
//! serde_yaml gives typed values but no node spans, so every document is also read with
//! `yaml-rust2`'s event parser. The index maps a field path (`spec.tools[0].ref`) to the line and
//! column of its key and of its value. It also reports what only the event stream shows:
//! duplicate keys, extra documents and aliases (refused: see `yaml_input`).

use std::collections::{HashMap, HashSet};

use yaml_rust2::Event;
use yaml_rust2::parser::Parser;
use yaml_rust2::scanner::{Marker, TScalarStyle};

use crate::yaml_input::{alias_at, alias_message};

/// A 1-based position in a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark {
    pub(crate) line: usize,
    pub(crate) column: usize,
}

impl Mark {
    const START: Mark = Mark { line: 1, column: 1 };

    fn from_marker(m: Marker) -> Self {
        Self {
            line: m.line().max(1),
            column: m.col() + 1,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct NodePos {
    key: Option<Mark>,
    value: Mark,
    /// A collection, or an empty plain scalar (`key:` with nothing after it, whose own position
    /// is the next token): located by its key.
    by_key: bool,
}

/// A problem only the event stream shows.
#[derive(Debug, Clone)]
pub(crate) struct Issue {
    pub(crate) mark: Mark,
    pub(crate) path: String,
    pub(crate) message: String,
}

/// A YAML syntax error.
#[derive(Debug, Clone)]
pub(crate) struct SyntaxError {
    pub(crate) mark: Mark,
    pub(crate) message: String,
}

/// Field path → position index of one YAML document.
#[derive(Debug, Default)]
pub(crate) struct PosIndex {
    nodes: HashMap<String, NodePos>,
}

enum Frame {
    Map {
        path: String,
        pending_key: Option<(String, Mark)>,
        seen: HashSet<String>,
        first: bool,
    },
    Seq {
        path: String,
        index: usize,
        first: bool,
    },
    /// A complex (non-scalar) mapping key being skipped.
    SkipKey { depth: usize },
}

/// Joins a map key onto a path.
pub(crate) fn child_key(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

/// Joins a sequence index onto a path.
pub(crate) fn child_index(parent: &str, index: usize) -> String {
    format!("{parent}[{index}]")
}

impl PosIndex {
    /// Reads `src`, returning the index and the structural issues (duplicate keys, extra
    /// documents, the first alias, after which nothing is read), or the first syntax error.
    pub(crate) fn parse(src: &str) -> Result<(Self, Vec<Issue>), SyntaxError> {
        let mut index = PosIndex::default();
        let mut issues = Vec::new();
        let mut parser = Parser::new_from_str(src);
        let mut stack: Vec<Frame> = Vec::new();
        let mut documents = 0usize;
        loop {
            let (event, marker) = parser.next_token().map_err(|e| SyntaxError {
                mark: Mark::from_marker(*e.marker()),
                message: e.info().to_owned(),
            })?;
            let mark = Mark::from_marker(marker);
            match event {
                Event::StreamEnd => break,
                Event::StreamStart | Event::DocumentEnd | Event::Nothing => {}
                Event::DocumentStart => {
                    documents += 1;
                    if documents == 2 {
                        issues.push(Issue {
                            mark,
                            path: String::new(),
                            message: "a manifest file must hold exactly one YAML document"
                                .to_owned(),
                        });
                    }
                }
                Event::MappingEnd | Event::SequenceEnd => {
                    if let Some(Frame::SkipKey { depth }) = stack.last_mut() {
                        *depth -= 1;
                        if *depth == 0 {
                            stack.pop();
                            if let Some(Frame::Map { pending_key, .. }) = stack.last_mut() {
                                *pending_key = Some(("<complex key>".to_owned(), mark));
                            }
                        }
                        continue;
                    }
                    stack.pop();
                }
                Event::Alias(_) => {
                    // Refused before serde_yaml expands it (see `yaml_input`); the first one is
                    // enough, and nothing after it is read.
                    issues.push(Issue {
                        mark,
                        path: next_path(&stack),
                        message: alias_message(&alias_at(src, marker)),
                    });
                    break;
                }
                Event::Scalar(..) | Event::MappingStart(..) | Event::SequenceStart(..) => {
                    if documents > 1 {
                        continue;
                    }
                    index.node(&mut stack, &mut issues, event, mark);
                }
            }
        }
        Ok((index, issues))
    }

    fn node(&mut self, stack: &mut Vec<Frame>, issues: &mut Vec<Issue>, event: Event, mark: Mark) {
        let is_start = matches!(event, Event::MappingStart(..) | Event::SequenceStart(..));
        // Inside a complex key: only track depth.
        if let Some(Frame::SkipKey { depth }) = stack.last_mut() {
            if is_start {
                *depth += 1;
            }
            return;
        }
        // The first child fixes up the position of a block collection (the event parser places
        // block mapping starts after their first key).
        let path = match stack.last_mut() {
            None => String::new(),
            Some(Frame::Map {
                path,
                pending_key,
                seen,
                first,
            }) => {
                let Some((key, key_mark)) = pending_key.take() else {
                    // This node is a key.
                    if *first {
                        *first = false;
                        let p = path.clone();
                        if let Some(n) = self.nodes.get_mut(&p)
                            && n.key.is_none()
                        {
                            n.value = mark;
                        }
                    }
                    match event {
                        Event::Scalar(text, ..) => {
                            if !seen.insert(text.clone()) {
                                issues.push(Issue {
                                    mark,
                                    path: child_key(path, &text),
                                    message: format!("mapping key {text:?} is defined twice"),
                                });
                            }
                            *pending_key = Some((text, mark));
                        }
                        _ if is_start => stack.push(Frame::SkipKey { depth: 1 }),
                        _ => *pending_key = Some(("<alias key>".to_owned(), mark)),
                    }
                    return;
                };
                let child = child_key(path, &key);
                self.record(&child, Some(key_mark), mark, &event);
                child
            }
            Some(Frame::Seq { path, index, first }) => {
                let child = child_index(path, *index);
                *index += 1;
                if *first {
                    *first = false;
                    let p = path.clone();
                    if let Some(n) = self.nodes.get_mut(&p)
                        && n.key.is_none()
                    {
                        n.value = mark;
                    }
                }
                self.record(&child, None, mark, &event);
                child
            }
            Some(Frame::SkipKey { .. }) => return,
        };
        if stack.is_empty() {
            self.record(&path, None, mark, &event);
        }
        match event {
            Event::MappingStart(..) => stack.push(Frame::Map {
                path,
                pending_key: None,
                seen: HashSet::new(),
                first: true,
            }),
            Event::SequenceStart(..) => stack.push(Frame::Seq {
                path,
                index: 0,
                first: true,
            }),
            _ => {}
        }
    }

    fn record(&mut self, path: &str, key: Option<Mark>, value: Mark, event: &Event) {
        let by_key = matches!(event, Event::MappingStart(..) | Event::SequenceStart(..))
            || matches!(event, Event::Scalar(text, TScalarStyle::Plain, ..) if text.is_empty());
        self.nodes
            .entry(path.to_owned())
            .or_insert(NodePos { key, value, by_key });
    }

    /// Where the node at `path` is: its value for scalars, its key for collections and empty
    /// values. A path that does not exist falls back to its nearest existing ancestor's key
    /// (so "is required" points at the parent mapping).
    pub(crate) fn locate(&self, path: &str) -> Mark {
        match self.nodes.get(path) {
            Some(n) if n.by_key => n.key.unwrap_or(n.value),
            Some(n) => n.value,
            None => self.ancestor(path),
        }
    }

    /// Where the key of `path` is (the value's position for sequence items and the root).
    pub(crate) fn locate_key(&self, path: &str) -> Mark {
        match self.nodes.get(path) {
            Some(n) => n.key.unwrap_or(n.value),
            None => self.ancestor(path),
        }
    }

    fn ancestor(&self, path: &str) -> Mark {
        let mut p = path;
        while let Some(parent) = parent_path(p) {
            if let Some(n) = self.nodes.get(parent) {
                return n.key.unwrap_or(n.value);
            }
            p = parent;
        }
        Mark::START
    }
}

/// The field path of the next node in `stack` (for an alias used as a key: the mapping's).
fn next_path(stack: &[Frame]) -> String {
    match stack.last() {
        None => String::new(),
        Some(Frame::Map {
            path, pending_key, ..
        }) => match pending_key {
            Some((key, _)) => child_key(path, key),
            None => path.clone(),
        },
        Some(Frame::Seq { path, index, .. }) => child_index(path, *index),
        Some(Frame::SkipKey { .. }) => stack
            .iter()
            .rev()
            .find_map(|f| match f {
                Frame::Map { path, .. } => Some(path.clone()),
                _ => None,
            })
            .unwrap_or_default(),
    }
}

/// The parent of a path: `a.b[2].c` → `a.b[2]` → `a.b` → `a` → `` → none.
pub(crate) fn parent_path(path: &str) -> Option<&str> {
    if path.is_empty() {
        return None;
    }
    let cut = path.rfind(['.', '[']).unwrap_or(0);
    Some(&path[..cut])
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "\
apiVersion: x
spec:
  tools:
    - ref: a
      as: b
  model:
    provider: \"p\"
  empty:
  list: [1, {k: v}]
";

    fn at(m: Mark) -> (usize, usize) {
        (m.line, m.column)
    }

    #[test]
    fn positions_of_keys_values_and_fallbacks() {
        let (idx, issues) = PosIndex::parse(DOC).unwrap();
        assert!(issues.is_empty());
        assert_eq!(at(idx.locate("apiVersion")), (1, 13));
        assert_eq!(at(idx.locate("spec")), (2, 1));
        assert_eq!(at(idx.locate("spec.tools[0]")), (4, 7));
        assert_eq!(at(idx.locate("spec.tools[0].as")), (5, 11));
        assert_eq!(at(idx.locate_key("spec.tools[0].as")), (5, 7));
        assert_eq!(at(idx.locate("spec.model.provider")), (7, 15));
        assert_eq!(at(idx.locate("spec.empty")), (8, 3));
        assert_eq!(at(idx.locate("spec.list[1].k")), (9, 17));
        assert_eq!(at(idx.locate_key("spec.list[1].k")), (9, 14));
        // Missing: nearest ancestor's key.
        assert_eq!(at(idx.locate("spec.model.name")), (6, 3));
        assert_eq!(at(idx.locate("spec.tools[0].mcp.server")), (4, 7));
        assert_eq!(at(idx.locate("metadata.name")), (1, 1));
    }

    #[test]
    fn duplicate_keys_and_extra_documents_are_issues() {
        let (_, issues) = PosIndex::parse("a: 1\nb:\n  c: 1\n  c: 2\n---\nx: 1\n").unwrap();
        let msgs: Vec<_> = issues
            .iter()
            .map(|i| (i.path.as_str(), at(i.mark)))
            .collect();
        assert_eq!(msgs, vec![("b.c", (4, 3)), ("", (5, 1))]);
    }

    #[test]
    fn syntax_errors_carry_a_position() {
        let err = PosIndex::parse("a: 1\n b: [\n").unwrap_err();
        assert_eq!(at(err.mark), (2, 3));
        assert!(
            err.message.contains("mapping values are not allowed"),
            "{}",
            err.message
        );
    }

    #[test]
    fn parent_paths() {
        assert_eq!(parent_path("a.b[2].c"), Some("a.b[2]"));
        assert_eq!(parent_path("a.b[2]"), Some("a.b"));
        assert_eq!(parent_path("a"), Some(""));
        assert_eq!(parent_path(""), None);
    }
}

/// Where the nodes of one YAML document are, by field path (`webhooks[0].timeout`), for the
/// other YAML inputs (the runtime's webhooks file) to name the line and column of a value they
/// refuse after deserializing it.
#[derive(Debug, Default)]
pub struct YamlPositions(PosIndex);

impl YamlPositions {
    /// Indexes `text`; a document that does not parse has no positions (every lookup answers
    /// 1:1), as serde_yaml reports its syntax error itself.
    #[must_use]
    pub fn index(text: &str) -> Self {
        PosIndex::parse(text).map_or_else(|_| Self::default(), |(index, _)| Self(index))
    }

    /// The 1-based line and column of the value at `path` (for a collection or an empty value,
    /// its key; for a path that does not exist, its nearest existing ancestor's key).
    #[must_use]
    pub fn value(&self, path: &str) -> (usize, usize) {
        if self.0.nodes.is_empty() {
            return (1, 1);
        }
        let mark = self.0.locate(path);
        (mark.line, mark.column)
    }

    /// The 1-based line and column of the key of `path` (for a sequence item, where the item
    /// starts).
    #[must_use]
    pub fn key(&self, path: &str) -> (usize, usize) {
        if self.0.nodes.is_empty() {
            return (1, 1);
        }
        let mark = self.0.locate_key(path);
        (mark.line, mark.column)
    }
}
