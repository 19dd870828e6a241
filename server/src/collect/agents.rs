//! Browser and operating system from a user agent, for the agent dimensions
//! ([`crate::core::dims::AgentDims`]).
//!
//! Use: build one [`AgentParser::bundled`] per process (~100 ms and ~14 MB in release builds)
//! and share it; call [`AgentParser::parse`] per visit, on any thread. Its
//! [`Agent::device_hint`] is for visits that sent no screen width
//! ([`crate::core::dims::device_of_width`] decides when one was sent).
//!
//! Contract:
//! - The data is uap-core's `regexes.yaml` (Apache-2.0) as JSON,
//!   `server/data/uap/regexes.json`, compiled into the binary; its origin, version and licence
//!   are in `server/data/uap/SOURCES.md`, and `scripts/refresh-uap.sh` refreshes it. Only the
//!   `ua-parser` crate's user-agent and OS extractors are built (its device extractor costs
//!   ~16 MB more); the device class comes from [`device_hint`] instead.
//! - Names are uap-core's, except those in `server/data/uap/names.tsv` (the project's own
//!   table: `Mobile Safari` is shown as `Safari`, `Chrome Mobile` as `Chrome`, `Mac OS X` as
//!   `macOS`, ...). What uap-core calls `Other`, and what it cannot read at all, is the empty
//!   string: unknown stays unknown, never a guess.
//! - Versions are the MAJOR version only: ASCII digits, at most [`MAX_VERSION_DIGITS`] of
//!   them; anything else is the empty string. Windows 11 sends "Windows NT 10.0" and macOS 11+
//!   sends "Mac OS X 10_15_7", so those read as 10: the agent cannot tell them apart.
//! - Every value is cleaned like a stored dimension ([`crate::core::dims::clean`]).
//! - [`AgentParser::parse`]'s answer depends on the agent alone; it never panics, and it is
//!   cheap for an agent seen recently: a bounded cache of answers (two generations, at most
//!   [`CACHE_ENTRIES`] entries and [`CACHE_BYTES`] bytes in all; ~0.1 µs a hit) sits in front
//!   of the regexes, which cost ~40 µs the first time a thread meets an agent and ~6 µs after
//!   (release builds, current browsers), and keep a lazy-DFA cache per thread that uses them.
//!   The caller cuts the agent to `collect::MAX_USER_AGENT_BYTES` first; the byte bound holds
//!   whatever it is given.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use serde::Deserialize;

use crate::core::dims::clean;

/// The bundled regexes: uap-core's user-agent and OS parsers.
pub const REGEXES_JSON: &str = include_str!("../../data/uap/regexes.json");

/// The bundled name table: `kind<TAB>uap-core's name<TAB>name shown`, kind `browser` or `os`.
pub const NAMES_TSV: &str = include_str!("../../data/uap/names.tsv");

/// Longest version kept, in digits (a longer "major" is not a version).
pub const MAX_VERSION_DIGITS: usize = 5;

/// Answers cached at most, over both generations.
pub const CACHE_ENTRIES: usize = 8192;

/// Bytes the cached answers may hold at most, over both generations: their agents and names,
/// plus [`ENTRY_OVERHEAD`] each.
pub const CACHE_BYTES: usize = 4 << 20;

/// Bytes counted per cached answer beyond its text (the map's slot, the boxes, the lengths).
const ENTRY_OVERHEAD: usize = 96;

/// What a user agent says about the browser and system it came from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Agent {
    /// The browser's family as shown ("Chrome", "Safari", "Samsung Internet"), or "".
    pub browser: String,
    /// The browser's major version ("126"), or "".
    pub browser_version: String,
    /// The operating system as shown ("Windows", "iOS", "macOS", "Android"), or "".
    pub os: String,
    /// The operating system's major version ("17"), or "".
    pub os_version: String,
    /// The device class the agent itself names ([`device_hint`]), for visits that sent no
    /// screen width: "Mobile", "Tablet", "Desktop" or "".
    pub device_hint: &'static str,
}

impl Agent {
    fn bytes(&self) -> usize {
        self.browser.len() + self.browser_version.len() + self.os.len() + self.os_version.len()
    }
}

/// Why data for the parser could not be used.
#[derive(Debug, thiserror::Error)]
pub enum AgentDataError {
    /// The regexes are not the JSON shape of uap-core's `regexes.yaml`.
    #[error("user-agent regexes: {0}")]
    Json(#[from] serde_json::Error),
    /// A regex did not compile.
    #[error("user-agent regexes: {0}")]
    Regex(String),
    /// A row of the name table is not `kind<TAB>from<TAB>to` with kind `browser` or `os`.
    #[error("user-agent names, line {line}: {text:?}")]
    Names { line: usize, text: String },
}

/// The parts of `regexes.json` that are used (its other keys are ignored).
#[derive(Deserialize)]
struct Regexes<'a> {
    user_agent_parsers: Vec<ua_parser::user_agent::Parser<'a>>,
    os_parsers: Vec<ua_parser::os::Parser<'a>>,
}

/// Names shown differently from uap-core's.
#[derive(Debug, Default)]
struct Names {
    browsers: HashMap<String, String>,
    systems: HashMap<String, String>,
}

impl Names {
    fn parse(tsv: &str) -> Result<Self, AgentDataError> {
        let mut names = Names::default();
        for (i, line) in tsv.lines().enumerate() {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = || AgentDataError::Names {
                line: i + 1,
                text: line.to_owned(),
            };
            let mut cols = line.split('\t');
            let (Some(kind), Some(from), Some(to), None) =
                (cols.next(), cols.next(), cols.next(), cols.next())
            else {
                return Err(bad());
            };
            if from.is_empty() || to.is_empty() || clean(to) != to {
                return Err(bad());
            }
            let map = match kind {
                "browser" => &mut names.browsers,
                "os" => &mut names.systems,
                _ => return Err(bad()),
            };
            if map.insert(from.to_owned(), to.to_owned()).is_some() {
                return Err(bad());
            }
        }
        Ok(names)
    }
}

/// The answers of recent agents, in two generations: a full young generation becomes the old
/// one (dropping the previous old one), and an agent found in the old one moves back to the
/// young, so the agents in use stay while one-off agents age out.
#[derive(Default)]
struct Cache {
    young: Generation,
    old: Generation,
}

#[derive(Default)]
struct Generation {
    map: HashMap<Box<str>, Agent>,
    bytes: usize,
}

impl Cache {
    const ENTRIES_PER_GENERATION: usize = CACHE_ENTRIES / 2;
    const BYTES_PER_GENERATION: usize = CACHE_BYTES / 2;

    fn get(&mut self, user_agent: &str) -> Option<Agent> {
        if let Some(agent) = self.young.map.get(user_agent) {
            return Some(agent.clone());
        }
        let agent = self.old.map.remove(user_agent)?;
        self.old.bytes -= Self::cost(user_agent, &agent);
        self.insert(user_agent, agent.clone());
        Some(agent)
    }

    fn insert(&mut self, user_agent: &str, agent: Agent) {
        let cost = Self::cost(user_agent, &agent);
        if cost > Self::BYTES_PER_GENERATION {
            return;
        }
        if self.young.map.len() >= Self::ENTRIES_PER_GENERATION
            || self.young.bytes + cost > Self::BYTES_PER_GENERATION
        {
            self.old = std::mem::take(&mut self.young);
        }
        if let Some(previous) = self.young.map.insert(user_agent.into(), agent) {
            self.young.bytes -= Self::cost(user_agent, &previous);
        }
        self.young.bytes += cost;
    }

    fn cost(user_agent: &str, agent: &Agent) -> usize {
        user_agent.len() + agent.bytes() + ENTRY_OVERHEAD
    }

    fn entries(&self) -> usize {
        self.young.map.len() + self.old.map.len()
    }

    fn bytes(&self) -> usize {
        self.young.bytes + self.old.bytes
    }
}

/// uap-core's user-agent and OS regexes, compiled once, behind a bounded cache of answers.
/// `Send + Sync`: one parser serves every thread.
pub struct AgentParser {
    /// `None` when the bundled data was unusable: every agent then reads as unknown.
    extractors: Option<Extractors>,
    names: Names,
    cache: Mutex<Cache>,
}

struct Extractors {
    browsers: ua_parser::user_agent::Extractor<'static>,
    systems: ua_parser::os::Extractor<'static>,
}

impl std::fmt::Debug for AgentParser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentParser")
            .field("loaded", &self.extractors.is_some())
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

impl AgentParser {
    /// The parser of the bundled data. The bundled data is checked by the tests; were it
    /// unreadable, every agent would read as unknown (and a warning says why), rather than the
    /// collector refusing to start.
    pub fn bundled() -> Self {
        Self::from_data(REGEXES_JSON, NAMES_TSV).unwrap_or_else(|error| {
            tracing::warn!(%error, "bundled user-agent data unusable: browsers and systems unknown");
            Self {
                extractors: None,
                names: Names::default(),
                cache: Mutex::default(),
            }
        })
    }

    /// A parser of uap-core's regexes as JSON (`user_agent_parsers` and `os_parsers`) and a
    /// name table (the format of [`NAMES_TSV`]).
    pub fn from_data(regexes_json: &str, names_tsv: &str) -> Result<Self, AgentDataError> {
        let regexes: Regexes<'static> = serde_json::from_str(regexes_json)?;
        let browsers = ua_parser::user_agent::Builder::new()
            .push_all(regexes.user_agent_parsers)
            .map_err(|e| AgentDataError::Regex(e.to_string()))?
            .build()
            .map_err(|e| AgentDataError::Regex(e.to_string()))?;
        let systems = ua_parser::os::Builder::new()
            .push_all(regexes.os_parsers)
            .map_err(|e| AgentDataError::Regex(e.to_string()))?
            .build()
            .map_err(|e| AgentDataError::Regex(e.to_string()))?;
        Ok(Self {
            extractors: Some(Extractors { browsers, systems }),
            names: Names::parse(names_tsv)?,
            cache: Mutex::default(),
        })
    }

    /// What `user_agent` says, from the cache when it was asked recently.
    pub fn parse(&self, user_agent: &str) -> Agent {
        if let Some(agent) = self.lock().get(user_agent) {
            return agent;
        }
        let agent = self.parse_uncached(user_agent);
        self.lock().insert(user_agent, agent.clone());
        agent
    }

    /// A browser name another tool wrote (GoatCounter's `Browser` column) as this parser
    /// shows it: the name table's spelling (`Mobile Safari` → `Safari`), "Other" unknown.
    pub fn browser_name(&self, name: &str) -> String {
        shown(name.trim(), &self.names.browsers)
    }

    /// An operating system's name another tool wrote, as this parser shows it
    /// (`Mac OS X` → `macOS`).
    pub fn os_name(&self, name: &str) -> String {
        shown(name.trim(), &self.names.systems)
    }

    /// What `user_agent` says, always from the regexes.
    pub fn parse_uncached(&self, user_agent: &str) -> Agent {
        let (browser, system) = match &self.extractors {
            Some(x) => (
                x.browsers.extract(user_agent),
                x.systems.extract(user_agent),
            ),
            None => (None, None),
        };
        let (browser, browser_version) = match browser {
            Some(b) => (
                shown(&b.family, &self.names.browsers),
                major(b.major.unwrap_or("")),
            ),
            None => (String::new(), String::new()),
        };
        let (os, os_version) = match system {
            Some(s) => (
                shown(&s.os, &self.names.systems),
                major(s.major.as_deref().unwrap_or("")),
            ),
            None => (String::new(), String::new()),
        };
        Agent {
            browser_version: if browser.is_empty() {
                String::new()
            } else {
                browser_version
            },
            os_version: if os.is_empty() {
                String::new()
            } else {
                os_version
            },
            device_hint: device_hint(user_agent, &os),
            browser,
            os,
        }
    }

    /// The answers cached now, and the bytes they count (at most [`CACHE_ENTRIES`] and
    /// [`CACHE_BYTES`]): for metrics.
    pub fn cached(&self) -> (usize, usize) {
        let cache = self.lock();
        (cache.entries(), cache.bytes())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        // The cache holds no invariant a panic could break halfway that matters to an answer.
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The name shown for uap-core's `name`: the table's, else its own; "Other" is unknown.
fn shown(name: &str, table: &HashMap<String, String>) -> String {
    if name == "Other" {
        return String::new();
    }
    match table.get(name) {
        Some(to) => to.clone(),
        None => clean(name),
    }
}

/// A major version: ASCII digits, at most [`MAX_VERSION_DIGITS`]; anything else is unknown.
pub fn major(version: &str) -> String {
    if !version.is_empty()
        && version.len() <= MAX_VERSION_DIGITS
        && version.bytes().all(|b| b.is_ascii_digit())
    {
        version.to_owned()
    } else {
        String::new()
    }
}

/// Operating systems of desktop and laptop computers, as [`AgentParser::parse`] names them.
pub const DESKTOP_SYSTEMS: [&str; 12] = [
    "Windows",
    "macOS",
    "Linux",
    "Chrome OS",
    "Ubuntu",
    "Debian",
    "Fedora",
    "Linux Mint",
    "FreeBSD",
    "OpenBSD",
    "NetBSD",
    "Solaris",
];

/// The device class a user agent names, by the first rule that matches (`os` as
/// [`AgentParser::parse`] names it):
/// 1. a television (`SmartTV`, `SMART-TV`, `Android TV`, `GoogleTV`, `AppleTV`, `Web0S`,
///    `HbbTV`, `BRAVIA`, a Fire TV's `; AFT` model) or a game console (`PlayStation`, `Xbox`, `Nintendo`) → Desktop, as Plausible
///    counts them;
/// 2. `iPad`, `Tablet` (not Windows' old `Tablet PC`), `Kindle` or `Silk/` → Tablet;
/// 3. `Mobi` (`Mobile`, `Mobi`), `iPhone`, `iPod`, `Windows Phone` or `Opera Mini` → Mobile;
/// 4. `Android` without any of those → Tablet (Android phones say `Mobile`);
/// 5. a desktop operating system ([`DESKTOP_SYSTEMS`]) → Desktop;
/// 6. otherwise "" (unknown).
///
/// Matching is case-sensitive, as browsers write these tokens.
pub fn device_hint(user_agent: &str, os: &str) -> &'static str {
    let has = |token: &str| user_agent.contains(token);
    let any = |tokens: &[&str]| tokens.iter().any(|t| has(t));
    if any(&[
        "SmartTV",
        "SMART-TV",
        "Android TV",
        "GoogleTV",
        "AppleTV",
        "Web0S",
        "HbbTV",
        "BRAVIA",
        "; AFT",
        "PlayStation",
        "Xbox",
        "Nintendo",
    ]) {
        "Desktop"
    } else if has("iPad") || (has("Tablet") && !has("Tablet PC")) || has("Kindle") || has("Silk/") {
        "Tablet"
    } else if any(&["Mobi", "iPhone", "iPod", "Windows Phone", "Opera Mini"]) {
        "Mobile"
    } else if has("Android") {
        "Tablet"
    } else if DESKTOP_SYSTEMS.contains(&os) {
        "Desktop"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests;
