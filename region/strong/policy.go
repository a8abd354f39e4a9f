package strong

import "github.com/edgelimit/edgelimit/region"

// Fallback is what a PoP does with a check whose home did not answer.
type Fallback uint8

const (
	// Deny denies the check: the limit is fail_closed.
	Deny Fallback = iota
	// Local decides the check on the PoP's local knowledge — its own
	// counts and those replicated to it — at the partition share its
	// replication core enforces while its region is cut off, as an
	// eventual limit of the same scope is decided.
	Local
)

var fallbackNames = [...]string{"deny", "local"}

func (f Fallback) String() string {
	if int(f) < len(fallbackNames) {
		return fallbackNames[f]
	}
	return "Fallback(?)"
}

// Unreachable is the limit's policy for a check whose home did not answer
// within the timeout, or could not be asked: a fail_closed limit denies,
// any other is decided locally.
func Unreachable(failClosed bool) Fallback {
	if failClosed {
		return Deny
	}
	return Local
}

// LocalShare is the part of a global limit a PoP enforces on local
// knowledge while the home of a key does not answer and its replication
// core has not yet found any region cut off (engine share 1): the share
// region.Share gives the regions it can still reach when the home's region
// alone is lost, of regions in all, with the operator's per-region share
// (0: reachable over total). Once the core sees the cut, its own share,
// which the engine applies to every global limit, takes over.
func LocalShare(regions int, perRegion float64) float64 {
	return region.Share(regions-1, regions, perRegion)
}
