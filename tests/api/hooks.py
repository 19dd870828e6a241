"""Schemathesis hooks of scripts/api-test.sh: generated hits get event times in the window.

A hit's `event_id` is a UUIDv7 whose embedded time must lie in the collector's window (24 h
back, 5 min ahead). Generated ids almost never do, so without this hook every generated hit
would be answered 400 `event_id_out_of_window` and the counting path (sites, limits, the
ingest queue, dedupe, `?counts=1`) would go untested. The hook moves the 48-bit time of every
UUIDv7-shaped `event_id` into the last 23 hours, keeping the random bits. The new time is a
function of the old one and of the run's start, so a generated id sent twice is still the same
id: duplicates are exercised too. Anything not shaped like a UUIDv7 is left as generated.
"""

import re
import time

import schemathesis

V7 = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-7[0-9a-fA-F]{3}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
START_MS = int(time.time() * 1000)
WINDOW_MS = 23 * 3600 * 1000


def in_window(event_id):
    if not isinstance(event_id, str) or not V7.match(event_id):
        return event_id
    old = int(event_id[:8] + event_id[9:13], 16)
    ms = f"{START_MS - old % WINDOW_MS:012x}"
    return f"{ms[:8]}-{ms[8:]}{event_id[13:]}"


def refresh(record):
    if isinstance(record, dict) and "event_id" in record:
        record = dict(record, event_id=in_window(record["event_id"]))
    return record


@schemathesis.hook
def before_call(ctx, case, kwargs):
    # Every phase (examples, coverage, fuzzing, stateful) calls through here.
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("events"), list):
        new = dict(body, events=[refresh(r) for r in body["events"]])
    else:
        new = refresh(body)
    if new != body:
        case.body = new
