//! The badge/pixel repeat gate on Redis: a Lua compare-and-set on the time of the last
//! admission.

use std::sync::Arc;

use async_trait::async_trait;

use super::RedisLink;
use crate::core::classify::Lane;
use crate::state::RepeatGate;
use crate::state::memory::MemoryRepeatGate;
/// Admit when the key's last admission is at least ARGV[2] ms before ARGV[1] (now, ms);
/// remember the admission for ARGV[3] ms. Returns 1 admitted, 0 a repeat.
const GATE_LUA: &str = r"
local now = tonumber(ARGV[1])
local last = tonumber(redis.call('GET', KEYS[1]) or '')
if last and now - last < tonumber(ARGV[2]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
return 1
";

/// The badge/pixel repeat gate on Redis.
pub struct RedisRepeatGate {
    link: Arc<RedisLink>,
    direct_ms: i64,
    proxy_ms: i64,
    script: redis::Script,
    fallback: MemoryRepeatGate,
}

impl RedisRepeatGate {
    /// Direct repeats within `direct_ms` and proxy repeats within `proxy_ms` count once.
    pub fn new(
        link: Arc<RedisLink>,
        direct_ms: i64,
        proxy_ms: i64,
        fallback: MemoryRepeatGate,
    ) -> Self {
        Self {
            link,
            direct_ms,
            proxy_ms,
            script: redis::Script::new(GATE_LUA),
            fallback,
        }
    }
}

#[async_trait]
impl RepeatGate for RedisRepeatGate {
    async fn admit(&self, lane: Lane, key: u64, now_ms: i64) -> bool {
        let (interval, name) = match lane {
            Lane::Direct => (self.direct_ms, "d"),
            Lane::Proxy => (self.proxy_ms, "p"),
        };
        if interval <= 0 {
            return true;
        }
        let mut invocation = self.script.prepare_invoke();
        invocation
            .key(self.link.key(format_args!("gate:{name}:{key:016x}")))
            .arg(now_ms)
            .arg(interval)
            // Kept a second longer than the interval: clocks of collectors differ a little.
            .arg(interval + 1000);
        let admitted = self
            .link
            .run(|mut c| async move { invocation.invoke_async::<i64>(&mut c).await })
            .await;
        match admitted {
            Some(n) => n == 1,
            None => self.fallback.admit(lane, key, now_ms).await,
        }
    }
}
