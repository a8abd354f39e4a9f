package limit

import "fmt"

// Scope says which replicas' hits a limit counts.
type Scope uint8

const (
	// ScopePOP counts this PoP only and is never replicated. The default.
	ScopePOP Scope = iota
	// ScopeRegion counts every PoP of this PoP's region.
	ScopeRegion
	// ScopeGlobal counts every PoP.
	ScopeGlobal
)

var scopeNames = [...]string{"pop", "region", "global"}

func (s Scope) String() string {
	if int(s) < len(scopeNames) {
		return scopeNames[s]
	}
	return fmt.Sprintf("Scope(%d)", s)
}

// Consistency says how a region or global limit holds across replicas
// (DESIGN.md "How counts flow between PoPs").
type Consistency uint8

const (
	// Eventual, the default, decides on this PoP's counts, the counts the
	// other PoPs published and an estimate of what they admitted since: it
	// may admit past the limit by about what the PoPs admit while their news
	// is on the way.
	Eventual Consistency = iota
	// Bounded never admits past the limit: a PoP admits only within an
	// allowance it holds, and the allowances of one window never sum past
	// the limit (region/escrow). It may deny while allowance moves.
	Bounded
	// Strong has one home region decide for the key, at one round trip.
	Strong
)

var consistencyNames = [...]string{"eventual", "bounded", "strong"}

func (c Consistency) String() string {
	if int(c) < len(consistencyNames) {
		return consistencyNames[c]
	}
	return fmt.Sprintf("Consistency(%d)", c)
}

// ParseConsistency maps a rule file's consistency name to a Consistency. The
// empty name is Eventual.
func ParseConsistency(s string) (Consistency, error) {
	if s == "" {
		return Eventual, nil
	}
	for i, n := range consistencyNames {
		if s == n {
			return Consistency(i), nil
		}
	}
	return 0, fmt.Errorf("unknown consistency %q (want eventual, bounded or strong)", s)
}

// Replicable reports whether a can count across replicas: only the window
// algorithms, whose per-window counts are G-counters (crdt), can.
func (a Algorithm) Replicable() bool { return a == SlidingWindow || a == FixedWindow }

// Item is one limit a request matched, as a store sees it: the key whose state
// it counts against and how to count.
type Item struct {
	// Key names the state. Stores treat it as opaque bytes; the same bytes must
	// always be checked with the same Algorithm and Window.
	Key []byte
	// Spec says how to count.
	Spec Spec
	// Shadow items are counted and reported but never deny the request.
	Shadow bool
	// Scope says whose hits count: this PoP's (ScopePOP), its region's or
	// every PoP's. Stores without replication count every scope as ScopePOP.
	Scope Scope
	// FailClosed items are denied, rather than decided on local knowledge,
	// when the store that holds them cannot answer (security-critical limits
	// such as logins). Stores without a failure mode ignore it.
	FailClosed bool
	// CountDenied items count their hits even when the request is denied,
	// as Envoy's ratelimit counts every hit (INCRBY before the comparison);
	// the decision is the same, but a client that keeps sending stays over.
	// It applies to the window algorithms, token_bucket and gcra (a sliding
	// log keeps one entry per admitted hit). A shadow item with it counts
	// every hit too, past its limit and when another item denies the
	// request, as the peer counts a shadow or quota-mode limit; without it a
	// shadow item stops counting at its limit.
	CountDenied bool
	// Shrunk items are a global limit cut to this PoP's share while its
	// region is cut off from others (pop.Engine.SetGlobalShare). Their
	// previous window counts at most the limit: it was filled under the
	// whole limit, and the sliding estimate, which takes the previous
	// window as evenly spread, would release it at the whole limit's
	// pace — each side of a cut would let in its share again in the
	// window after it shrank. Stores that replicate apply it.
	Shrunk bool
	// Unshrunk is a Shrunk item's limit as configured, before the share
	// cut it: a strong limit's home decides with it, whatever share the
	// asking PoP holds (store.Strong).
	Unshrunk int64
	// Consistency is how a region or global item holds across replicas;
	// stores that replicate apply it, and ignore it for ScopePOP.
	Consistency Consistency
	// Again marks a check decided again after it waited for bounded
	// allowance (pop.Engine.UseAllowanceWait): a bounded item it denies
	// does not count its hits as demand again, since the first decision
	// did; otherwise each retry would make this PoP's demand look larger.
	Again bool
}

// CountsDenied reports whether it adds its hits to a denied request, or,
// for a shadow item, hits past its limit: CountDenied on an algorithm that
// can count them. Every store applies it as Decide does.
func (it *Item) CountsDenied() bool {
	return it.CountDenied && it.Spec.Algorithm != SlidingLog
}

// Take is Spec.Take for a request that matched this one item: it also
// counts denied hits when the item says so (CountDenied).
func (it *Item) Take(st *State, now, hits int64) Decision {
	d := it.Spec.Take(st, now, hits)
	if !d.Allowed && it.CountsDenied() {
		it.Spec.Add(st, now, hits)
		d.Remaining = 0 // what the peek had is spent now
	}
	return d
}

// Admit reports whether a request whose items got the decisions ds is admitted:
// every item that is not shadow allowed it. It is the rule stores apply before
// they add hits (Decide), and is exported so that every store applies the same one.
func Admit(items []Item, ds []Decision) bool {
	for i := range items {
		if !ds[i].Allowed && !items[i].Shadow {
			return false
		}
	}
	return true
}

// Decide evaluates items against states at now as one atomic step, the contract
// every store implements: each state is advanced and asked, and only when the
// request is admitted (Admit) are hits added, and then only to the items that
// allowed them (a shadow item over its limit stays at its limit). A denied
// request therefore consumes no quota of any limit it matched — except of its
// CountDenied items, which count the hits whatever the outcome, a shadow one
// past its limit too. The caller holds whatever locks make the step atomic;
// states[i] belongs to items[i].
func Decide(now, hits int64, items []Item, states []*State, out []Decision) bool {
	for i := range items {
		items[i].Spec.Advance(states[i], now)
		out[i] = items[i].Spec.Peek(states[i], now, hits)
	}
	ok := Admit(items, out)
	for i := range items {
		switch {
		case ok && out[i].Allowed:
			items[i].Spec.Add(states[i], now, hits)
		case items[i].CountsDenied():
			// Denied (the request, or a shadow item's own limit): Envoy's
			// way counts the hits anyway. An item that allowed them reports
			// the room after them already; one that denied them has none left.
			items[i].Spec.Add(states[i], now, hits)
			if !out[i].Allowed {
				out[i].Remaining = 0
			}
		case !out[i].Allowed:
		default:
			// This limit had room, but another denied the request: nothing was
			// spent, so its room is what it was.
			out[i].Remaining += hits
		}
	}
	return ok
}
