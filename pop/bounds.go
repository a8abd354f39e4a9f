package pop

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/region/escrow"
)

// BoundFactor is how many times a key's limit, as this PoP's rules set it, a
// count from another replica may reach before the receiver clamps it
// (ReplicaBounds.MaxCount).
//
// Why 4. A replica admits a hit only while its estimate plus the hits fit
// the limit, and its own count of the window is part of that estimate (all of
// it for sliding_window and fixed_window, the only algorithms that
// replicate); a shadow limit stops counting at its limit; a global share
// below 1 and the guess of unheard hits only make the limit smaller. So an
// honest count never exceeds the highest limit its sender applied to the key
// during the window. That may be above this PoP's limit: a quota lowered
// mid-window (the counts stay), a rollout that raised it on the sender first,
// a Redis-backed PoP that counted on its fallback store while Redis was away
// and then on Redis again (up to twice its limit). 4 leaves room for all of
// these; a count clamped at 4× this PoP's limit still puts the key over it
// here, so this PoP decides as the true count would make it. What a clamp
// loses: a request's own limit (Envoy's RateLimitOverride) above 4× its
// rule's, on a region or global limit, is enforced against the other PoPs'
// counts clamped at 4× the rule's.
const BoundFactor = 4

// bitSlack is how much later than its rule allows an honest bit may seem to
// end: the sender's clock may run ahead of the receiver's (PoPs' clocks must
// agree to a small fraction of the shortest window; see docs/replication.md).
const bitSlack = time.Second

// ReplicaBounds bounds what other replicas can honestly send, from the
// engine's current rules: replication's receiver checks (core.Bounds). It is
// safe for concurrent use and reads the rules the engine has at each call.
type ReplicaBounds struct {
	e    *Engine
	most *atomic.Pointer[mostLimit]
}

// mostLimit is the highest and the lowest replicable limit of a rule set.
type mostLimit struct {
	set         *rules.Set
	most, least int64
}

// ReplicaBounds returns the bounds of e's rules.
func (e *Engine) ReplicaBounds() ReplicaBounds {
	return ReplicaBounds{e: e, most: new(atomic.Pointer[mostLimit])}
}

// limits returns the highest replicable limit of set, at least MaxHits, and
// the lowest (MaxHits when there is none), computed once per rule set.
func (b ReplicaBounds) limits(set *rules.Set) *mostLimit {
	if c := b.most.Load(); c != nil && c.set == set {
		return c
	}
	c := &mostLimit{set: set, most: MaxHits, least: MaxHits}
	first := true
	for _, r := range set.Limits() {
		if r.Scope != limit.ScopePOP && r.Spec.Algorithm.Replicable() && !r.Unlimited {
			c.most = max(c.most, r.Spec.Limit)
			if first || r.Spec.Limit < c.least {
				c.least, first = max(r.Spec.Limit, 0), false
			}
		}
	}
	b.most.Store(c)
	return c
}

// CountFloor returns a count at or under every key's MaxCount, but for keys
// no PoP replicates: BoundFactor × the lowest replicable limit of the rules.
// The receiver skips MaxCount for counts at or under it (core.CountFloor):
// most counts are far under their limit, and looking a key's rule up costs
// more than the rest of receiving its slot. A key no PoP replicates (pop
// scope, or not a store key) may so be applied with a count under the floor;
// nothing counts it.
func (b ReplicaBounds) CountFloor() uint64 {
	return BoundFactor * uint64(b.limits(b.e.Rules()).least)
}

// lookup returns the rule limit of key, and the key's parts; ok is false for
// a key no PoP replicates (not built by rules.Limit.AppendKey, pop scope, an
// algorithm that does not replicate). l is nil when this PoP's rules have no
// such limit (another domain, a rule not loaded here yet, a request's own
// limit with a unit the rule does not have).
func (b ReplicaBounds) lookup(key string, buf []rules.Entry) (l *rules.Limit, k rules.Key, ok bool) {
	k, ok = rules.ParseKey(key, buf)
	if !ok || k.Scope == limit.ScopePOP || !k.Algorithm.Replicable() {
		return nil, k, false
	}
	d := b.e.Rules().Domain(k.Domain)
	if d == nil {
		return nil, k, true
	}
	if d.Tenants != nil {
		return tenantLimit, k, true
	}
	for _, m := range d.Match(k.Entries) {
		if m.Unit == k.Unit && max(m.Multiplier, 1) == k.Multiplier && m.Spec.Algorithm == k.Algorithm && m.Scope == k.Scope && !m.Unlimited {
			return m, k, true
		}
	}
	return nil, k, true
}

// tenantLimit is what lookup returns for a key of a domain with tenants: its
// limit is the key's tier's, or an override from the quota store (pop/quota),
// which this PoP may hold in another version than the sender, so no count
// bound is safe to derive from the rules alone.
var tenantLimit = &rules.Limit{Name: "tenant"}

// MaxCount returns the highest count another replica can honestly report
// for key in one window: BoundFactor × the key's limit here. A key no PoP
// replicates gets 0. A key whose limit this PoP does not know gets
// BoundFactor × the larger of the highest replicable limit here and MaxHits:
// its count decides nothing here until a rule names it.
func (b ReplicaBounds) MaxCount(key string) uint64 {
	if sl := (crdt.Slot{Key: key}); escrow.IsSlot(sl) || escrow.IsNews(sl) {
		// A bounded limit's counters (store/bounded.go): requested hits and
		// gives have no bound in the limit, news carries an incarnation, and
		// the ledger refuses a count over the limit its item names.
		return math.MaxUint64
	}
	var buf [16]rules.Entry
	l, _, ok := b.lookup(key, buf[:0])
	switch {
	case !ok:
		return 0
	case l == tenantLimit:
		return math.MaxUint64 // see tenantLimit: only the topology and sender checks apply
	case l != nil:
		return BoundFactor * uint64(max(l.Spec.Limit, 0))
	}
	return BoundFactor * uint64(b.limits(b.e.Rules()).most)
}

// MaxBit returns how long after now another PoP's mitigation bit on key can
// honestly hold: the rule's mitigation duration when it has one, and
// otherwise until the sliding estimate falls back under the limit, at most
// two windows (the previous window's weight is gone by then); plus bitSlack.
// A key no PoP replicates gets 0.
func (b ReplicaBounds) MaxBit(key string) time.Duration {
	var buf [16]rules.Entry
	l, k, ok := b.lookup(key, buf[:0])
	if !ok {
		return 0
	}
	most := 2 * k.Window()
	switch {
	case l == tenantLimit: // the longest ban of the domain's limits and tiers
		d := b.e.Rules().Domain(k.Domain)
		for _, r := range b.e.Rules().Limits() {
			most = max(most, r.Mitigation)
		}
		for _, name := range d.Tenants.TierNames() {
			for _, r := range d.Tenants.Tier(name) {
				most = max(most, r.Mitigation)
			}
		}
	case l != nil:
		most = max(most, l.Mitigation)
	}
	return most + bitSlack
}
