//! How stored counters become the numbers people see.
//!
//! Rule (docs/site-owners.md, "What it counts"): views of the script/pixel ("web") and of the badge are counted
//! apart. A page that runs both counts each visit twice, once per source, so the shown number
//! is the LARGER of the two, never their sum; a page that uses only one source shows that one.
//! Carried-over base numbers (`tally site set-base`) are then added. Live numbers come from the
//! live window as they are.
//!
//! The raw numbers ([`BySource`], [`CountsRaw`]) are defined here, in the core: the stores
//! produce them (and re-export them), the core never imports a store.

use tally_wire::{Counts, Live, Numbers, ScopeCounts};

/// Numbers of one scope, kept apart by source (see [`crate::core::record::Source`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BySource {
    pub web: Numbers,
    pub badge: Numbers,
}

/// What the counts endpoint needs, straight from the counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CountsRaw {
    pub site_all: BySource,
    pub site_today: BySource,
    pub page_all: BySource,
    pub page_today: BySource,
    /// Carried-over numbers (`tally site set-base`) of the site and of the page.
    pub site_base: Numbers,
    pub page_base: Numbers,
}

/// The shown numbers of one scope: the larger source, per field.
pub fn combine(n: BySource) -> Numbers {
    Numbers {
        views: n.web.views.max(n.badge.views),
        visitors: n.web.visitors.max(n.badge.visitors),
    }
}

fn plus(a: Numbers, b: Numbers) -> Numbers {
    Numbers {
        views: a.views + b.views,
        visitors: a.visitors + b.visitors,
    }
}

fn scope(all: BySource, today: BySource, base: Numbers) -> ScopeCounts {
    let total = plus(combine(all), base);
    ScopeCounts {
        views: total.views,
        visitors: total.visitors,
        today: combine(today),
    }
}

/// The `/api/v1/counts` answer from stored counters and the live window.
pub fn present(raw: &CountsRaw, live: Live) -> Counts {
    Counts {
        site: scope(raw.site_all, raw.site_today, raw.site_base),
        page: scope(raw.page_all, raw.page_today, raw.page_base),
        live,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_take_the_larger_and_bases_add() {
        let mut raw = CountsRaw::default();
        raw.site_all.web = Numbers {
            views: 10,
            visitors: 3,
        };
        raw.site_all.badge = Numbers {
            views: 12,
            visitors: 2,
        };
        raw.site_base = Numbers {
            views: 100,
            visitors: 50,
        };
        let c = present(&raw, Live::default());
        assert_eq!((c.site.views, c.site.visitors), (112, 53));
        assert_eq!(c.site.today, Numbers::default());
    }
}
