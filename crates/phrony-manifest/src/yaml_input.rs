//! The bounds every YAML input of phrony goes through before `serde_yaml` sees it.
//!
//! `serde_yaml` expands aliases while it deserializes, and its own guard (at most 100 alias
//! jumps per event of the document) does not bound the expanded size: one anchor of a thousand
//! items referenced a thousand times is a few kilobytes of text and a million nodes, and a 2 MB
//! file of that shape expanded to gigabytes. So the inputs are checked first, on the event
//! stream of `yaml-rust2` (which reports an alias as one event and never expands it):
//!
//! - a file is at most [`MAX_YAML_BYTES`] (8 MiB) of UTF-8;
//! - **aliases (`*name`) are refused**, with the line and column of the first one. Phrony
//!   documents never need them (none of the reference's fixtures or examples uses one), and the
//!   reference runtime would read a merge key (`<<: *base`) differently from `serde_yaml`, which
//!   does not apply merges, so an alias could also make the two runtimes compile different
//!   snapshots. Anchors alone (`&name`) are harmless and accepted.
//!
//! Manifests (Agent, Tool, Policy, Bundle and YAML prompt files) apply the same rule while their
//! positions are indexed, so the error is a `file:line:column` diagnostic with a field path;
//! [`check_yaml`] and [`read_yaml_file`] are for the other YAML inputs (the runtime's tool
//! allowlist, the mock gate's configuration).

use std::io::Read as _;
use std::path::Path;

use yaml_rust2::Event;
use yaml_rust2::parser::Parser;
use yaml_rust2::scanner::Marker;

/// Largest YAML (or prompt, or schema) file read: 8 MiB.
pub const MAX_YAML_BYTES: u64 = 8 << 20;

/// Why a YAML input was refused before it was deserialized.
#[derive(Debug, thiserror::Error)]
pub enum YamlInputError {
    /// The file cannot be opened or read.
    #[error("cannot read file: {0}")]
    Read(std::io::Error),
    /// The file is larger than [`MAX_YAML_BYTES`].
    #[error("file is larger than {} MiB", MAX_YAML_BYTES >> 20)]
    TooLarge,
    /// The file is not UTF-8.
    #[error("file is not valid UTF-8")]
    NotUtf8,
    /// The text is not YAML.
    #[error("line {line} column {column}: invalid YAML: {message}")]
    Syntax {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// The text uses an alias.
    #[error("line {line} column {column}: {}", alias_message(.alias))]
    Alias {
        /// 1-based line of the alias.
        line: usize,
        /// 1-based column of the alias.
        column: usize,
        /// The alias as written (`*base`).
        alias: String,
    },
}

/// Reads a text file of at most [`MAX_YAML_BYTES`] of UTF-8. The size is checked on the bytes
/// read, not on the file's metadata, so a file that grows while it is read is still refused.
///
/// # Errors
/// [`YamlInputError::Read`], [`YamlInputError::TooLarge`] or [`YamlInputError::NotUtf8`].
pub fn read_text_file(path: &Path) -> Result<String, YamlInputError> {
    let file = std::fs::File::open(path).map_err(YamlInputError::Read)?;
    let mut bytes = Vec::new();
    file.take(MAX_YAML_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(YamlInputError::Read)?;
    if bytes.len() as u64 > MAX_YAML_BYTES {
        return Err(YamlInputError::TooLarge);
    }
    String::from_utf8(bytes).map_err(|_| YamlInputError::NotUtf8)
}

/// Reads a YAML file ([`read_text_file`]) and checks it ([`check_yaml`]).
///
/// # Errors
/// Any [`YamlInputError`].
pub fn read_yaml_file(path: &Path) -> Result<String, YamlInputError> {
    let text = read_text_file(path)?;
    check_yaml(&text)?;
    Ok(text)
}

/// Checks YAML text before it is deserialized: at most [`MAX_YAML_BYTES`], valid YAML, no alias.
/// One pass over the parser's events; nothing is expanded or built.
///
/// # Errors
/// [`YamlInputError::TooLarge`], [`YamlInputError::Syntax`] or [`YamlInputError::Alias`] (the
/// first alias).
pub fn check_yaml(text: &str) -> Result<(), YamlInputError> {
    if text.len() as u64 > MAX_YAML_BYTES {
        return Err(YamlInputError::TooLarge);
    }
    let mut parser = Parser::new_from_str(text);
    loop {
        let (event, marker) = parser.next_token().map_err(|e| YamlInputError::Syntax {
            line: e.marker().line().max(1),
            column: e.marker().col() + 1,
            message: e.info().to_owned(),
        })?;
        match event {
            Event::StreamEnd => return Ok(()),
            Event::Alias(_) => {
                return Err(YamlInputError::Alias {
                    line: marker.line().max(1),
                    column: marker.col() + 1,
                    alias: alias_at(text, marker),
                });
            }
            _ => {}
        }
    }
}

/// The message for a refused alias (shared with the manifest diagnostics).
pub(crate) fn alias_message(alias: &str) -> String {
    format!(
        "YAML aliases are not supported ({alias} refers to an anchor); write the value out in \
         full"
    )
}

/// The alias written at `marker` (`*name`), for messages.
pub(crate) fn alias_at(text: &str, marker: Marker) -> String {
    let alias: String = text
        .chars()
        .skip(marker.index())
        .take_while(|c| !c.is_whitespace() && !matches!(c, ',' | ']' | '}'))
        .take(64)
        .collect();
    if alias.starts_with('*') {
        alias
    } else {
        "an alias".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_are_refused_at_their_position() {
        let err = check_yaml("base: &b {x: 1}\nother: *b\n").unwrap_err();
        assert!(
            matches!(&err, YamlInputError::Alias { line: 2, column: 8, alias } if alias == "*b"),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "line 2 column 8: YAML aliases are not supported (*b refers to an anchor); write the \
             value out in full"
        );
        // In flow collections and as merge keys too.
        assert!(matches!(
            check_yaml("a: &a 1\nb: [1, *a]\n"),
            Err(YamlInputError::Alias {
                line: 2,
                column: 8,
                ..
            })
        ));
        assert!(matches!(
            check_yaml("a: &a {k: 1}\nb:\n  <<: *a\n"),
            Err(YamlInputError::Alias { line: 3, .. })
        ));
    }

    #[test]
    fn anchors_alone_and_plain_documents_pass() {
        assert!(check_yaml("a: &a 1\nb: \"*not an alias\"\nc: x*y\n").is_ok());
        assert!(check_yaml("").is_ok());
    }

    #[test]
    fn syntax_errors_and_size_are_reported() {
        assert!(matches!(
            check_yaml("a: [\n"),
            Err(YamlInputError::Syntax { .. })
        ));
        let big = "#".repeat(usize::try_from(MAX_YAML_BYTES).unwrap() + 1);
        assert!(matches!(check_yaml(&big), Err(YamlInputError::TooLarge)));
    }
}
