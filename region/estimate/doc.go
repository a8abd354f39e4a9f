// Package estimate is the pure core of `consistency: eventual`'s guess: how
// many hits of a key the other replicas (PoPs) of its scope have admitted
// that this PoP has not heard of yet — limit.State.Unheard, which a check of
// a region or global limit adds to what it heard.
//
// The package is pure: it reads no clock, does no IO, starts no goroutines
// and holds no randomness. Every instant is an argument (unix nanoseconds),
// every count a value the caller read from its tables, every message it
// learns from a call (Clock.Heard, Clock.Beaconed). It imports the standard
// library only. Its stateful types, Clock and Recent, are not safe for
// concurrent use: the store that holds them serialises every call.
//
// # What it models
//
//   - Clock: what this PoP knows of how fresh another replica's news is —
//     when the replica stamped its newest message applied here, when that
//     was applied, the usual gap between its messages and the usual delay
//     from stamp to apply, and its presence beacons. From these, the age of
//     what the replica last told (Clock.Age) and whether its news is held up
//     (a stalled link, a cut) or may still be on its way.
//   - Recent: what this PoP itself admitted lately of one key near its
//     limit — the running total after each of its latest admissions — and
//     the correction settle keeps for the key's guess.
//   - The guess (Unheard, Clock.Guess): for each replica, what it probably
//     admitted since its news, over the age of that news: by what this PoP
//     admitted over the same age, scaled by the replica's part of the key
//     (the mirror), or by the replica's own rate; replicas whose news is held
//     up count as the ones whose news flows.
//   - The settled count's correction (Recent.Due, Recent.Judge): once every
//     replica's count of the previous window has arrived, how far it settled
//     from the limit steers what the guess adds.
//
// # Inputs
//
// The caller (pop/store, for the embedded and the Redis store alike) keeps
// the counts — its own and the other replicas' per-window G-counters — and
// hands the estimate, per key, values: the replicas' counts of the key in
// its scope (Count), this PoP's own counts, the instant and the window
// (Key), and the state objects. A scope is a func(name) bool accepting the
// replicas of a region, or nil for every replica.
//
// The comments record why each mechanism is there; the experiments behind
// the constants are in docs/accuracy-log.md.
package estimate
