//! Redisson's read-write lock scripts, written from the data model in shared/reference
//! (`redisson-rwlock-semaphore-model.md`, §2.2 to §2.5; the unlock latch left out): what a
//! Redisson client runs on the same names. The tests run them beside `RWLOCK.*`; the benchmark
//! runs them as the Redisson-style baseline.

pub const REDISSON_READ: &str = r"
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('hset', KEYS[1], 'mode', 'read')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('set', KEYS[2] .. ':1', 1)
  redis.call('pexpire', KEYS[2] .. ':1', ARGV[1])
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
if mode == 'read' or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[3]) == 1) then
  local i = redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('set', KEYS[2] .. ':' .. i, 1)
  redis.call('pexpire', KEYS[2] .. ':' .. i, ARGV[1])
  redis.call('pexpire', KEYS[1], math.max(redis.call('pttl', KEYS[1]), tonumber(ARGV[1])))
  return nil
end
return redis.call('pttl', KEYS[1])";

pub const REDISSON_READ_UNLOCK: &str = r"
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('publish', KEYS[2], ARGV[1])
  return nil
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then return nil end
local c = redis.call('hincrby', KEYS[1], ARGV[2], -1)
if c == 0 then redis.call('hdel', KEYS[1], ARGV[2]) end
redis.call('del', KEYS[3] .. ':' .. (c + 1))
if redis.call('hlen', KEYS[1]) > 1 then
  local m = -3
  for _, f in ipairs(redis.call('hkeys', KEYS[1])) do
    local n = tonumber(redis.call('hget', KEYS[1], f))
    if type(n) == 'number' then
      for i = n, 1, -1 do
        m = math.max(m, redis.call('pttl', KEYS[4] .. ':' .. f .. ':rwlock_timeout:' .. i))
      end
    end
  end
  if m > 0 then
    redis.call('pexpire', KEYS[1], m)
    return 0
  end
  if mode == 'write' then return 0 end
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], ARGV[1])
return 1";

pub const REDISSON_WRITE: &str = r"
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('hset', KEYS[1], 'mode', 'write')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
if mode == 'write' and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], redis.call('pttl', KEYS[1]) + ARGV[1])
  return nil
end
return redis.call('pttl', KEYS[1])";

pub const REDISSON_WRITE_UNLOCK: &str = r"
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('publish', KEYS[2], ARGV[1])
  return nil
end
if mode == 'write' then
  if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then return nil end
  local c = redis.call('hincrby', KEYS[1], ARGV[3], -1)
  if c > 0 then
    redis.call('pexpire', KEYS[1], ARGV[2])
    return 0
  end
  redis.call('hdel', KEYS[1], ARGV[3])
  if redis.call('hlen', KEYS[1]) == 1 then
    redis.call('del', KEYS[1])
    redis.call('publish', KEYS[2], ARGV[1])
  else
    redis.call('hset', KEYS[1], 'mode', 'read')
  end
  return 1
end
return nil";

/// One Redisson thread's view of the read-write lock `name`: its scripts' keys and arguments.
#[derive(Debug, Clone)]
pub struct RedissonRw {
    pub name: String,
    /// The thread's owner id, `<client-uuid>:<thread-id>`.
    pub me: String,
}

/// A script with its keys and arguments, ready to `EVAL` (or `EVALSHA` with its SHA1).
#[derive(Debug, Clone)]
pub struct Call {
    pub script: &'static str,
    pub keys: Vec<String>,
    pub args: Vec<String>,
}

impl Call {
    /// `EVAL script numkeys keys... args...`, or `EVALSHA sha ...` when the script's SHA1 is
    /// given (loaded with `SCRIPT LOAD`).
    #[must_use]
    pub fn command(&self, sha: Option<&str>) -> redis::Cmd {
        let mut c = redis::cmd(if sha.is_some() { "EVALSHA" } else { "EVAL" });
        c.arg(sha.unwrap_or(self.script)).arg(self.keys.len());
        for k in &self.keys {
            c.arg(k);
        }
        for a in &self.args {
            c.arg(a);
        }
        c
    }
}

impl RedissonRw {
    #[must_use]
    pub fn new(name: &str, me: &str) -> Self {
        Self { name: name.to_owned(), me: me.to_owned() }
    }

    fn hold_prefix(&self) -> String {
        format!("{{{}}}:{}:rwlock_timeout", self.name, self.me)
    }

    /// The lock's channel, `redisson_rwlock:{name}`.
    #[must_use]
    pub fn channel(&self) -> String {
        format!("redisson_rwlock:{{{}}}", self.name)
    }

    /// Read acquire: nil = held, else the lock's PTTL.
    #[must_use]
    pub fn read(&self, lease_ms: u64) -> Call {
        Call {
            script: REDISSON_READ,
            keys: vec![self.name.clone(), self.hold_prefix()],
            args: vec![lease_ms.to_string(), self.me.clone(), format!("{}:write", self.me)],
        }
    }

    /// Read unlock: 1 freed (and `0` published), 0 still held, nil not held.
    #[must_use]
    pub fn read_unlock(&self) -> Call {
        Call {
            script: REDISSON_READ_UNLOCK,
            keys: vec![
                self.name.clone(),
                self.channel(),
                self.hold_prefix(),
                format!("{{{}}}", self.name),
            ],
            args: vec!["0".to_owned(), self.me.clone()],
        }
    }

    /// Write acquire: nil = held, else the lock's PTTL.
    #[must_use]
    pub fn write(&self, lease_ms: u64) -> Call {
        Call {
            script: REDISSON_WRITE,
            keys: vec![self.name.clone()],
            args: vec![lease_ms.to_string(), format!("{}:write", self.me)],
        }
    }

    /// Write unlock: 1 ended (freed and `1` published, or downgraded), 0 still held, nil not held.
    #[must_use]
    pub fn write_unlock(&self) -> Call {
        Call {
            script: REDISSON_WRITE_UNLOCK,
            keys: vec![self.name.clone(), self.channel()],
            args: vec!["1".to_owned(), "30000".to_owned(), format!("{}:write", self.me)],
        }
    }
}
