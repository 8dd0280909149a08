//! Diagnostics: key paths, spans → line:column, and collecting every error.
//!
//! The document is parsed once into toml's spanned tree ([`DeTable`]), which
//! keeps the byte span of every key and value. Serde errors carry a span; the
//! tree turns it back into a key path. Meaning errors carry a key path; the tree
//! turns it into a span. [`Diagnostics::deserialize`] keeps deserializing a
//! section after an error by removing the offending key and trying again, so
//! one run reports every bad key, not just the first (the approach of vector's
//! and linkerd's config loaders: report everything, then fail).

use std::fmt;
use std::ops::Range;

use serde::de::DeserializeOwned;
use toml::Spanned;
use toml::de::{DeValue, ValueDeserializer};

use super::ConfigError;

/// A node of the parsed document: a value and its byte span.
pub(crate) type Node<'i> = Spanned<DeValue<'i>>;

/// One step of a key path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Seg {
    /// A table key.
    Key(String),
    /// An array index.
    Index(usize),
}

/// A key path such as `queues.email.lease` or `queues.a.executor.args[2]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct KeyPath(pub Vec<Seg>);

impl KeyPath {
    /// A path of plain keys, e.g. `KeyPath::of(&["daemon", "api_listen"])`.
    pub(crate) fn of(keys: &[&str]) -> Self {
        KeyPath(keys.iter().map(|k| Seg::Key((*k).to_owned())).collect())
    }

    /// This path extended by `keys`.
    pub(crate) fn join(&self, keys: &[&str]) -> Self {
        let mut segs = self.0.clone();
        segs.extend(keys.iter().map(|k| Seg::Key((*k).to_owned())));
        KeyPath(segs)
    }

    fn starts_with(&self, prefix: &KeyPath) -> bool {
        self.0.starts_with(&prefix.0)
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Index(n) => write!(f, "[{n}]")?,
                Seg::Key(k) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    let bare = !k.is_empty()
                        && k.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
                    if bare {
                        f.write_str(k)?
                    } else {
                        write!(f, "{k:?}")?
                    }
                }
            }
        }
        Ok(())
    }
}

/// 1-based line and column (in characters) of byte `offset` in `text`.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = before.matches('\n').count() + 1;
    (line, before[line_start..].chars().count() + 1)
}

fn contains(outer: &Range<usize>, inner: &Range<usize>) -> bool {
    outer.start <= inner.start && inner.end <= outer.end
}

/// The path of the deepest key or array element whose key or value contains `span`.
fn path_at(node: &Node<'_>, span: &Range<usize>) -> KeyPath {
    let mut path = Vec::new();
    let mut current = node;
    loop {
        let next = match current.get_ref() {
            DeValue::Table(table) => table
                .iter()
                .find(|(k, v)| contains(&k.span(), span) || contains(&v.span(), span))
                .map(|(k, v)| (Seg::Key(k.get_ref().to_string()), v)),
            DeValue::Array(array) => array
                .iter()
                .enumerate()
                .find(|(_, v)| contains(&v.span(), span))
                .map(|(i, v)| (Seg::Index(i), v)),
            _ => None,
        };
        match next {
            Some((seg, child)) => {
                path.push(seg);
                current = child;
            }
            None => return KeyPath(path),
        }
    }
}

/// The span of the value at `path`, or of its deepest existing ancestor below
/// the root (a missing key is reported where its table is).
fn locate(root: &Node<'_>, path: &KeyPath) -> Option<Range<usize>> {
    let mut current = root;
    let mut found = None;
    for seg in &path.0 {
        let next = match (seg, current.get_ref()) {
            (Seg::Key(k), DeValue::Table(table)) => table.get(k.as_str()),
            (Seg::Index(i), DeValue::Array(array)) => array.get(*i),
            _ => None,
        };
        let Some(child) = next else { break };
        found = Some(child.span());
        current = child;
    }
    found
}

/// Removes the key at `keys` (plain keys only) below `node`; false if absent.
fn remove(node: &mut Node<'_>, keys: &[Seg]) -> bool {
    let DeValue::Table(table) = node.get_mut() else {
        return false;
    };
    match keys {
        [Seg::Key(k)] => table.remove(k.as_str()).is_some(),
        [Seg::Key(k), rest @ ..] => table
            .get_mut(k.as_str())
            .is_some_and(|child| remove(child, rest)),
        _ => false,
    }
}

/// One line per problem: toml's messages may span lines.
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// Every syntax error of a document, with line and column (no key path: the
/// tree around a syntax error cannot be trusted).
pub(crate) fn syntax_errors(text: &str, errors: &[toml::de::Error]) -> Vec<ConfigError> {
    errors
        .iter()
        .map(|e| {
            let at = e.span().map(|s| line_col(text, s.start));
            ConfigError {
                path: String::new(),
                line: at.map(|(l, _)| l),
                column: at.map(|(_, c)| c),
                message: one_line(e.message()),
            }
        })
        .collect()
}

/// Collects every problem of one document, each with its key path and, where
/// the document has the key, its line and column.
pub(crate) struct Diagnostics<'a> {
    text: &'a str,
    root: &'a Node<'a>,
    errors: Vec<ConfigError>,
    /// Keys that failed to deserialize: checks that read them are skipped, so one
    /// bad value does not also raise errors about values it was compared with.
    broken: Vec<KeyPath>,
}

impl<'a> Diagnostics<'a> {
    /// Diagnostics for `text`, parsed into `root`.
    pub(crate) fn new(text: &'a str, root: &'a Node<'a>) -> Self {
        Diagnostics {
            text,
            root,
            errors: Vec::new(),
            broken: Vec::new(),
        }
    }

    /// The document tree (to walk its sections).
    pub(crate) fn root(&self) -> &'a Node<'a> {
        self.root
    }

    /// Records a problem at `path`, located through the document tree.
    pub(crate) fn error(&mut self, path: &KeyPath, message: impl Into<String>) {
        let span = locate(self.root, path);
        self.push(path, span, message.into());
    }

    /// Records that the value at `path` is unusable, so checks that read it
    /// (or anything under it) are skipped.
    pub(crate) fn invalid(&mut self, path: &KeyPath, message: impl Into<String>) {
        self.error(path, message);
        self.broken.push(path.clone());
    }

    /// Records a problem at `path` whose source span is known.
    pub(crate) fn error_at(&mut self, path: &KeyPath, span: Range<usize>, message: &str) {
        self.push(path, Some(span), one_line(message));
    }

    fn push(&mut self, path: &KeyPath, span: Option<Range<usize>>, message: String) {
        let at = span.map(|s| line_col(self.text, s.start));
        let error = ConfigError {
            path: path.to_string(),
            line: at.map(|(l, _)| l),
            column: at.map(|(_, c)| c),
            message,
        };
        if !self.errors.contains(&error) {
            self.errors.push(error);
        }
    }

    /// Whether `path` is, or lies under, a key that failed to deserialize.
    pub(crate) fn is_broken(&self, path: &KeyPath) -> bool {
        self.broken.iter().any(|b| path.starts_with(b))
    }

    /// Whether `path`, a key above it or a key below it is unusable: a check of the
    /// whole section at `path` would report a problem already reported.
    pub(crate) fn touches_broken(&self, path: &KeyPath) -> bool {
        self.broken
            .iter()
            .any(|b| path.starts_with(b) || b.starts_with(path))
    }

    /// Deserializes `node` (found at `base`) into `T`. On an error it records it,
    /// removes the offending key and tries again, so every bad key is reported.
    /// `None` if the section as a whole is unusable (wrong type, missing field).
    pub(crate) fn deserialize<T: DeserializeOwned>(
        &mut self,
        node: &Node<'a>,
        base: &KeyPath,
    ) -> Option<T> {
        let mut node = node.clone();
        let mut removed: Vec<KeyPath> = Vec::new();
        loop {
            let error = match T::deserialize(ValueDeserializer::from(node.clone())) {
                Ok(value) => return Some(value),
                Err(error) => error,
            };
            let relative = error
                .span()
                .map(|span| path_at(&node, &span))
                .unwrap_or_default();
            // An error about an ancestor of a removed key is caused by the removal.
            if removed.iter().any(|r| r.starts_with(&relative)) {
                self.broken.push(base.clone());
                return None;
            }
            let absolute = KeyPath([base.0.clone(), relative.0.clone()].concat());
            match error.span() {
                Some(span) => self.error_at(&absolute, span, error.message()),
                None => self.push(&absolute, None, one_line(error.message())),
            }
            let keys: Vec<Seg> = relative
                .0
                .iter()
                .take_while(|s| matches!(s, Seg::Key(_)))
                .cloned()
                .collect();
            if keys.is_empty() || !remove(&mut node, &keys) {
                self.broken.push(base.clone());
                return None;
            }
            let keys = KeyPath(keys);
            self.broken
                .push(KeyPath([base.0.clone(), keys.0.clone()].concat()));
            removed.push(keys);
        }
    }

    /// The problems found, in the order found.
    pub(crate) fn into_errors(self) -> Vec<ConfigError> {
        self.errors
    }
}
