//! Known sources: the name and category of a referring host or a campaign tag, which
//! [`crate::core::dims::classify_source`] turns into a visit's source and channel.
//!
//! Use: build one [`SourceList::bundled`] per process and pass it to `classify_source` as its
//! [`SourceNames`].
//!
//! Contract:
//! - The data is the project's own (MIT OR Apache-2.0), compiled into the binary:
//!   `server/data/sources/sources.tsv` (`host<TAB>name<TAB>category`) and `aliases.tsv`
//!   (`tag<TAB>name<TAB>category`), with the category one of `search`, `social`, `shopping`,
//!   `video`, `email`, `ai` or empty. `server/data/sources/SOURCES.md` says why no upstream
//!   list is shipped (their licences); `scripts/refresh-sources.sh` checks and sorts the files
//!   and lists an upstream file's hosts for review.
//! - [`SourceList::by_host`] matches the host (lower-cased, without a port or a trailing dot)
//!   and then each parent domain, longest first, while at least two labels remain: listing a
//!   host claims all its subdomains (`l.facebook.com`, `www.google.co.uk`, `old.reddit.com`),
//!   and the most specific listed host wins (`mail.google.com` is Gmail, not Google). A host
//!   that merely shares a suffix is no match (`evilgoogle.com`), nor is a listed name under
//!   another domain (`google.evil.com`). A single label is never looked up, and the list
//!   holds no public suffix (`co.uk`; the tests check), so no match can come from one.
//! - [`SourceList::by_name`] matches names and aliases case-insensitively (`GOOGLE`, `fb`,
//!   `Hacker News`); a tag with a dot that is neither is looked up as a host
//!   (`utm_source=chatgpt.com`, which ChatGPT adds to its links).
//! - Every name has one category, whichever host or tag found it.
//! - Rows that break these rules are refused by [`SourceList::parse`]; [`SourceList::bundled`]
//!   skips them (with a warning) rather than refusing to start, and a unit test keeps the
//!   bundled files free of them.

use std::borrow::Cow;
use std::collections::HashMap;

use crate::core::dims::{Category, SourceNames, clean};

/// The bundled host table.
pub const SOURCES_TSV: &str = include_str!("../../data/sources/sources.tsv");

/// The bundled tag table.
pub const ALIASES_TSV: &str = include_str!("../../data/sources/aliases.tsv");

/// A row the tables may not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}, line {line}: {why}: {text:?}")]
pub struct BadRow {
    /// `sources.tsv` or `aliases.tsv`.
    pub file: &'static str,
    pub line: usize,
    pub why: &'static str,
    pub text: String,
}

/// A known source.
#[derive(Debug)]
struct Source {
    name: Box<str>,
    category: Option<Category>,
}

/// The known sources: hosts and tags to names and categories.
#[derive(Debug, Default)]
pub struct SourceList {
    sources: Vec<Source>,
    /// Listed host → source.
    hosts: HashMap<Box<str>, usize>,
    /// Lower-cased name or alias → source.
    tags: HashMap<Box<str>, usize>,
    /// Rows refused while reading (none in the bundled tables).
    skipped: Vec<BadRow>,
}

/// Whether `host` may be listed: lower-case ASCII letters, digits and `-` in at least two
/// non-empty labels, not starting with `www.` (the subdomain rule covers it).
fn valid_host(host: &str) -> bool {
    host.split('.').count() >= 2
        && !host.starts_with("www.")
        && host.split('.').all(|label| {
            !label.is_empty()
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

/// The three columns of a row, or why not.
fn columns(line: &str) -> Result<(&str, &str, Option<Category>), &'static str> {
    let mut cols = line.split('\t');
    let (Some(key), Some(name), Some(category), None) =
        (cols.next(), cols.next(), cols.next(), cols.next())
    else {
        return Err("not three tab-separated columns");
    };
    if name.is_empty() || clean(name) != name {
        return Err("a name must be non-empty plain text (no control characters, trimmed)");
    }
    let category = match category {
        "" => None,
        other => Some(Category::parse(other).ok_or("unknown category")?),
    };
    Ok((key, name, category))
}

impl SourceList {
    /// The bundled tables. A row they should not hold is skipped and logged (the tests keep
    /// them clean).
    pub fn bundled() -> Self {
        let list = Self::read(SOURCES_TSV, ALIASES_TSV);
        if !list.skipped.is_empty() {
            tracing::warn!(skipped = ?list.skipped, "source table rows skipped");
        }
        list
    }

    /// Both tables, refusing any row that breaks the rules (the first one is the error).
    pub fn parse(sources_tsv: &str, aliases_tsv: &str) -> Result<Self, BadRow> {
        let mut list = Self::read(sources_tsv, aliases_tsv);
        if list.skipped.is_empty() {
            Ok(list)
        } else {
            Err(list.skipped.swap_remove(0))
        }
    }

    /// Both tables, skipping bad rows into `skipped`.
    fn read(sources_tsv: &str, aliases_tsv: &str) -> Self {
        let mut list = SourceList::default();
        for (file, text) in [("sources.tsv", sources_tsv), ("aliases.tsv", aliases_tsv)] {
            for (i, line) in text.lines().enumerate() {
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let row = columns(line).and_then(|(key, name, category)| {
                    if file == "sources.tsv" {
                        list.add_host(key, name, category)
                    } else {
                        list.add_alias(key, name, category)
                    }
                });
                if let Err(why) = row {
                    list.skipped.push(BadRow {
                        file,
                        line: i + 1,
                        why,
                        text: line.to_owned(),
                    });
                }
            }
        }
        list
    }

    /// The source named `name`, added when new; its category must agree.
    fn source(&mut self, name: &str, category: Option<Category>) -> Result<usize, &'static str> {
        let tag = name.to_lowercase();
        if let Some(&i) = self.tags.get(tag.as_str()) {
            let known = &self.sources[i];
            if &*known.name != name {
                return Err("a name may be spelled only one way (or is an alias already)");
            }
            if known.category != category {
                return Err("a name has one category");
            }
            return Ok(i);
        }
        self.sources.push(Source {
            name: name.into(),
            category,
        });
        let i = self.sources.len() - 1;
        self.tags.insert(tag.into(), i);
        Ok(i)
    }

    fn add_host(
        &mut self,
        host: &str,
        name: &str,
        category: Option<Category>,
    ) -> Result<(), &'static str> {
        if !valid_host(host) {
            return Err("a host is lower-case labels (at least two, no www.)");
        }
        if self.hosts.contains_key(host) {
            return Err("a host is listed once");
        }
        let i = self.source(name, category)?;
        self.hosts.insert(host.into(), i);
        Ok(())
    }

    fn add_alias(
        &mut self,
        tag: &str,
        name: &str,
        category: Option<Category>,
    ) -> Result<(), &'static str> {
        if tag.is_empty() || clean(tag) != tag || tag.to_lowercase() != tag {
            return Err("a tag is lower-case plain text");
        }
        if self.tags.contains_key(tag) {
            return Err("a tag is listed once, and a name's own spelling is not an alias");
        }
        if self.hosts.contains_key(tag) {
            return Err("a listed host is matched as a tag already");
        }
        let i = self.source(name, category)?;
        self.tags.insert(tag.into(), i);
        Ok(())
    }

    /// Rows refused while reading the tables.
    pub fn skipped(&self) -> &[BadRow] {
        &self.skipped
    }

    /// How many hosts, tags (names and aliases) and names the list holds.
    pub fn counts(&self) -> (usize, usize, usize) {
        (self.hosts.len(), self.tags.len(), self.sources.len())
    }

    fn answer(&self, i: usize) -> (&str, Option<Category>) {
        let s = &self.sources[i];
        (&s.name, s.category)
    }
}

/// `host` without a trailing dot or a port, lower-cased (borrowed when it already is).
fn normal_host(host: &str) -> Cow<'_, str> {
    let host = host.trim();
    let host = match host.rsplit_once(':') {
        Some((name, port))
            if !name.contains(':')
                && !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit()) =>
        {
            name
        }
        _ => host,
    };
    let host = host.trim_end_matches('.');
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    }
}

impl SourceNames for SourceList {
    fn by_host(&self, host: &str) -> Option<(&str, Option<Category>)> {
        let host = normal_host(host);
        let mut candidate = host.as_ref();
        // At least two labels: a single one (a TLD, `localhost`) is never looked up.
        while candidate.contains('.') {
            if let Some(&i) = self.hosts.get(candidate) {
                return Some(self.answer(i));
            }
            candidate = candidate.split_once('.').map_or("", |(_, parent)| parent);
        }
        None
    }

    fn by_name(&self, name: &str) -> Option<(&str, Option<Category>)> {
        let tag = name.trim().to_lowercase();
        if let Some(&i) = self.tags.get(tag.as_str()) {
            return Some(self.answer(i));
        }
        if tag.contains('.') {
            return self.by_host(&tag);
        }
        None
    }
}

#[cfg(test)]
mod tests;
