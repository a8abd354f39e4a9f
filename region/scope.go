package region

import (
	"fmt"
	"math"

	"github.com/edgelimit/edgelimit/crdt"
)

// Scope values as they travel in crdt.Bit.Scope and name a limit's reach:
// they are pop/limit's Scope values (limit.ScopePOP, ScopeRegion,
// ScopeGlobal), declared here because region does not import pop.
const (
	ScopePOP    uint8 = 0
	ScopeRegion uint8 = 1
	ScopeGlobal uint8 = 2
)

// CountsFor returns which other replicas' counts a limit of scope adds to a
// PoP's own count: none for pop scope, the PoP's region peers for region
// scope, every replica for global scope.
func CountsFor(scope uint8, regionPeers []string) func(replica string) bool {
	switch scope {
	case ScopeRegion:
		return crdt.OneOf(regionPeers...)
	case ScopeGlobal:
		return func(string) bool { return true }
	}
	return func(string) bool { return false }
}

// BitDrop says why a PoP does not take a mitigation bit it received.
type BitDrop int

const (
	// BitDropScope: the bit's scope is neither region nor global; the PoP
	// scope is never replicated and others are unknown.
	BitDropScope BitDrop = iota
	// BitDropRegion: a region-scope bit from a PoP of another region; it
	// limits that region only.
	BitDropRegion
	// BitDropExpired: the bit's Until had already passed on arrival (by the
	// receiver's clock).
	BitDropExpired
	// BitDropOwn: the bit's origin is the receiving PoP (relayed back by
	// another); its own table already holds it.
	BitDropOwn

	// NumBitDrops is the number of drop reasons, for arrays indexed by
	// BitDrop.
	NumBitDrops = iota
)

// String returns the reason's metric label.
func (d BitDrop) String() string {
	switch d {
	case BitDropScope:
		return "scope"
	case BitDropRegion:
		return "other_region"
	case BitDropExpired:
		return "expired"
	case BitDropOwn:
		return "own"
	}
	return fmt.Sprintf("BitDrop(%d)", int(d))
}

// AcceptBit is the rule by which PoP pop of region self takes a bit that a
// PoP of region from sent, at now (unix ns): global bits from any region,
// region bits from its own region only; never a bit it issued itself, nor
// one already over. ok is false and why says the reason when it does not.
func AcceptBit(self, pop, from string, b crdt.Bit, now int64) (why BitDrop, ok bool) {
	switch {
	case b.Scope != ScopeGlobal && b.Scope != ScopeRegion:
		return BitDropScope, false
	case b.Scope == ScopeRegion && from != self:
		return BitDropRegion, false
	case b.Origin == pop:
		return BitDropOwn, false
	case b.Until <= now:
		return BitDropExpired, false
	}
	return 0, true
}

// Reachability tells which other regions a PoP can hear, from when a
// presence beacon of one of their PoPs last arrived. A region not heard since
// the Reachability started counts as unreachable only once the window has
// passed since then. The zero value is not usable; use NewReachability. It
// is not safe for concurrent use.
type Reachability struct {
	others []string         // the other regions, sorted
	heard  map[string]int64 // region -> unix ns a beacon last arrived
	since  int64
}

// NewReachability returns the reachability, as seen from region self at now
// (unix ns), of the other regions of t.
func NewReachability(t Topology, self string, now int64) *Reachability {
	r := &Reachability{heard: make(map[string]int64), since: now}
	for _, name := range t.Names() {
		if name != self {
			r.others = append(r.others, name)
		}
	}
	return r
}

// Shift moves every instant held by d: the clock they were read on moved by
// d (a clock correction), and they must stay the same instants on it.
func (r *Reachability) Shift(d int64) {
	r.since += d
	for k, t := range r.heard {
		r.heard[k] = t + d
	}
}

// Regions returns how many regions the topology has, self included.
func (r *Reachability) Regions() int { return len(r.others) + 1 }

// Heard records that a beacon from a PoP of region arrived at now.
func (r *Reachability) Heard(region string, now int64) {
	if now > r.heard[region] {
		r.heard[region] = now
	}
}

func (r *Reachability) last(region string) int64 {
	if at, ok := r.heard[region]; ok {
		return at
	}
	return r.since
}

// Unreachable returns, sorted, the other regions from which no beacon
// arrived within the last `within` nanoseconds before now.
func (r *Reachability) Unreachable(now, within int64) []string {
	var out []string
	for _, region := range r.others {
		if now-r.last(region) > within {
			out = append(out, region)
		}
	}
	return out
}

// NextChange returns the earliest instant after now at which a region
// reachable at now turns unreachable unless heard again, or math.MaxInt64
// when none can.
func (r *Reachability) NextChange(now, within int64) int64 {
	next := int64(math.MaxInt64)
	for _, region := range r.others {
		if at := r.last(region) + within + 1; at > now {
			next = min(next, at)
		}
	}
	return next
}

// ShareOf returns region.Share for the unreachable regions of a topology of
// r's regions.
func (r *Reachability) ShareOf(unreachable []string, perRegion float64) float64 {
	return Share(r.Regions()-len(unreachable), r.Regions(), perRegion)
}
