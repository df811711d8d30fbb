"""The Lua scripts that read and write holds, each atomic on the server.

Each script's comment states its KEYS, ARGV and what it returns. Record values are laid
out as ``layout`` says. Numbers stay exact in Lua's doubles, far below 2**53: they are
written with ``%.0f``, never ``tostring`` (which rounds to 14 digits), and the shift
into a fencing token happens in Python.

Scripts are sent by SHA (EVALSHA); a server that does not know one (after a restart or
a failover) is sent its source once, and the call repeated.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError

from ...stats import Counters

__all__ = [
    "ACQUIRE",
    "EXTEND",
    "FORCE_RELEASE",
    "PASS",
    "PEEK",
    "RELEASE",
    "RENEW",
    "WANTED",
    "Script",
    "Scripts",
]

# Shared by every script. Servers before Redis 5 replicate a script's effects (rather
# than the script, whose TIME would differ on a replica) only when asked; later ones
# always do.
_PRELUDE = """
if redis.replicate_commands then redis.replicate_commands() end
local function owned(value, owner)
  return value and string.sub(value, 1, #owner + 1) == owner .. "\\n"
end
local function number_of(value)
  return string.match(value, "^[^\\n]*\\n(%d+)\\n")
end
local function milliseconds(clock)
  return string.format("%.0f", tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000))
end
-- When a key expires, in milliseconds since the epoch: PEXPIRETIME (Redis 7) is the same
-- in every call, where now + PTTL may differ by a millisecond.
local function expiry(key, now)
  local at = redis.pcall("PEXPIRETIME", key)
  if type(at) ~= "number" then at = tonumber(now) + redis.call("PTTL", key) end
  return string.format("%.0f", at)
end
"""


class Script:
    """A Lua script with the prelude, and its SHA."""

    def __init__(self, body: str) -> None:
        self.source = _PRELUDE + body
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()


# KEYS: record, counter, mark. ARGV: owner id, ttl ms, record head, record tail, the
# value of a holder proven gone ("" if none), the counter's life in ms, the trying
# backend's tag, the mark's life in ms.
# One scalar, the cheapest reply to read:
# a number (positive): taken for the owner with a number above every earlier one of the
# key: one more than the key's counter, or the server's clock in ticks of 100
# microseconds if that is higher, so that numbers rise across restarts even when the
# counter was lost (see ``RedisBackend``);
# a number (negative): minus the number of the owner's hold, which it holds already (an
# earlier try's reply was lost);
# a string: the holder's value: someone else holds it; the mark now names the trying
# backend, and tells the holder for the mark's life that the key is wanted (see WANTED).
ACQUIRE = Script("""
local value = redis.call("GET", KEYS[1])
if value and value ~= ARGV[5] then
  if owned(value, ARGV[1]) then return -tonumber(number_of(value)) end
  redis.call("SET", KEYS[3], ARGV[7], "PX", ARGV[8])
  return value
end
local clock = redis.call("TIME")
local ticks = tonumber(clock[1]) * 10000 + math.floor(tonumber(clock[2]) / 100)
local number = math.max((tonumber(redis.call("GET", KEYS[2])) or 0) + 1, ticks)
local text = string.format("%.0f", number)
redis.call("SET", KEYS[2], text, "PX", ARGV[6])
local record = ARGV[1] .. "\\n" .. text .. "\\n" .. ARGV[3] .. milliseconds(clock) .. ARGV[4]
redis.call("SET", KEYS[1], record, "PX", ARGV[2])
return number
""")

# KEYS: record. ARGV: owner id, channel.
# 1: the owner's hold is deleted and its pollers rung; 0: the hold was not theirs.
RELEASE = Script("""
if owned(redis.call("GET", KEYS[1]), ARGV[1]) then
  redis.call("DEL", KEYS[1])
  redis.call("PUBLISH", ARGV[2], "")
  return 1
end
return 0
""")

# KEYS: record. ARGV: channel. 1: a hold was deleted (and its pollers rung); 0: none was.
FORCE_RELEASE = Script("""
if redis.call("DEL", KEYS[1]) == 1 then
  redis.call("PUBLISH", ARGV[1], "")
  return 1
end
return 0
""")

# KEYS: record. ARGV: owner id, record head, record tail, ttl ms ("" keeps the expiry).
# 1: the owner's record now names the holder of head and tail, acquired now (a thread
# of the same process it was passed to); 0: the hold was not theirs.
PASS = Script("""
local value = redis.call("GET", KEYS[1])
if not owned(value, ARGV[1]) then return 0 end
local record = ARGV[1] .. "\\n" .. number_of(value) .. "\\n" .. ARGV[2]
  .. milliseconds(redis.call("TIME")) .. ARGV[3]
if ARGV[4] == "" then
  redis.call("SET", KEYS[1], record, "KEEPTTL")
else
  redis.call("SET", KEYS[1], record, "PX", ARGV[4])
end
return 1
""")

# KEYS: record. ARGV: owner id, ttl ms, the lease as JSON (a number, or null).
# 1: the owner's hold now lasts ttl from now, renewed by that lease; 0: not theirs.
EXTEND = Script("""
local value = redis.call("GET", KEYS[1])
if not owned(value, ARGV[1]) then return 0 end
local head, tail = string.match(value, "^(.*,)[^,]*(,%d+%])$")
redis.call("SET", KEYS[1], head .. ARGV[3] .. tail, "PX", ARGV[2])
return 1
""")

# KEYS: records. ARGV: their owner ids, in the same order.
# The positions (from 1) of the records still their owners': each now lasts the lease
# its record names from now (one with a fixed lease is left as it is).
RENEW = Script("""
local renewed = {}
for i = 1, #KEYS do
  local value = redis.call("GET", KEYS[i])
  if owned(value, ARGV[i]) then
    local lease = tonumber(string.match(value, ",([^,]*),%d+%]$"))
    if lease then redis.call("PEXPIRE", KEYS[i], math.max(1, math.ceil(lease * 1000))) end
    renewed[#renewed + 1] = i
  end
end
return renewed
""")

# KEYS: mark. ARGV: the asking backend's tag, the key's channel ("": not asked).
# {1 if the mark names another backend (else 0), the channel's subscribers (-1: not
# asked)}: one round trip tells a holder of both ways in which others want the key.
WANTED = Script("""
local marked = redis.call("GET", KEYS[1])
local wanted = (marked and marked ~= ARGV[1]) and 1 or 0
if ARGV[2] == "" then return {wanted, -1} end
return {wanted, redis.call("PUBSUB", "NUMSUB", ARGV[2])[2]}
""")

# KEYS: record. {value, ms to expiry, server seconds, microseconds}, or nil if free.
PEEK = Script("""
local value = redis.call("GET", KEYS[1])
if not value then return nil end
local now = milliseconds(redis.call("TIME"))
return {value, expiry(KEYS[1], now), now}
""")


class Scripts:
    """Runs scripts by SHA on a client or pipeline, counting what it sends."""

    def __init__(self, counters: Counters) -> None:
        self._counters = counters

    def run(self, client: Any, script: Script, keys: Sequence[str], args: Sequence[object]) -> Any:
        """``script`` with ``keys`` and ``args`` on ``client``: its result."""
        self._counters.add("statements")
        try:
            return client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            self.load(client, script)
            self._counters.add("statements")
            return client.evalsha(script.sha, len(keys), *keys, *args)

    def count(self, sent: int) -> None:
        """Count scripts sent in a pipeline."""
        self._counters.add("statements", sent)

    def load(self, client: Any, script: Script) -> None:
        """Send ``script``'s source to the server (to every primary of a cluster)."""
        self._counters.add("statements")
        client.script_load(script.source)
