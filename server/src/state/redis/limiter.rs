//! The per-address limits on Redis: GCRA over every quota of a request in one Lua script, all
//! or nothing; the same arithmetic as `core::gcra`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;

use super::{RedisLink, name_of};
use crate::core::classify::Lane;
use crate::core::gcra::Quota;
use crate::core::ids::SiteId;
use crate::core::net::ClientNet;
use crate::state::RateLimiter;
use crate::state::limits::{GUESS_PENALTY_CAP, GUESSES_PER_MINUTE, LimitConfig, Refusal, scaled};
use crate::state::memory::Limits;

/// GCRA over several buckets, all or nothing. KEYS: the buckets. ARGV: now (µs), charge (1/0),
/// then per bucket: interval (µs), burst, cells. Returns {0, 0} admitted, {1, µs} wait,
/// {2, burst} never (more cells than the burst). The arithmetic is `core::gcra::Quota::check`.
const GCRA_LUA: &str = r"
local now = tonumber(ARGV[1])
local charge = ARGV[2] == '1'
local tats = {}
for i, key in ipairs(KEYS) do
  local base = 2 + (i - 1) * 3
  local interval = tonumber(ARGV[base + 1])
  local burst = tonumber(ARGV[base + 2])
  local n = tonumber(ARGV[base + 3])
  if n > burst then return {2, burst} end
  local tat = tonumber(redis.call('GET', key) or now)
  if tat < now then tat = now end
  local new_tat = tat + n * interval
  local over = new_tat - now - burst * interval
  if over > 0 then return {1, over} end
  tats[i] = new_tat
end
if charge then
  for i, key in ipairs(KEYS) do
    local ttl = math.ceil((tats[i] - now) / 1000) + 1000
    redis.call('SET', key, string.format('%.0f', tats[i]), 'PX', ttl)
  end
end
return {0, 0}
";

/// Charge ARGV[2] µs to the TAT in KEYS[1] (µs) from max(TAT, now = ARGV[1]), even over the
/// allowance, but never past now + ARGV[3] µs (a wrong token guess: `limits::wrong_guess`).
const PENALTY_LUA: &str = r"
local now = tonumber(ARGV[1])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
tat = math.min(tat + tonumber(ARGV[2]), now + tonumber(ARGV[3]))
redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
return 0
";

/// One bucket of a request: its key, quota and cells.
struct Charge {
    key: String,
    quota: Quota,
    cells: u32,
}

/// The per-address limits on Redis (the rules of [`crate::state::limits`]).
pub struct RedisLimiter {
    link: Arc<RedisLink>,
    direct: (Option<Quota>, Option<Quota>),
    proxy: (Option<Quota>, Option<Quota>),
    new_sites: Option<Quota>,
    guesses: Option<Quota>,
    script: redis::Script,
    penalty: redis::Script,
    fallback: Limits,
}

impl RedisLimiter {
    /// The limits of `config` on `link`, with in-process [`Limits`] for when Redis is gone.
    pub fn new(link: Arc<RedisLink>, config: LimitConfig) -> Self {
        Self {
            link,
            direct: (
                scaled(config.per_site_per_minute, 1),
                scaled(config.per_address_per_minute, 1),
            ),
            proxy: (
                scaled(config.per_site_per_minute, config.proxy_factor),
                scaled(config.per_address_per_minute, config.proxy_factor),
            ),
            new_sites: Quota::per_hour(config.new_sites_per_hour, config.new_sites_per_hour),
            guesses: Quota::per_minute(GUESSES_PER_MINUTE),
            script: redis::Script::new(GCRA_LUA),
            penalty: redis::Script::new(PENALTY_LUA),
            fallback: Limits::new(config),
        }
    }

    /// The hash tag of a network's keys (one Redis Cluster slot per network).
    fn net_tag(&self, net: ClientNet) -> String {
        let mut h = blake3::Hasher::new_keyed(&self.link.hash_key);
        h.update(b"tally limits");
        h.update(&net.to_bytes());
        h.finalize().to_hex()[..24].to_owned()
    }

    fn lane_name(lane: Lane) -> &'static str {
        match lane {
            Lane::Direct => "d",
            Lane::Proxy => "p",
        }
    }

    fn quotas(&self, lane: Lane) -> (Option<Quota>, Option<Quota>) {
        match lane {
            Lane::Direct => self.direct,
            Lane::Proxy => self.proxy,
        }
    }

    /// The charge of one token guess by `net` (none when guesses are unlimited).
    fn guess_charge(&self, net: ClientNet) -> Option<Charge> {
        self.guesses.map(|quota| Charge {
            key: self
                .link
                .key(format_args!("lim:{{{}}}:guess", self.net_tag(net))),
            quota,
            cells: 1,
        })
    }

    /// Run the script; `None` when Redis did not answer.
    async fn gcra(
        &self,
        charges: Vec<Charge>,
        now: Timestamp,
        charge: bool,
    ) -> Option<Result<(), Refusal>> {
        if charges.is_empty() {
            return Some(Ok(()));
        }
        let mut invocation = self.script.prepare_invoke();
        invocation
            .arg(now.as_microsecond())
            .arg(if charge { "1" } else { "0" });
        for c in &charges {
            invocation
                .key(&c.key)
                .arg(c.quota.interval_us())
                .arg(c.quota.burst())
                .arg(c.cells);
        }
        let (code, value): (i64, i64) = self
            .link
            .run(|mut conn| async move { invocation.invoke_async(&mut conn).await })
            .await?;
        Some(match code {
            0 => Ok(()),
            1 => Err(Refusal::Wait(Duration::from_micros(
                u64::try_from(value).unwrap_or(0),
            ))),
            _ => Err(Refusal::Never {
                allowance: u32::try_from(value).unwrap_or(0),
            }),
        })
    }
}

#[async_trait]
impl RateLimiter for RedisLimiter {
    async fn admit_many(
        &self,
        lane: Lane,
        net: ClientNet,
        per_site: &[(&SiteId, u32)],
        now: Timestamp,
    ) -> Result<(), Refusal> {
        let tag = self.net_tag(net);
        let (site_quota, address_quota) = self.quotas(lane);
        let lane_name = Self::lane_name(lane);
        let mut charges = Vec::with_capacity(per_site.len() + 1);
        if let Some(quota) = site_quota {
            for (site, cells) in per_site {
                let site = name_of(&[site.as_str()]);
                charges.push(Charge {
                    key: self
                        .link
                        .key(format_args!("lim:{{{tag}}}:{lane_name}:s:{site}")),
                    quota,
                    cells: *cells,
                });
            }
        }
        if let Some(quota) = address_quota {
            let total = per_site
                .iter()
                .fold(0u32, |sum, (_, n)| sum.saturating_add(*n));
            charges.push(Charge {
                key: self.link.key(format_args!("lim:{{{tag}}}:{lane_name}:a")),
                quota,
                cells: total,
            });
        }
        match self.gcra(charges, now, true).await {
            Some(verdict) => verdict,
            None => self.fallback.admit_many(lane, net, per_site, now),
        }
    }

    async fn has_room(&self, lane: Lane, net: ClientNet, now: Timestamp) -> Result<(), Refusal> {
        let Some(quota) = self.quotas(lane).1 else {
            return Ok(());
        };
        let tag = self.net_tag(net);
        let lane_name = Self::lane_name(lane);
        let charges = vec![Charge {
            key: self.link.key(format_args!("lim:{{{tag}}}:{lane_name}:a")),
            quota,
            cells: 1,
        }];
        match self.gcra(charges, now, false).await {
            Some(verdict) => verdict,
            None => self.fallback.has_room(lane, net, now),
        }
    }

    async fn admit_new_site(&self, net: ClientNet, now: Timestamp) -> Result<(), Refusal> {
        let Some(quota) = self.new_sites else {
            return Ok(());
        };
        let tag = self.net_tag(net);
        let charges = vec![Charge {
            key: self.link.key(format_args!("lim:{{{tag}}}:new-sites")),
            quota,
            cells: 1,
        }];
        match self.gcra(charges, now, true).await {
            Some(verdict) => verdict,
            None => self.fallback.admit_new_site(net, now),
        }
    }

    async fn may_guess(&self, net: ClientNet, now: Timestamp) -> Result<(), Refusal> {
        let charges = self.guess_charge(net).into_iter().collect();
        match self.gcra(charges, now, false).await {
            Some(verdict) => verdict,
            None => self.fallback.may_guess(net, now),
        }
    }

    async fn wrong_guess(&self, net: ClientNet, now: Timestamp) {
        let Some(charge) = self.guess_charge(net) else {
            return;
        };
        let mut invocation = self.penalty.prepare_invoke();
        invocation
            .key(&charge.key)
            .arg(now.as_microsecond())
            .arg(charge.quota.interval_us())
            .arg(i64::try_from(GUESS_PENALTY_CAP.as_micros()).unwrap_or(i64::MAX));
        let done: Option<i64> = self
            .link
            .run(|mut conn| async move { invocation.invoke_async(&mut conn).await })
            .await;
        if done.is_none() {
            self.fallback.wrong_guess(net, now);
        }
    }
}
